//! Quantized layers with float32 activations and float16 / bfloat16 scales multiply by
//! float32 casts of the scales and biases made once (`Param::cast`), where MLX's
//! `quantized_matmul` / `gather_qmm` would cast them on every call: the same arrays as
//! MLX's own products of the half-precision operands.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;
use common::{bits, randn};
use mlx_array::quant::{gather_qmm, quantize, quantized_matmul, QuantMode};
use mlx_array::{transforms, Array, Dtype};
use mlx_nn::{
    LinearLayer, Param, QuantSpec, QuantizedEmbedding, QuantizedLinear, QuantizedSwitchLinear,
};

/// A quantized layer `[n, k]` whose scales and biases are `dtype`.
fn layer(n: i32, k: i32, dtype: Dtype, group_size: i32, bits: i32, seed: u64) -> QuantizedLinear {
    let q = quantize(
        &randn(&[n, k], seed, dtype),
        Some(group_size),
        Some(bits),
        QuantMode::Affine,
    )
    .unwrap();
    assert_eq!(q.scales.dtype(), dtype);
    QuantizedLinear {
        weight: Param::frozen(q.weight),
        scales: Param::frozen(q.scales),
        biases: q.biases.map(Param::frozen),
        bias: None,
        spec: QuantSpec::new(Some(group_size), Some(bits), QuantMode::Affine),
    }
}

/// MLX's own product of float32 `x` with the layer's half-precision operands (our CPU
/// primitives off).
fn mlx_product(x: &Array, q: &QuantizedLinear) -> Array {
    mlx_array::fast::set_cpu_gemv(false);
    let y = quantized_matmul(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref().map(|b| b.value()),
        true,
        Some(q.spec.group_size),
        Some(q.spec.bits),
        q.spec.mode,
    )
    .unwrap();
    transforms::eval(&[&y]).unwrap();
    mlx_array::fast::set_cpu_gemv(true);
    y
}

#[test]
fn cast_is_made_once_for_an_evaluated_value_and_dropped_with_it() {
    let mut p = Param::frozen(randn(&[4, 8], 1, Dtype::Float16));
    transforms::eval(&[p.value()]).unwrap();
    let first = p.cast(Dtype::Float32).unwrap();
    assert_eq!(first.dtype(), Dtype::Float32);
    assert!(!first.is_available(), "a lazy cast the first time");
    transforms::eval(&[&first]).unwrap();
    // The second call hands back the evaluated cast: no new node.
    assert!(p.cast(Dtype::Float32).unwrap().is_available());
    assert_eq!(
        bits(&p.cast(Dtype::Float32).unwrap()),
        bits(&p.value().astype(Dtype::Float32).unwrap())
    );
    // Its own dtype: the value itself.
    assert_eq!(p.cast(Dtype::Float16).unwrap().dtype(), Dtype::Float16);

    // A new value drops the cast; an unevaluated value is cast afresh every call.
    p.set(randn(&[4, 8], 2, Dtype::Float16));
    let lazy = p.cast(Dtype::Float32).unwrap();
    transforms::eval(&[&lazy]).unwrap();
    assert!(!p.cast(Dtype::Float32).unwrap().is_available());
    assert_eq!(
        bits(&p.cast(Dtype::Float32).unwrap()),
        bits(&p.value().astype(Dtype::Float32).unwrap())
    );
}

#[test]
fn float32_products_with_half_scales_equal_mlx_s() {
    for (dtype, group_size, nbits) in [
        (Dtype::Float16, 32, 4),
        (Dtype::Bfloat16, 64, 4),
        (Dtype::Float16, 64, 8),
    ] {
        let (n, k) = (40, 256);
        let q = layer(n, k, dtype, group_size, nbits, 3);
        let q2 = layer(n, k, dtype, group_size, nbits, 4);
        transforms::eval(&[q.weight.value(), q.scales.value(), q2.scales.value()]).unwrap();
        for rows in [1, 5] {
            let x = randn(&[rows, k], 5, Dtype::Float32);
            let want = mlx_product(&x, &q);
            let want2 = mlx_product(&x, &q2);
            assert_eq!(want.dtype(), Dtype::Float32);
            // Twice: the first call makes the casts, the second reuses them.
            for _ in 0..2 {
                assert_eq!(
                    bits(&q.forward(&x).unwrap()),
                    bits(&want),
                    "{dtype:?} {rows}"
                );
            }
            let (a, b) = (
                LinearLayer::Quantized(q.clone()),
                LinearLayer::Quantized(q2.clone()),
            );
            let r = randn(&[rows, n], 6, Dtype::Float32);
            assert_eq!(
                bits(&a.forward_add(&x, &r).unwrap()),
                bits(&r.add(&want).unwrap())
            );
            let ys = LinearLayer::forward_many(&[&a, &b], &x).unwrap();
            assert_eq!(bits(&ys[0]), bits(&want));
            assert_eq!(bits(&ys[1]), bits(&want2));
            let sw = LinearLayer::forward_swiglu(&a, &b, &x).unwrap();
            assert_eq!(
                bits(&sw),
                bits(&mlx_nn::activations::swiglu(&want, &want2).unwrap())
            );
        }
    }
}

#[test]
fn tied_head_and_expert_products_with_half_scales_equal_mlx_s() {
    let (n, k) = (48, 128);
    let q = layer(n, k, Dtype::Float16, 32, 8, 7);
    let emb = QuantizedEmbedding {
        weight: q.weight.clone(),
        scales: q.scales.clone(),
        biases: q.biases.clone(),
        spec: q.spec,
    };
    let x = randn(&[2, k], 8, Dtype::Float32);
    let want = mlx_product(&x, &q);
    for _ in 0..2 {
        assert_eq!(bits(&emb.as_linear(&x).unwrap()), bits(&want));
    }

    // Four experts of [n, k]; each token's row through expert 2 and expert 0.
    let experts = quantize(
        &randn(&[4, n, k], 9, Dtype::Bfloat16),
        Some(64),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    let switch = QuantizedSwitchLinear {
        weight: Param::frozen(experts.weight),
        scales: Param::frozen(experts.scales),
        biases: experts.biases.map(Param::frozen),
        bias: None,
        spec: QuantSpec::new(Some(64), Some(4), QuantMode::Affine),
    };
    let xe = randn(&[2, 1, 1, k], 10, Dtype::Float32);
    let idx = Array::from_slice(&[2u32, 0, 2, 0], &[2, 1, 2]).unwrap();
    mlx_array::fast::set_cpu_gemv(false);
    let want = gather_qmm(
        &xe,
        &switch.weight,
        &switch.scales,
        switch.biases.as_ref().map(|b| b.value()),
        None,
        Some(&idx),
        true,
        Some(64),
        Some(4),
        QuantMode::Affine,
        false,
    )
    .unwrap();
    transforms::eval(&[&want]).unwrap();
    mlx_array::fast::set_cpu_gemv(true);
    assert_eq!(want.dtype(), Dtype::Float32);
    for _ in 0..2 {
        assert_eq!(
            bits(&switch.forward(&xe, &idx, false).unwrap()),
            bits(&want)
        );
    }
}

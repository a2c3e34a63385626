//! The derivative of the dequantized dense product (`MLX_DEQUANT_GEMM`, shim/mlx_shim.cpp)
//! inside a gradient, as in a QLoRA training step: the backward product dequantizes the
//! weight again (so no layer's dequantized weight is held from the forward pass to the
//! backward one), and its values are exactly those of the dense formula
//! `cotangent @ dequantize(w)`. The path is forced on the CPU here for every weight size;
//! the process's environment is set before MLX reads it (nextest runs each test in its own
//! process, and both tests here want the same setting under `cargo test`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::ops::{ones_like, zeros_like};
use mlx_array::quant::{dequantize, quantize, quantized_matmul, QuantMode, Quantized};
use mlx_array::transforms::{value_and_grad, Closure};
use mlx_array::{random, Array, Dtype};

fn force_the_path() {
    // SAFETY: set before any thread of this test process reads the environment (MLX reads
    // both variables once, at the first quantized product).
    unsafe {
        std::env::set_var("MLX_DEQUANT_GEMM", "force");
        std::env::set_var("MLX_DEQUANT_GEMM_MIN_ELEMENTS", "0");
    }
}

fn normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&key)).unwrap()
}

fn quantized(n: i32, k: i32, seed: u64) -> Quantized {
    quantize(&normal(&[n, k], seed), Some(64), Some(4), QuantMode::Affine).unwrap()
}

/// `sum(qmm(x, w) * c)`: its gradient with respect to x is `c @ dequantize(w)`.
fn loss(x: &Array, q: &Quantized, c: &Array) -> mlx_array::Result<Array> {
    let y = quantized_matmul(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        true,
        Some(64),
        Some(4),
        QuantMode::Affine,
    )?;
    y.multiply(c)?.sum(None, false)
}

/// The weight as bfloat16, as the product dequantizes it for bfloat16 activations.
fn dense(q: &Quantized) -> Array {
    let bf16 = Some(Dtype::Bfloat16);
    dequantize(
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        Some(64),
        Some(4),
        QuantMode::Affine,
        bf16,
    )
    .unwrap()
}

fn assert_same(a: &Array, b: &Array, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    assert_eq!(a.dtype(), b.dtype(), "{what}: dtypes");
    let f32s = |v: &Array| v.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    let (a, b) = (f32s(a), f32s(b));
    let differ = a
        .iter()
        .zip(&b)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "{what}: {differ} of {} values differ: {:?} vs {:?}",
        a.len(),
        &a[..a.len().min(4)],
        &b[..b.len().min(4)]
    );
}

#[test]
fn the_gradient_through_the_dequantized_product_is_the_dense_formula() {
    force_the_path();
    let (rows, k, n) = (16, 128, 96);
    let x = normal(&[2, rows / 2, k], 1)
        .astype(Dtype::Bfloat16)
        .unwrap();
    let c = normal(&[2, rows / 2, n], 2)
        .astype(Dtype::Bfloat16)
        .unwrap();
    let q = quantized(n, k, 3);
    let (qc, cc) = (q.clone(), c.clone());
    let (v, g) = value_and_grad(
        move |a: &[Array]| Ok(vec![loss(&a[0], &qc, &cc)?]),
        &[&x],
        &[0],
    )
    .unwrap();

    let wd = dense(&q);
    let want_v = x
        .matmul(&wd.transpose(None).unwrap())
        .unwrap()
        .multiply(&c)
        .unwrap();
    let want_v = want_v.sum(None, false).unwrap();
    assert_same(&v[0], &want_v, "loss");
    assert_same(&g[0], &c.matmul(&wd).unwrap(), "gradient with respect to x");

    // The same inside a compiled function, as the LoRA step runs it.
    let (qc, cc) = (q.clone(), c.clone());
    let step = Closure::new(move |a: &[Array]| {
        let (qc, cc) = (qc.clone(), cc.clone());
        let (v, g) = value_and_grad(
            move |b: &[Array]| Ok(vec![loss(&b[0], &qc, &cc)?]),
            &[&a[0]],
            &[0],
        )?;
        Ok(vec![v[0].clone(), g[0].clone()])
    })
    .unwrap()
    .compile(false)
    .unwrap();
    let out = step.call(&[&x]).unwrap();
    assert_same(&out[0], &want_v, "compiled loss");
    assert_same(&out[1], &c.matmul(&wd).unwrap(), "compiled gradient");
}

#[test]
fn trained_scales_and_biases_get_their_gradients() {
    // Distilling a quantized model (mlx-lm's DWQ) trains the scales and biases: there the
    // product is MLX's, whose derivative gives them. With W = s * q + b per group,
    // dW = c^T x, ds = sum over each group of dW * q, db = sum over each group of dW.
    force_the_path();
    let (n, k, gs) = (32, 128, 64);
    let x = normal(&[4, k], 4);
    let c = normal(&[4, n], 5);
    let q = quantized(n, k, 6);
    let (w, s, b) = (
        q.weight.clone(),
        q.scales.clone(),
        q.biases.clone().unwrap(),
    );
    let cc = c.clone();
    let (_, g) = value_and_grad(
        move |a: &[Array]| {
            let q = Quantized {
                weight: a[1].clone(),
                scales: a[2].clone(),
                biases: Some(a[3].clone()),
            };
            Ok(vec![loss(&a[0], &q, &cc)?])
        },
        &[&x, &w, &s, &b],
        &[2, 3],
    )
    .unwrap();
    let dw = c.transpose(None).unwrap().matmul(&x).unwrap();
    let (ones, zeros) = (ones_like(&s).unwrap(), zeros_like(&s).unwrap());
    let levels = dequantize(
        &w,
        &ones,
        Some(&zeros),
        Some(64),
        Some(4),
        QuantMode::Affine,
        None,
    )
    .unwrap();
    let by_group = |v: &Array| {
        v.reshape(&[n, k / gs, gs])
            .unwrap()
            .sum(Some(&[-1]), false)
            .unwrap()
    };
    let want = [by_group(&dw.multiply(&levels).unwrap()), by_group(&dw)];
    for ((got, want), what) in g.iter().zip(&want).zip(["scales", "biases"]) {
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        assert_eq!(got.len(), want.len(), "{what}: sizes");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - e).abs() <= 1e-4 * scale,
                "{what}[{i}]: {a}, the formula gives {e}"
            );
        }
    }
}

//! `FusedLinears`: one matmul for several projections gives each projection's output bit
//! for bit, the layers keep working on views of the fused buffer, and replacing a
//! parameter makes the fusion stale.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::quant::QuantMode;
use mlx_array::{ops, Dtype};
use mlx_nn::{FusedLinears, Linear, LinearLayer, QuantSpec, Quantizable};

mod common;
use common::{bits, randn};

fn layers(dtype: Dtype, bias: bool, quantized: bool) -> Vec<LinearLayer> {
    [(96, 1), (32, 2), (32, 3)]
        .iter()
        .map(|&(out, seed)| {
            let w = randn(&[out, 64], seed, dtype);
            let b = bias.then(|| randn(&[out], seed + 10, dtype));
            let mut l = LinearLayer::Dense(Linear::from_weights(w, b));
            if quantized {
                l.quantize(QuantSpec {
                    group_size: 32,
                    bits: 4,
                    mode: QuantMode::Affine,
                })
                .unwrap();
            }
            l
        })
        .collect()
}

#[test]
fn fused_outputs_are_the_separate_outputs_bit_for_bit() {
    for (dtype, bias, quantized) in [
        (Dtype::Float32, false, false),
        (Dtype::Float32, true, false),
        (Dtype::Bfloat16, true, false),
        (Dtype::Bfloat16, false, true),
        (Dtype::Float32, true, true),
    ] {
        let what = format!("{dtype:?} bias={bias} quantized={quantized}");
        let mut ls = layers(dtype, bias, quantized);
        // One position per row (decoding), batch of 1 and of 3.
        let xs = [randn(&[1, 1, 64], 7, dtype), randn(&[3, 1, 64], 8, dtype)];
        let before: Vec<Vec<Vec<u32>>> = xs
            .iter()
            .map(|x| ls.iter().map(|l| bits(&l.forward(x).unwrap())).collect())
            .collect();
        let fused = {
            let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
            FusedLinears::fuse(&mut refs).unwrap().expect("fusable")
        };
        let refs: Vec<&LinearLayer> = ls.iter().collect();
        assert!(fused.matches(&refs), "{what}");
        // The views hold data (no lazy node tied to this thread's stream).
        for l in &ls {
            match l {
                LinearLayer::Dense(d) => assert!(d.weight.is_available(), "{what}"),
                LinearLayer::Quantized(q) => {
                    assert!(q.weight.is_available() && q.scales.is_available(), "{what}")
                }
                LinearLayer::Lora(_) | LinearLayer::Resident(_) => {
                    panic!("{what}: no adapters here")
                }
            }
        }
        for (x, want) in xs.iter().zip(&before) {
            let got: Vec<Vec<u32>> = fused.forward(x).unwrap().iter().map(bits).collect();
            assert_eq!(&got, want, "{what}: fused");
            // The layers themselves now read views of the fused buffer.
            let sep: Vec<Vec<u32>> = ls.iter().map(|l| bits(&l.forward(x).unwrap())).collect();
            assert_eq!(&sep, want, "{what}: views");
        }
        // Several positions (prefill) through the views.
        let x = randn(&[2, 5, 64], 9, dtype);
        for l in &ls {
            assert_eq!(l.forward(&x).unwrap().shape(), [2, 5, l_out(l)]);
        }
    }
}

fn l_out(l: &LinearLayer) -> i32 {
    l.dense_weight_shape()[0]
}

#[test]
fn replacing_a_parameter_makes_the_fusion_stale() {
    let mut ls = layers(Dtype::Float32, true, false);
    let fused = {
        let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
        FusedLinears::fuse(&mut refs).unwrap().unwrap()
    };
    if let LinearLayer::Dense(d) = &mut ls[1] {
        d.weight.set(randn(&[32, 64], 99, Dtype::Float32));
    }
    let refs: Vec<&LinearLayer> = ls.iter().collect();
    assert!(!fused.matches(&refs));
    // Quantizing replaces the layer (and its parameters) too.
    let mut ls = layers(Dtype::Float32, false, false);
    let fused = {
        let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
        FusedLinears::fuse(&mut refs).unwrap().unwrap()
    };
    ls[0]
        .quantize(QuantSpec {
            group_size: 32,
            bits: 8,
            mode: QuantMode::Affine,
        })
        .unwrap();
    let refs: Vec<&LinearLayer> = ls.iter().collect();
    assert!(!fused.matches(&refs));
    // So does an adapter put on one of them after the fusion (the layer then runs on
    // its own, adapter included), and layers with adapters are not fused.
    for quantized in [false, true] {
        let mut ls = layers(Dtype::Float32, false, quantized);
        let fused = {
            let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
            FusedLinears::fuse(&mut refs).unwrap().unwrap()
        };
        ls[1].add_adapter(
            randn(&[64, 4], 5, Dtype::Float32),
            randn(&[4, 32], 6, Dtype::Float32),
            None,
            2.0,
        );
        let refs: Vec<&LinearLayer> = ls.iter().collect();
        assert!(!fused.matches(&refs), "quantized: {quantized}");
        let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
        assert!(
            FusedLinears::fuse(&mut refs).unwrap().is_none(),
            "quantized: {quantized}"
        );
    }
}

#[test]
fn an_adapter_adds_its_scaled_low_rank_product() {
    // base(x) + (scale * ((x @ A) @ B)).astype(x.dtype), mlx-lm's LoRALinear.
    let mut ls = layers(Dtype::Bfloat16, true, false);
    let x = randn(&[3, 64], 7, Dtype::Bfloat16);
    let (a, b) = (
        randn(&[64, 4], 8, Dtype::Float32),
        randn(&[4, 32], 9, Dtype::Float32),
    );
    let base = ls[1].forward(&x).unwrap();
    ls[1].add_adapter(a.clone(), b.clone(), None, 2.5);
    let want = base
        .add(
            &x.matmul(&a)
                .unwrap()
                .matmul(&b)
                .unwrap()
                .multiply(2.5f32)
                .unwrap()
                .astype(Dtype::Bfloat16)
                .unwrap(),
        )
        .unwrap();
    let got = ls[1].forward(&x).unwrap();
    assert_eq!(got.dtype(), Dtype::Bfloat16);
    assert_eq!(bits(&got), bits(&want));
    assert_ne!(bits(&got), bits(&base));
    // A second adapter replaces the first.
    ls[1].add_adapter(a, ops::zeros(&[4, 32], Dtype::Float32).unwrap(), None, 2.5);
    assert_eq!(bits(&ls[1].forward(&x).unwrap()), bits(&base));
}

#[test]
fn unlike_layers_are_not_fused() {
    // Mixed dense and quantized.
    let mut ls = layers(Dtype::Float32, false, false);
    ls[2]
        .quantize(QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Affine,
        })
        .unwrap();
    let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
    assert!(FusedLinears::fuse(&mut refs).unwrap().is_none());
    // Different input sizes.
    let mut a = LinearLayer::Dense(Linear::from_weights(
        randn(&[8, 64], 1, Dtype::Float32),
        None,
    ));
    let mut b = LinearLayer::Dense(Linear::from_weights(
        randn(&[8, 32], 2, Dtype::Float32),
        None,
    ));
    assert!(FusedLinears::fuse(&mut [&mut a, &mut b]).unwrap().is_none());
    // Bias on one only.
    let mut c = LinearLayer::Dense(Linear::from_weights(
        randn(&[8, 64], 3, Dtype::Float32),
        Some(randn(&[8], 4, Dtype::Float32)),
    ));
    let mut d = LinearLayer::Dense(Linear::from_weights(
        randn(&[8, 64], 5, Dtype::Float32),
        None,
    ));
    assert!(FusedLinears::fuse(&mut [&mut c, &mut d]).unwrap().is_none());
}

/// `LinearLayer::forward_many` gives each layer's own `forward`, bit for bit: quantized
/// layers of one spec (with and without output biases) through one
/// `quantized_matmul_many`, a mix of dense and quantized layers one by one.
#[test]
fn forward_many_matches_each_layers_forward() {
    for (bias, quantized) in [(false, true), (true, true), (true, false)] {
        let ls = layers(Dtype::Bfloat16, bias, quantized);
        let refs: Vec<&LinearLayer> = ls.iter().collect();
        for x in [
            randn(&[1, 1, 64], 40, Dtype::Bfloat16),
            randn(&[2, 5, 64], 41, Dtype::Bfloat16),
        ] {
            let many = LinearLayer::forward_many(&refs, &x).unwrap();
            assert_eq!(many.len(), ls.len());
            for (y, l) in many.iter().zip(&ls) {
                let one = l.forward(&x).unwrap();
                assert_eq!(y.shape(), one.shape());
                assert_eq!(bits(y), bits(&one), "bias {bias}, quantized {quantized}");
            }
        }
    }
    // Dense and quantized together.
    let q = layers(Dtype::Bfloat16, false, true);
    let d = layers(Dtype::Bfloat16, false, false);
    let x = randn(&[1, 1, 64], 42, Dtype::Bfloat16);
    let many = LinearLayer::forward_many(&[&q[0], &d[1]], &x).unwrap();
    assert_eq!(bits(&many[0]), bits(&q[0].forward(&x).unwrap()));
    assert_eq!(bits(&many[1]), bits(&d[1].forward(&x).unwrap()));
}

/// `LinearLayer::forward_add` is `residual + forward(x)`, bit for bit, for quantized
/// layers with and without an output bias and for dense ones.
#[test]
fn forward_add_is_the_residual_plus_the_output() {
    for (bias, quantized) in [(false, true), (true, true), (false, false), (true, false)] {
        let ls = layers(Dtype::Bfloat16, bias, quantized);
        for x in [
            randn(&[1, 1, 64], 50, Dtype::Bfloat16),
            randn(&[2, 5, 64], 51, Dtype::Bfloat16),
        ] {
            let shape = [x.dim(0).unwrap(), x.dim(1).unwrap(), 32];
            let r = randn(&shape, 52, Dtype::Bfloat16);
            let y = ls[1].forward_add(&x, &r).unwrap();
            let expected = r.add(&ls[1].forward(&x).unwrap()).unwrap();
            assert_eq!(y.shape(), expected.shape());
            assert_eq!(
                bits(&y),
                bits(&expected),
                "bias {bias}, quantized {quantized}"
            );
        }
    }
}

/// The three arrays of a quantized layer as one weight of the many-weight products.
fn packed(l: &mlx_nn::QuantizedLinear) -> mlx_array::quant::QuantizedWeight<'_> {
    mlx_array::quant::QuantizedWeight {
        weight: l.weight.value(),
        scales: l.scales.value(),
        biases: l.biases.as_ref().map(|b| b.value()),
    }
}

/// `LinearLayer::forward_swiglu` is mlx-lm's `swiglu(gate(x), up(x))`, bit for bit, for
/// quantized layers (one spec, with and without output biases), dense ones and a mix;
/// and `quantized_matmul_swiglu` gives back the two products, each as its own layer gives
/// it, where its one launch does not cover the call (here every call: that launch is a
/// CUDA kernel).
#[test]
fn forward_swiglu_is_the_swiglu_of_the_two_outputs() {
    use mlx_array::quant::{quantized_matmul_swiglu, GateUp};
    use mlx_nn::activations::swiglu;
    for (bias, quantized) in [(false, true), (true, true), (false, false)] {
        let ls = layers(Dtype::Bfloat16, bias, quantized);
        for x in [
            randn(&[1, 1, 64], 60, Dtype::Bfloat16),
            randn(&[2, 5, 64], 61, Dtype::Bfloat16),
        ] {
            let y = LinearLayer::forward_swiglu(&ls[1], &ls[2], &x).unwrap();
            let expected =
                swiglu(&ls[1].forward(&x).unwrap(), &ls[2].forward(&x).unwrap()).unwrap();
            assert_eq!(y.shape(), expected.shape());
            assert_eq!(
                bits(&y),
                bits(&expected),
                "bias {bias}, quantized {quantized}"
            );
        }
    }
    let q = layers(Dtype::Bfloat16, false, true);
    let d = layers(Dtype::Bfloat16, false, false);
    let x = randn(&[1, 1, 64], 62, Dtype::Bfloat16);
    let y = LinearLayer::forward_swiglu(&q[1], &d[2], &x).unwrap();
    let expected = swiglu(&q[1].forward(&x).unwrap(), &d[2].forward(&x).unwrap()).unwrap();
    assert_eq!(bits(&y), bits(&expected));
    let (LinearLayer::Quantized(g), LinearLayer::Quantized(u)) = (&q[1], &q[2]) else {
        panic!("quantized layers expected")
    };
    let spec = g.spec;
    let out = quantized_matmul_swiglu(
        &x,
        packed(g),
        packed(u),
        Some(spec.group_size),
        Some(spec.bits),
        spec.mode,
    )
    .unwrap();
    let GateUp::Products(pg, pu) = out else {
        panic!("the swiglu launch is a CUDA kernel: two products expected here")
    };
    assert_eq!(bits(&pg), bits(&q[1].forward(&x).unwrap()));
    assert_eq!(bits(&pu), bits(&q[2].forward(&x).unwrap()));
}

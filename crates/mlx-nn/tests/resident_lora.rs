//! `ResidentLoraLinear`: each batch row gets, bit for bit, what mlx-lm's `LoRALinear`
//! (our `LoraLinear`) gives it with that row's adapter, or the base layer's output for
//! a row without one, whatever adapters its neighbours use; dense and quantized bases.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::quant::QuantMode;
use mlx_array::{Array, Dtype};
use mlx_nn::lora::with_row_adapters;
use mlx_nn::{Linear, LinearLayer, QuantSpec, Quantizable};

mod common;
use common::{bits, randn};

fn row(a: &Array, i: i32) -> Array {
    let s = a.shape();
    a.slice(&[i, 0, 0], &[i + 1, s[1], s[2]], None).unwrap()
}

fn base(dtype: Dtype, quantized: bool) -> LinearLayer {
    let mut l = LinearLayer::Dense(Linear::from_weights(
        randn(&[48, 64], 1, dtype),
        Some(randn(&[48], 2, dtype)),
    ));
    if quantized {
        l.quantize(QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Affine,
        })
        .unwrap();
    }
    l
}

/// Adapter `k`'s `(lora_a, lora_b, scale)`, rank 4 (float32, as mlx-lm trains them).
fn adapter(k: u64) -> (Array, Array, f64) {
    (
        randn(&[64, 4], 10 + k, Dtype::Float32),
        randn(&[4, 48], 20 + k, Dtype::Float32)
            .multiply(0.05)
            .unwrap(),
        7.5 + k as f64,
    )
}

fn check(dtype: Dtype, quantized: bool) {
    let what = format!("{dtype:?} quantized={quantized}");
    let x = randn(&[4, 3, 64], 5, dtype);
    // The references: the layer with one adapter applied at load (mlx-lm's LoRALinear).
    let plain = base(dtype, quantized);
    let with = |k: u64| {
        let mut l = base(dtype, quantized);
        let (a, b, s) = adapter(k);
        l.add_adapter(a, b, None, s);
        l.forward(&x).unwrap()
    };
    let (want1, want2, want0) = (with(1), with(2), plain.forward(&x).unwrap());

    let mut l = base(dtype, quantized);
    for k in [1u32, 2] {
        let (a, b, s) = adapter(k as u64);
        l.add_resident_adapter(k, a, b, s).unwrap();
    }
    assert_eq!(l.resident_adapter_ids(), vec![1, 2], "{what}");
    // No selection: the base layer.
    assert_eq!(bits(&l.forward(&x).unwrap()), bits(&want0), "{what}");
    // One adapter for every row: exactly the adapted layer.
    let y = with_row_adapters(&[2, 2, 2, 2], || l.forward(&x)).unwrap();
    assert_eq!(bits(&y), bits(&want2), "{what}: all rows adapter 2");
    // Mixed rows: each row its own.
    let y = with_row_adapters(&[1, 0, 2, 1], || l.forward(&x)).unwrap();
    for (i, want) in [(0, &want1), (1, &want0), (2, &want2), (3, &want1)] {
        assert_eq!(
            bits(&row(&y, i)),
            bits(&row(want, i)),
            "{what}: mixed batch row {i}"
        );
    }
    // An unknown id (an adapter that leaves this layer alone) is the base layer.
    let y = with_row_adapters(&[9, 1, 9, 9], || l.forward(&x)).unwrap();
    assert_eq!(bits(&row(&y, 0)), bits(&row(&want0, 0)), "{what}");
    assert_eq!(bits(&row(&y, 1)), bits(&row(&want1, 1)), "{what}");
    // A selection that does not match the batch is an error, not a wrong answer.
    let err = with_row_adapters(&[1, 2], || l.forward(&x)).unwrap_err();
    assert!(err.to_string().contains("2 rows selected"), "{err}");
    // Removing the adapters gives the plain layer back.
    assert!(l.remove_resident_adapter(1).unwrap());
    assert!(l.remove_resident_adapter(2).unwrap());
    assert!(!l.remove_resident_adapter(2).unwrap());
    assert!(!matches!(l, LinearLayer::Resident(_)), "{what}");
    assert_eq!(bits(&l.forward(&x).unwrap()), bits(&want0), "{what}");
}

#[test]
fn rows_get_their_own_adapter_on_a_dense_base() {
    check(Dtype::Float32, false);
    check(Dtype::Bfloat16, false);
}

#[test]
fn rows_get_their_own_adapter_on_a_quantized_base() {
    check(Dtype::Float32, true);
}

#[test]
fn an_adapter_applied_at_load_is_not_mixed_with_resident_ones() {
    let mut l = base(Dtype::Float32, false);
    let (a, b, s) = adapter(1);
    l.add_adapter(a.clone(), b.clone(), None, s);
    let err = l.add_resident_adapter(1, a, b, s).unwrap_err();
    assert!(err.to_string().contains("adapter applied at load"), "{err}");
}

/// A fused projection (decoding's one matmul for q/k/v) stops being used while a layer
/// holds resident adapters, and is used again once they are gone.
#[test]
fn resident_adapters_make_a_fusion_stale_until_removed() {
    let mut ls = [base(Dtype::Float32, false), base(Dtype::Float32, false)];
    let fused = {
        let mut refs: Vec<&mut LinearLayer> = ls.iter_mut().collect();
        mlx_nn::FusedLinears::fuse(&mut refs).unwrap().unwrap()
    };
    assert!(fused.matches(&ls.iter().collect::<Vec<_>>()));
    let (a, b, s) = adapter(1);
    ls[1].add_resident_adapter(1, a, b, s).unwrap();
    assert!(!fused.matches(&ls.iter().collect::<Vec<_>>()));
    assert!(ls[1].remove_resident_adapter(1).unwrap());
    assert!(fused.matches(&ls.iter().collect::<Vec<_>>()));
}

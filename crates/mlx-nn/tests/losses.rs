//! `losses::cross_entropy` against `mlx.nn.losses.cross_entropy`'s documented values.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{Array, Dtype};
use mlx_nn::losses::cross_entropy;

#[test]
fn cross_entropy_of_class_targets() {
    // mlx's docstring: logits [[2, -1], [-1, 2]], targets [0, 1] -> 0.0485873 each.
    let logits = Array::from_slice(&[2.0f32, -1.0, -1.0, 2.0], &[2, 2]).unwrap();
    let targets = Array::from_slice(&[0i32, 1], &[2]).unwrap();
    let l: Vec<f32> = cross_entropy(&logits, &targets).unwrap().to_vec().unwrap();
    let want = (1.0f64 + (-3.0f64).exp()).ln() as f32;
    for x in l {
        assert!(
            (x - 0.048_587_3).abs() < 1e-6 && (x - want).abs() < 1e-6,
            "{x}"
        );
    }
    // Batched [B, L, V] logits with [B, L] targets, and the logits' dtype kept.
    let logits = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 3.0, 2.0, 1.0, 0.0], &[1, 2, 4])
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap();
    let targets = Array::from_slice(&[3i32, 0], &[1, 2]).unwrap();
    let out = cross_entropy(&logits, &targets).unwrap();
    assert_eq!(out.shape(), vec![1, 2]);
    assert_eq!(out.dtype(), Dtype::Bfloat16);
}

#[test]
fn mismatched_targets_are_errors() {
    let logits = Array::from_slice(&[0.0f32; 6], &[2, 3]).unwrap();
    let e = cross_entropy(&logits, &Array::from_slice(&[0i32, 1, 2], &[3]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    let e = cross_entropy(&logits, &Array::from_slice(&[0.0f32, 1.0], &[2]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("integers"), "{e}");
}

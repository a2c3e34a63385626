#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The gated delta rule's lean step (inputs shaped for broadcasting once, kept-dim sums)
//! gives mlx-lm's step bit for bit: y and the state, for scalar and per-key gates, with
//! and without a padding mask, one token and several, grouped value heads, bfloat16 and
//! float32 inputs, from zeros and from a given state.
use mlx_array::{Array, Dtype};
use mlx_nn::gated_delta::{gated_delta_ops_as, normalize_qk};

mod common;
use common::{bits, randn};

#[test]
fn lean_step_equals_mlx_lm_step_bit_for_bit() {
    let (b, hk, dk, dv) = (2, 2, 16, 8);
    let mut cases = 0;
    for dtype in [Dtype::Bfloat16, Dtype::Float32] {
        for t in [1, 7] {
            for hv in [2, 4] {
                for vector_gate in [false, true] {
                    for masked in [false, true] {
                        for with_state in [false, true] {
                            let seed = cases as u64 * 10;
                            let q = randn(&[b, t, hk, dk], seed, dtype);
                            let k = randn(&[b, t, hk, dk], seed + 1, dtype);
                            let (q, k) =
                                normalize_qk(&q, &k, (dk as f64).powf(-0.5), 1e-6).unwrap();
                            let v = randn(&[b, t, hv, dv], seed + 2, dtype);
                            let g_shape: Vec<i32> = if vector_gate {
                                vec![b, t, hv, dk]
                            } else {
                                vec![b, t, hv]
                            };
                            // Decays in (0, 1) in float32, as compute_g gives them.
                            let g = randn(&g_shape, seed + 3, Dtype::Float32).sigmoid().unwrap();
                            let beta = randn(&[b, t, hv], seed + 4, dtype).sigmoid().unwrap();
                            let state = with_state
                                .then(|| randn(&[b, hv, dv, dk], seed + 5, Dtype::Float32));
                            // Row 0 keeps every position, row 1 drops the first (left padding).
                            let mask = masked.then(|| {
                                let m: Vec<bool> =
                                    (0..b * t).map(|i| i / t == 0 || i % t != 0).collect();
                                Array::from_slice(&m, &[b, t]).unwrap()
                            });
                            let run = |lean| {
                                gated_delta_ops_as(
                                    lean,
                                    &q,
                                    &k,
                                    &v,
                                    &g,
                                    &beta,
                                    state.as_ref(),
                                    mask.as_ref(),
                                )
                                .unwrap()
                            };
                            let (y0, s0) = run(false);
                            let (y1, s1) = run(true);
                            let what = format!(
                                "{dtype:?} t={t} hv={hv} vector_gate={vector_gate} \
                                 masked={masked} state={with_state}"
                            );
                            assert_eq!(y1.shape(), y0.shape(), "y shape, {what}");
                            assert_eq!(y1.dtype(), y0.dtype(), "y dtype, {what}");
                            assert_eq!(s1.shape(), s0.shape(), "state shape, {what}");
                            assert_eq!(s1.dtype(), s0.dtype(), "state dtype, {what}");
                            assert_eq!(bits(&y1), bits(&y0), "y, {what}");
                            assert_eq!(bits(&s1), bits(&s0), "state, {what}");
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 64);
}

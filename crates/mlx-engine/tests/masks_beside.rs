#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! A decode step's grammar accepts and masks on the grammar worker while the forward is
//! queued (`MLX_MASKS_BESIDE`, sessions 42 and 45) give every row the tokens it gets with
//! them after the forward on the step's own thread (the default), together and alone,
//! a dead end found by a mask included; so do the masks computed before the forward is
//! queued (`MLX_MASKS_FIRST`, one evaluation a step).
use common::{model, opts, serve, BuildPeriodic, PERIODIC_WORKER_ACCEPTS};
use mlx_engine::batch::{Engine, EngineMetrics, GenerationRequest};
use mlx_sample::LogitsParams;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[allow(dead_code)] // shared helpers this file does not use
mod common;

const TARGET: &str = "llama-small-f32";

const PROMPTS: [&[u32]; 5] = [
    &[3, 4, 5, 6, 7, 8, 9, 10, 11],
    &[11, 12],
    &[20, 21, 22, 23, 24],
    &[40, 41, 42, 43, 44, 45, 46],
    &[60, 61, 62],
];
const MAX: usize = 19;

/// Row 4's grammar finds a dead end in its mask after this many tokens.
const DEAD_END_AT: usize = 7;

/// Rows 0, 2 and 4 constrained (a host-mask grammar: the `i`-th token `i` modulo 3, so
/// each step's mask differs from the last; 2 also with a penalty; 4's mask finds a dead
/// end after `DEAD_END_AT` tokens, which must end the row one token later, as a
/// grammar's mask allowing only EOS does), 1 with penalties, 3 plain.
fn request(i: usize) -> GenerationRequest {
    let mut r = GenerationRequest::new(PROMPTS[i].to_vec(), MAX);
    if i.is_multiple_of(2) {
        r.processors.push(Arc::new(BuildPeriodic {
            modulus: 3,
            host_bits: true,
            dead_end_at: (i == 4).then_some(DEAD_END_AT as u32),
        }));
    }
    if i == 1 || i == 2 {
        r.logits = LogitsParams {
            repetition_penalty: Some(1.3),
            frequency_penalty: Some(0.4),
            ..LogitsParams::default()
        };
    }
    r
}

fn engine() -> Engine {
    Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine")
}

/// Every request served together, then each alone, on a fresh engine (which reads the
/// switches as the test set them): (together, alone).
fn served() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let n = PROMPTS.len();
    let e = engine();
    let together = serve(&e, (0..n).map(request).collect())
        .into_iter()
        .map(|g| g.tokens)
        .collect();
    let alone = (0..n)
        .map(|i| serve(&e, vec![request(i)]).remove(0).tokens)
        .collect();
    (together, alone)
}

#[test]
fn masks_beside_the_forward_give_the_tokens_of_masks_after_it() {
    let n = PROMPTS.len();
    // The masks after the forward, on the step's thread.
    std::env::remove_var("MLX_MASKS_BESIDE");
    std::env::remove_var("MLX_MASKS_FIRST");
    let (together, alone) = served();
    assert_eq!(mlx_engine::batch::masks_beside_steps(), 0);
    assert_eq!(mlx_engine::batch::masks_first_steps(), 0);
    assert_eq!(PERIODIC_WORKER_ACCEPTS.load(Ordering::Relaxed), 0);
    assert_eq!(together, alone, "served together against alone");
    // Row 4 ends on the token after its dead end (the one its mask then allows).
    assert_eq!(alone[4][DEAD_END_AT..], [0], "row 4 after its dead end");
    for i in (0..n).step_by(2) {
        let len = if i == 4 { DEAD_END_AT } else { MAX };
        assert_eq!(
            alone[i].len(),
            len + usize::from(i == 4),
            "row {i}'s length"
        );
        for (j, t) in alone[i][..len].iter().enumerate() {
            assert_eq!(
                t % 3,
                j as u32 % 3,
                "row {i}: token {j} breaks the constraint"
            );
        }
    }
    // Beside the forward at every step.
    std::env::set_var("MLX_MASKS_BESIDE", "always");
    let (beside, beside_alone) = served();
    assert!(
        mlx_engine::batch::masks_beside_steps() >= 2 * MAX as u64 - 4,
        "the masks were computed beside the forward in {} steps",
        mlx_engine::batch::masks_beside_steps()
    );
    assert!(
        PERIODIC_WORKER_ACCEPTS.load(Ordering::Relaxed) >= 2 * MAX as u64,
        "the grammars accepted {} tokens on the worker",
        PERIODIC_WORKER_ACCEPTS.load(Ordering::Relaxed)
    );
    assert_eq!(beside, alone, "beside, together");
    assert_eq!(beside_alone, alone, "beside, alone");
    assert_eq!(mlx_engine::batch::masks_first_steps(), 0);
    // Before the forward is queued, one evaluation a step, at every step.
    std::env::remove_var("MLX_MASKS_BESIDE");
    std::env::set_var("MLX_MASKS_FIRST", "always");
    let (first, first_alone) = served();
    assert!(
        mlx_engine::batch::masks_first_steps() >= 2 * MAX as u64 - 4,
        "the masks were computed before the forward in {} steps",
        mlx_engine::batch::masks_first_steps()
    );
    assert_eq!(first, alone, "first, together");
    assert_eq!(first_alone, alone, "first, alone");
}

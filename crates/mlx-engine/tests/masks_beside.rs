#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! A decode step's grammar masks computed on a second thread while the forward is
//! queued (`MLX_MASKS_BESIDE`, session 42) give every row the tokens it gets with the
//! masks computed after the forward on the step's own thread (the default), together
//! and alone.
use common::{model, opts, serve, BuildPeriodic};
use mlx_engine::batch::{Engine, EngineMetrics, GenerationRequest};
use mlx_sample::LogitsParams;
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

/// Rows 0, 2 and 4 constrained (a host-mask grammar: the `i`-th token `i` modulo 3, so
/// each step's mask differs from the last; 2 also with a penalty), 1 with penalties, 3
/// plain.
fn request(i: usize) -> GenerationRequest {
    let mut r = GenerationRequest::new(PROMPTS[i].to_vec(), MAX);
    if i.is_multiple_of(2) {
        r.processors.push(Arc::new(BuildPeriodic {
            modulus: 3,
            host_bits: true,
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

#[test]
fn masks_beside_the_forward_give_the_tokens_of_masks_after_it() {
    let n = PROMPTS.len();
    // The masks after the forward, on the step's thread: each request alone, then all
    // together.
    std::env::remove_var("MLX_MASKS_BESIDE");
    let e = engine();
    let alone: Vec<Vec<u32>> = (0..n)
        .map(|i| serve(&e, vec![request(i)]).remove(0).tokens)
        .collect();
    let together: Vec<Vec<u32>> = serve(&e, (0..n).map(request).collect())
        .into_iter()
        .map(|g| g.tokens)
        .collect();
    drop(e);
    assert_eq!(mlx_engine::batch::masks_beside_steps(), 0);
    assert_eq!(together, alone, "served together against alone");
    for i in (0..n).step_by(2) {
        assert_eq!(alone[i].len(), MAX, "row {i} ran to its length");
        for (j, t) in alone[i].iter().enumerate() {
            assert_eq!(
                t % 3,
                j as u32 % 3,
                "row {i}: token {j} breaks the constraint"
            );
        }
    }
    // Beside the forward at every step.
    std::env::set_var("MLX_MASKS_BESIDE", "always");
    let e = engine();
    let beside: Vec<Vec<u32>> = serve(&e, (0..n).map(request).collect())
        .into_iter()
        .map(|g| g.tokens)
        .collect();
    let beside_alone: Vec<Vec<u32>> = (0..n)
        .map(|i| serve(&e, vec![request(i)]).remove(0).tokens)
        .collect();
    assert!(
        mlx_engine::batch::masks_beside_steps() >= 2 * MAX as u64 - 4,
        "the masks were computed beside the forward in {} steps",
        mlx_engine::batch::masks_beside_steps()
    );
    assert_eq!(beside, alone, "beside, together");
    assert_eq!(beside_alone, alone, "beside, alone");
}

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! A decode step's grammar masks computed on a second thread while the forward is
//! queued (`MLX_MASKS_BESIDE`, session 42) give every row the tokens it gets with the
//! masks computed after the forward on the step's own thread (the default), together
//! and alone.
use common::{model, opts, serve};
use mlx_array::Array;
use mlx_engine::batch::{Engine, EngineMetrics, GenerationRequest};
use mlx_sample::{BuildProcessor, LogitsParams, LogitsProcessor};
use std::sync::Arc;

#[allow(dead_code)] // shared helpers this file does not use
mod common;

const TARGET: &str = "llama-small-f32";

/// A grammar over token ids as an output constraint works: a host mask (a bitset of the
/// allowed tokens) from the tokens it was told, each accepted token needed before the
/// next step. The `i`-th token of the answer must be `i` modulo 3 (so each step's
/// mask differs from the last).
#[derive(Debug, Clone, Default)]
struct Modulo {
    accepted: u32,
    failed: bool,
}

impl Modulo {
    fn allows(&self, t: u32) -> bool {
        !self.failed && t % 3 == self.accepted % 3
    }
}

impl LogitsProcessor for Modulo {
    fn process(&mut self, _history: &Array, logits: &Array) -> mlx_sample::Result<Array> {
        let v = logits.dim(-1)?;
        let allow: Vec<bool> = (0..v as u32).map(|t| self.allows(t)).collect();
        let cond = Array::from_slice(&allow, &[1, v])?;
        let neg = Array::scalar_f64(f64::NEG_INFINITY, logits.dtype())?;
        Ok(mlx_array::where_(&cond, logits, &neg)?)
    }

    fn allowed_bits(&mut self, vocab: usize) -> Option<mlx_sample::Result<Vec<u32>>> {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for t in (0..vocab as u32).filter(|&t| self.allows(t)) {
            words[t as usize / 32] |= 1 << (t % 32);
        }
        Some(Ok(words))
    }

    fn accept(&mut self, token: u32) -> mlx_sample::Result<()> {
        if token % 3 != self.accepted % 3 {
            self.failed = true;
        }
        self.accepted += 1;
        Ok(())
    }

    fn needs_accepted_token(&self) -> bool {
        true
    }

    fn dead_end(&self) -> bool {
        self.failed
    }

    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }
}

#[derive(Debug)]
struct BuildModulo;

impl BuildProcessor for BuildModulo {
    fn build(&self) -> mlx_sample::Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Modulo::default()))
    }
}

const PROMPTS: [&[u32]; 5] = [
    &[3, 4, 5, 6, 7, 8, 9, 10, 11],
    &[11, 12],
    &[20, 21, 22, 23, 24],
    &[40, 41, 42, 43, 44, 45, 46],
    &[60, 61, 62],
];
const MAX: usize = 19;

/// Rows 0, 2 and 4 constrained (2 also with a penalty), 1 with penalties, 3 plain.
fn request(i: usize) -> GenerationRequest {
    let mut r = GenerationRequest::new(PROMPTS[i].to_vec(), MAX);
    if i.is_multiple_of(2) {
        r.processors.push(Arc::new(BuildModulo));
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

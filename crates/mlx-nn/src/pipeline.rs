//! Pipelined prefill: bounds how far the host runs ahead of the device while a prompt
//! is processed.
//!
//! A prefill forward pass is one lazy graph that the caller evaluates at the end. On
//! MLX's CUDA backend the host encodes all of it long before the device is through the
//! first layers, and a buffer is released only when the device has finished the CUDA
//! graph that used it, so nearly every intermediate of the whole pass is alive at once
//! (benchmarks/GPU.md, session 10). Inside a [`PipelinedPrefill`] scope, each attention
//! layer's cache update hands the keys and values it returns to `async_eval` (which
//! ends the CUDA graph there) and then waits for the layer `depth` updates back, so at
//! most `depth + 1` layers are queued on the device. The ops and their inputs are the
//! same, so the results are bit for bit those of one evaluation at the end.
//!
//! Only multi-token updates are pipelined: a decoding step stays one graph, queued
//! with `async_eval` by the engine.
use crate::cache::{KvCache, KvFetch};
use mlx_array::{transforms, Array, Result};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::OnceLock;

/// The layers kept queued when `MLX_PREFILL_PIPELINE` is unset.
pub const DEFAULT_DEPTH: usize = 2;

struct Pipeline {
    depth: usize,
    queued: VecDeque<Vec<Array>>,
}

thread_local! {
    static PIPELINE: RefCell<Option<Pipeline>> = const { RefCell::new(None) };
}

/// The depth the engines use: `MLX_PREFILL_PIPELINE` (a layer count; `0` turns the
/// pipelining off), else [`DEFAULT_DEPTH`]. Read once.
pub fn prefill_depth() -> usize {
    static DEPTH: OnceLock<usize> = OnceLock::new();
    *DEPTH.get_or_init(|| match std::env::var("MLX_PREFILL_PIPELINE") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                "MLX_PREFILL_PIPELINE={v:?} is not a layer count; using {DEFAULT_DEPTH}"
            );
            DEFAULT_DEPTH
        }),
        Err(_) => DEFAULT_DEPTH,
    })
}

/// While alive, cache updates on this thread are pipelined (see the module docs).
/// Dropping it ends the scope (and restores an enclosing one); what is still queued is
/// left to the caller's own evaluation.
#[must_use = "the pipelining lasts as long as the guard"]
pub struct PipelinedPrefill {
    outer: Option<Pipeline>,
}

impl PipelinedPrefill {
    /// Starts a scope keeping at most `depth` earlier layers queued; `depth == 0` gives
    /// a scope that changes nothing.
    pub fn new(depth: usize) -> PipelinedPrefill {
        let inner = (depth > 0).then(|| Pipeline {
            depth,
            queued: VecDeque::new(),
        });
        PipelinedPrefill {
            outer: PIPELINE.with(|p| std::mem::replace(&mut *p.borrow_mut(), inner)),
        }
    }

    /// A scope at [`prefill_depth`].
    pub fn from_env() -> PipelinedPrefill {
        PipelinedPrefill::new(prefill_depth())
    }
}

impl Drop for PipelinedPrefill {
    fn drop(&mut self) {
        let outer = self.outer.take();
        PIPELINE.with(|p| *p.borrow_mut() = outer);
    }
}

/// `cache.update_and_fetch(keys, values)`, pipelined inside a [`PipelinedPrefill`]
/// scope when `keys` holds more than one position. Models call this rather than the
/// trait method.
pub fn update_and_fetch(cache: &mut dyn KvCache, keys: &Array, values: &Array) -> Result<KvFetch> {
    let fetch = cache.update_and_fetch(keys, values)?;
    queue(keys, &fetch)?;
    Ok(fetch)
}

/// Queues `fetch` when a scope is open and `keys` holds more than one position. The
/// scope is looked up first: outside one (every decoding step) nothing else is done.
fn queue(keys: &Array, fetch: &KvFetch) -> Result<()> {
    PIPELINE.with(|p| {
        let mut p = p.borrow_mut();
        let Some(p) = p.as_mut() else {
            return Ok(());
        };
        if keys.ndim() < 3 || keys.dim(2)? <= 1 {
            return Ok(());
        }
        let arrays = match fetch {
            KvFetch::Plain { keys, values } => vec![keys.clone(), values.clone()],
            KvFetch::Quantized { keys, values, .. } => vec![
                keys.0.clone(),
                keys.1.clone(),
                keys.2.clone(),
                values.0.clone(),
                values.1.clone(),
                values.2.clone(),
            ],
        };
        transforms::async_eval(&arrays.iter().collect::<Vec<_>>())?;
        p.queued.push_back(arrays);
        while p.queued.len() > p.depth {
            if let Some(done) = p.queued.pop_front() {
                transforms::eval(&done.iter().collect::<Vec<_>>())?;
            }
        }
        Ok(())
    })
}

//! The generation engine: mlx-lm's `generate_step` (chunked prefill, pipelined decode
//! with `async_eval`) and `stream_generate` (detokenized text, stop on EOS, statistics).
//!
//! Samplers, logits processors and KV caches are passed in, so the loop stays one small
//! file and the same tokens come out as from mlx-lm for the same inputs.
//!
//! Performance notes (batch-1 decode is bound by host time per token, see
//! benchmarks/GPU.md): with the `mimalloc` feature (off by
//! default; our binaries turn it on) the process allocates through
//! mimalloc (libmlx's own C++ allocations included); `MLX_ENGINE_PROFILE=1` prints, when
//! a generation ends, the mean host time per decode step spent building the graph, in
//! `async_eval` and waiting for the token (`examples/decode_build.rs` times the same
//! pieces in isolation).
#![warn(missing_docs)]

mod error;
mod generate;
mod profile;
mod stream;

pub use error::{EngineError, Result};
pub use generate::{
    generation_stream, GenerateOptions, KvQuantization, LogitsProcessor, Sampler, TokenGenerator,
};
pub use stream::{stream_generate, FinishReason, GenerationResponse, PromptInput};

//! The generation engine: mlx-lm's `generate_step` (chunked prefill, pipelined decode
//! with `async_eval`) and `stream_generate` (detokenized text, stop on EOS, statistics).
//!
//! Samplers, logits processors and KV caches are passed in, so the loop stays one small
//! file and the same tokens come out as from mlx-lm for the same inputs.
#![warn(missing_docs)]

mod error;
mod generate;
mod stream;

pub use error::{EngineError, Result};
pub use generate::{
    generation_stream, GenerateOptions, KvQuantization, LogitsProcessor, Sampler, TokenGenerator,
};
pub use stream::{stream_generate, FinishReason, GenerationResponse, PromptInput};

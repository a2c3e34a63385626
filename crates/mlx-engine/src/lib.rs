//! The generation engine: mlx-lm's `generate_step` (chunked prefill, pipelined decode
//! with `async_eval`), `stream_generate` (detokenized text, stop on EOS, statistics)
//! and its `BatchGenerator` (continuous batching of many sequences, [`batch`]).
//!
//! Every path builds its decoding steps from one step function ([`step`]: model call,
//! KV-cache quantization, logits processors, log-softmax, sampler) and reads tokens back
//! one way. Generators implement [`TokenIterator`], which `stream_generate` and the
//! command-line tools drive; samplers, logits processors and KV caches are passed in,
//! so the same tokens come out as from mlx-lm for the same inputs.
//!
//! Performance notes (batch-1 decode is bound by host time per token, see
//! benchmarks/GPU.md): with the `mimalloc` feature (off by
//! default; our binaries turn it on) the process allocates through
//! mimalloc (libmlx's own C++ allocations included); `MLX_ENGINE_PROFILE=1` prints, when
//! a generation ends, the mean host time per decode step spent building the graph, in
//! `async_eval` and waiting for the token (`examples/decode_build.rs` times the same
//! pieces in isolation).
#![warn(missing_docs)]

pub mod batch;
pub mod constrain;
mod error;
mod gbnf;
mod generate;
mod profile;
pub mod speculative;
pub mod step;
mod stream;

pub use constrain::{CompiledConstraint, Constraint, ConstraintVocab};
pub use error::{EngineError, Result};
pub use generate::{
    generation_stream, GenerateOptions, LogitsProcessor, LogitsProcessors, Sampler, TokenGenerator,
    TokenIterator,
};
pub use speculative::{DraftSource, PromptLookup, SpeculativeGenerator, SpeculativeStats};
pub use step::{KvQuantization, Sampling};
pub use stream::{
    stream_generate, stream_generate_with, FinishReason, GenerationResponse, PromptInput,
};

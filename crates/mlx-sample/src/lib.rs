//! Samplers and logits processors with mlx-lm's semantics (`mlx_lm/sample_utils.py`).
//!
//! With the same `mx.random.seed(s)` ([`mlx_array::random::seed`]) and the same
//! log-probabilities, the sampled tokens equal mlx-lm's: samplers draw from MLX's
//! global key sequence in the same order as mlx-lm's compiled functions do. MLX keeps
//! one key per thread, so seed on the thread that samples.
//!
//! ```
//! use mlx_sample::{make_sampler, SamplerParams};
//! use mlx_array::Array;
//! let logprobs = Array::from_slice(&[-3.0f32, -0.1, -2.5], &[1, 3])?;
//! let greedy = make_sampler(&SamplerParams::default())?; // temp 0: argmax
//! assert_eq!(greedy.sample(&logprobs)?.to_vec::<u32>()?, vec![1]);
//! let p = SamplerParams { temp: 0.7, top_k: 1, ..Default::default() };
//! assert_eq!(make_sampler(&p)?.sample(&logprobs)?.to_vec::<u32>()?, vec![1]);
//! # Ok::<(), mlx_sample::SampleError>(())
//! ```
#![warn(missing_docs)]

mod error;
mod processors;
mod sampler;
mod util;

pub use error::{Result, SampleError};
pub use processors::{
    make_logits_processors, BuildProcessor, FrequencyPenalty, LogitBias, LogitsParams,
    LogitsProcessor, LogitsProcessors, MinTokens, PresencePenalty, RepetitionPenalty,
};
pub use sampler::{
    apply_min_p, apply_top_k, apply_top_p, apply_xtc, categorical_sampling, greedy, make_sampler,
    ChainSampler, Filter, GreedySampler, Sampler, SamplerParams,
};

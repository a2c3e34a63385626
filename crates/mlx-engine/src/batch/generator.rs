//! In-process batch generation over the [`Engine`] (mlx-lm's `batch_generate` and
//! `BatchGenerator.stats()`): many prompts at once, greedy by default, with the
//! statistics `mlx_lm.benchmark -b N` reports.
//!
//! The engine schedules exactly as the server does: up to `prompt_concurrency` prompts
//! prefill together, up to `decode_concurrency` sequences decode in one forward pass
//! per step, and sequences waiting for a slot join as others finish.
//!
//! ```no_run
//! # fn run(model: Box<dyn mlx_models::LanguageModel>) -> mlx_engine::Result<()> {
//! use mlx_engine::batch::{BatchGenerator, BatchOptions};
//! let gen = BatchGenerator::start(model, BatchOptions::default())?;
//! let out = gen.generate(&[vec![1, 2, 3], vec![4, 5]], 16)?;
//! println!("{:?} at {:.1} tok/s", out.tokens, out.stats.generation_tps());
//! # Ok(()) }
//! ```
use super::metrics::EngineMetrics;
use super::request::{EngineEvent, GenerationRequest, Submission};
use super::scheduler::{Engine, EngineOptions};
use crate::error::{EngineError, Result};
use crate::step::Sampling;
use mlx_models::LanguageModel;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

/// Settings of a [`BatchGenerator`]; the defaults are those of mlx-lm's
/// `BatchGenerator` as `batch_generate` builds it.
#[derive(Debug, Clone)]
pub struct BatchOptions {
    /// Sequences decoding at once (mlx-lm's `completion_batch_size`, 32).
    pub completion_batch_size: usize,
    /// Prompts prefilled together (mlx-lm's `prefill_batch_size`, 8).
    pub prefill_batch_size: usize,
    /// Tokens per prefill chunk (2048).
    pub prefill_step_size: usize,
    /// Sampler settings for every prompt (greedy by default).
    pub sampling: Sampling,
    /// Token sequences that end a generation (e.g. the EOS ids, each alone); none by
    /// default.
    pub stop_sequences: Vec<Vec<u32>>,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            completion_batch_size: 32,
            prefill_batch_size: 8,
            prefill_step_size: 2048,
            sampling: Sampling::default(),
            stop_sequences: Vec::new(),
        }
    }
}

/// What one [`BatchGenerator::generate`] call did (mlx-lm's `BatchStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchStats {
    /// Prompt tokens processed.
    pub prompt_tokens: u64,
    /// Seconds spent processing prompts.
    pub prompt_time: f64,
    /// Tokens generated (all sequences).
    pub generation_tokens: u64,
    /// Seconds from the submission of the prompts to the last token.
    pub wall_time: f64,
    /// MLX's peak memory of the process (GB, 1e9 bytes) at the end.
    pub peak_memory: f64,
}

impl BatchStats {
    /// Prompt tokens per second of prompt processing.
    pub fn prompt_tps(&self) -> f64 {
        if self.prompt_time <= 0.0 {
            0.0
        } else {
            self.prompt_tokens as f64 / self.prompt_time
        }
    }

    /// Seconds generating: the wall time less the prompt processing.
    pub fn generation_time(&self) -> f64 {
        (self.wall_time - self.prompt_time).max(0.0)
    }

    /// Generated tokens per second of generation time.
    pub fn generation_tps(&self) -> f64 {
        let t = self.generation_time();
        if t <= 0.0 {
            0.0
        } else {
            self.generation_tokens as f64 / t
        }
    }
}

/// The output of one batch: the generated token ids per prompt (in prompt order) and
/// the statistics.
#[derive(Debug, Clone)]
pub struct BatchResponse {
    /// Generated tokens of each prompt; a stop sequence's tokens are included.
    pub tokens: Vec<Vec<u32>>,
    /// Statistics.
    pub stats: BatchStats,
}

/// An engine thread that generates batches of prompts, one call at a time.
pub struct BatchGenerator {
    engine: Engine,
    metrics: Arc<EngineMetrics>,
    opts: BatchOptions,
}

impl BatchGenerator {
    /// Starts the engine with `model`. No prompt cache is kept between calls.
    pub fn start(model: Box<dyn LanguageModel>, opts: BatchOptions) -> Result<Self> {
        if opts.completion_batch_size == 0 || opts.prefill_batch_size == 0 {
            return Err(EngineError::Invalid(
                "completion_batch_size and prefill_batch_size must be positive".into(),
            ));
        }
        if opts.prefill_step_size == 0 {
            return Err(EngineError::Invalid(
                "prefill_step_size must be positive".into(),
            ));
        }
        let metrics = Arc::new(EngineMetrics::default());
        let engine = Engine::start(
            model,
            EngineOptions {
                decode_concurrency: opts.completion_batch_size,
                prompt_concurrency: opts.prefill_batch_size,
                prefill_step_size: opts.prefill_step_size,
                prompt_cache_size: 0,
                prompt_cache_bytes: None,
                kv_quantization: None,
                max_queue: usize::MAX,
                memory: None,
                memory_limit: None,
                disk_cache: None,
                preload: Vec::new(),
                draft_min_acceptance: 0.0,
                draft_max_batch: 0,
                prediction_drafts: Default::default(),
                model_drafts: Default::default(),
            },
            Arc::clone(&metrics),
        )?;
        Ok(BatchGenerator {
            engine,
            metrics,
            opts,
        })
    }

    /// Stops the engine thread and hands the model back (`None` if the thread died).
    pub fn into_model(self) -> Option<Box<dyn LanguageModel>> {
        self.engine.shutdown_into_model()
    }

    /// Generates up to `max_tokens` tokens for each prompt; returns when all are done.
    /// Fails on an empty prompt, `max_tokens` 0, or the first sequence that fails.
    pub fn generate(&self, prompts: &[Vec<u32>], max_tokens: usize) -> Result<BatchResponse> {
        self.generate_each(prompts, &vec![max_tokens; prompts.len()])
    }

    /// [`BatchGenerator::generate`] with each prompt's own token budget (mlx-lm's
    /// `batch_generate` with a list of `max_tokens`).
    pub fn generate_each(
        &self,
        prompts: &[Vec<u32>],
        max_tokens: &[usize],
    ) -> Result<BatchResponse> {
        if max_tokens.len() != prompts.len() {
            return Err(EngineError::Invalid(format!(
                "{} prompts but {} token budgets",
                prompts.len(),
                max_tokens.len()
            )));
        }
        if max_tokens.contains(&0) {
            return Err(EngineError::Invalid("max_tokens must be at least 1".into()));
        }
        if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
            return Err(EngineError::Invalid(format!("prompt {i} is empty")));
        }
        let m = &self.metrics;
        let (prompt0, cached0, gen0, prefill0) = (
            m.prompt_tokens.get(),
            m.cached_prompt_tokens.get(),
            m.generation_tokens.get(),
            m.prefill_micros.get(),
        );
        let tic = Instant::now();
        let mut subs: Vec<(Submission, mpsc::Receiver<EngineEvent>)> =
            Vec::with_capacity(prompts.len());
        for (p, &max_tokens) in prompts.iter().zip(max_tokens) {
            let (tx, rx) = mpsc::channel();
            let req = GenerationRequest {
                sampling: self.opts.sampling.clone(),
                stop_sequences: self.opts.stop_sequences.clone(),
                ..GenerationRequest::new(p.clone(), max_tokens)
            };
            let sub = self.engine.submit(req, Arc::new(tx))?;
            subs.push((sub, rx));
        }
        let mut tokens = Vec::with_capacity(subs.len());
        for (sub, events) in subs {
            let mut out = Vec::new();
            loop {
                match events.recv() {
                    Ok(EngineEvent::Token { out: t, .. }) => {
                        out.push(t.token);
                        if t.finish.is_some() {
                            break;
                        }
                    }
                    Ok(EngineEvent::Failed { error, .. }) => return Err(error),
                    Ok(_) => {}
                    Err(_) => {
                        return Err(EngineError::Unavailable(
                            "the generation engine stopped before the batch finished".into(),
                        ))
                    }
                }
            }
            sub.release();
            tokens.push(out);
        }
        let wall_time = tic.elapsed().as_secs_f64();
        let stats = BatchStats {
            prompt_tokens: (m.prompt_tokens.get() - prompt0)
                .saturating_sub(m.cached_prompt_tokens.get() - cached0),
            prompt_time: (m.prefill_micros.get() - prefill0) as f64 / 1e6,
            generation_tokens: m.generation_tokens.get() - gen0,
            wall_time,
            peak_memory: mlx_array::memory::peak_memory() as f64 / 1e9,
        };
        Ok(BatchResponse { tokens, stats })
    }
}

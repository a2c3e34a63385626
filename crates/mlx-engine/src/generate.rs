//! `generate_step`: tokens in, sampled tokens and log-probabilities out, behind the
//! [`TokenIterator`] trait that `stream_generate` and the command-line tools drive.
use crate::error::{EngineError, Result};
use crate::step::{self, KvQuantization, LogSoftmax, RowSampling};
use mlx_array::{memory, transforms, Array, Stream};
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use std::time::Instant;

pub use mlx_sample::{LogitsProcessor, LogitsProcessors, Sampler};

/// A source of generated tokens, one at a time (mlx-swift-lm's `TokenIteratorProtocol`):
/// [`TokenGenerator`] is mlx-lm's `generate_step`; a speculative or a constrained
/// generator is another implementation that [`crate::stream_generate_with`] and the
/// command-line tools drive the same way.
pub trait TokenIterator {
    /// The next `(token, logprobs [vocab])`, or `None` once the generator is done
    /// (e.g. `max_tokens` are out).
    fn next_token(&mut self) -> Result<Option<(u32, Array)>>;

    /// Prompt tokens the generator processes (for statistics).
    fn prompt_tokens(&self) -> usize;

    /// Whether the token last returned was a draft token the target accepted
    /// (mlx-lm's `from_draft`); always `false` outside speculative decoding.
    fn last_from_draft(&self) -> bool {
        false
    }

    /// Drafted / accepted counts of a speculative generator; `None` otherwise.
    fn speculative_stats(&self) -> Option<crate::speculative::SpeculativeStats> {
        None
    }

    /// Whether an output constraint reached a dead end (it then forced an EOS: the
    /// generation ends with [`crate::FinishReason::Constraint`]).
    fn dead_end(&self) -> bool {
        false
    }
}

/// Options of [`TokenGenerator`], with mlx-lm's defaults.
pub struct GenerateOptions {
    /// Tokens to generate; `-1` for no limit.
    pub max_tokens: i64,
    /// Prompt tokens per prefill chunk.
    pub prefill_step_size: usize,
    /// Picks the next token from log-probabilities `[1, vocab]` (greedy when `None`).
    pub sampler: Option<Box<dyn Sampler>>,
    /// Rewrite logits `[1, vocab]` given all tokens so far, in order.
    pub logits_processors: Vec<Box<dyn LogitsProcessor>>,
    /// KV-cache quantization, applied after every model call.
    pub kv_quantization: Option<KvQuantization>,
    /// Called with (processed, total) prompt tokens.
    pub prompt_progress: Option<Box<dyn FnMut(usize, usize)>>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            prefill_step_size: 2048,
            sampler: None,
            logits_processors: Vec::new(),
            kv_quantization: None,
            prompt_progress: None,
        }
    }
}

/// mlx-lm's `generate_step` as an iterator-like object: the prompt is processed on the
/// first call to [`TokenGenerator::next_token`], and each call queues the following step
/// before returning the current token, so the host never waits on the device.
pub struct TokenGenerator<'a> {
    model: &'a dyn LanguageModel,
    caches: &'a mut Vec<Box<dyn KvCache>>,
    max_tokens: i64,
    prefill_step_size: usize,
    kv_quantization: Option<KvQuantization>,
    prompt_progress: Option<Box<dyn FnMut(usize, usize)>>,
    sampling: RowSampling,
    stream: Stream,
    prompt: Option<Vec<u32>>,
    current: Option<(Array, Array)>,
    prompt_total: usize,
    n: i64,
    profile: Option<crate::profile::DecodeProfile>,
}

impl Drop for TokenGenerator<'_> {
    fn drop(&mut self) {
        if let Some(line) = self.profile.as_ref().and_then(|p| p.summary()) {
            eprintln!("{line}");
        }
    }
}

impl<'a> TokenGenerator<'a> {
    /// Prepares generation. `caches` must hold one cache per layer (see
    /// `mlx_cache::make_prompt_cache`); a prompt cache from a file continues from its
    /// offset.
    pub fn new(
        model: &'a dyn LanguageModel,
        prompt: &[u32],
        caches: &'a mut Vec<Box<dyn KvCache>>,
        opts: GenerateOptions,
    ) -> Result<TokenGenerator<'a>> {
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt has no tokens".into()));
        }
        let vocab = model.vocab_size();
        if let Some((i, &id)) = prompt
            .iter()
            .enumerate()
            .find(|(_, &id)| vocab > 0 && id as i64 >= vocab as i64)
        {
            // MLX's gather does not check bounds: such an id would read arbitrary memory.
            return Err(EngineError::Invalid(format!(
                "prompt token {i} is id {id}, outside the model's vocabulary of {vocab} \
                 (is the tokenizer the model's?)"
            )));
        }
        // One cache per entry of the model's `make_cache` (fewer than its layers where
        // layers share keys and values, as Gemma 4's do).
        let wanted = model.cache_specs().len();
        if caches.len() != wanted {
            return Err(EngineError::Invalid(format!(
                "{} caches given for a model that uses {wanted}",
                caches.len(),
            )));
        }
        Ok(TokenGenerator {
            model,
            caches,
            max_tokens: opts.max_tokens,
            prefill_step_size: opts.prefill_step_size,
            kv_quantization: opts.kv_quantization,
            prompt_progress: opts.prompt_progress,
            sampling: RowSampling::new(opts.sampler, LogitsProcessors::new(opts.logits_processors)),
            stream: generation_stream()?,
            prompt: Some(prompt.to_vec()),
            current: None,
            prompt_total: prompt.len(),
            n: 0,
            profile: crate::profile::enabled().then(Default::default),
        })
    }

    fn model_call(&mut self, input: &Array) -> Result<Array> {
        let x = input.expand_dims(&[0])?;
        step::forward(self.model, &x, self.caches, self.kv_quantization)
    }

    /// One decoding step on `input` (`[1]`): [`step::forward`] then [`step::sample`].
    fn step(&mut self, input: &Array) -> Result<(Array, Array)> {
        let logits = self.model_call(input)?;
        let mut s = step::sample(&mut [&mut self.sampling], input, &logits, LogSoftmax::Whole)?;
        if let Some((_, e)) = s.failed.pop() {
            return Err(e);
        }
        Ok((s.tokens, s.logprobs.squeeze(Some(&[0]))?))
    }

    fn prefill(&mut self, prompt: Vec<u32>) -> Result<()> {
        let total = prompt.len();
        let mut done = 0usize;
        if let Some(cb) = self.prompt_progress.as_mut() {
            cb(0, total);
        }
        let step = self.prefill_step_size.max(1);
        while total - done > 1 {
            let n = step.min(total - done - 1);
            let chunk = Array::from_slice(&prompt[done..done + n], &[1, n as i32])?;
            step::prefill(self.model, &chunk, self.caches, self.kv_quantization)?;
            self.sampling.prompt(&prompt[done..done + n])?;
            done += n;
            tracing::debug!("prefill: {done}/{total} prompt tokens ({})", memory::note());
            if let Some(cb) = self.prompt_progress.as_mut() {
                cb(done, total);
            }
            memory::clear_cache();
        }
        let rest = Array::from_slice(&prompt[done..], &[(total - done) as i32])?;
        let (y, lp) = self.step(&rest)?;
        transforms::async_eval(&[&y, &lp])?;
        self.current = Some((y, lp));
        Ok(())
    }

    fn next_inner(&mut self) -> Result<Option<(u32, Array)>> {
        if let Some(prompt) = self.prompt.take() {
            self.prefill(prompt)?;
        }
        let Some((y, lp)) = self.current.take() else {
            return Ok(None);
        };
        // A processor that needs the accepted token: read it before the next step.
        let early = if self.sampling.needs_accepted_token() && self.n != self.max_tokens {
            let token = step::read_token(&y)?;
            self.sampling.accept(token)?;
            Some(token)
        } else {
            None
        };
        let mut next = None;
        let t0 = self.profile.is_some().then(Instant::now);
        let mut t1 = t0;
        if self.n != self.max_tokens {
            let (ny, nlp) = self.step(&y)?;
            t1 = t0.map(|_| Instant::now());
            transforms::async_eval(&[&ny, &nlp])?;
            next = Some((ny, nlp));
        }
        let t2 = t0.map(|_| Instant::now());
        if self.n == 0 {
            y.eval()?;
            tracing::debug!("first token ({})", memory::note());
            let total = self.prompt_total;
            if let Some(cb) = self.prompt_progress.as_mut() {
                cb(total, total);
            }
        }
        if self.n == self.max_tokens {
            return Ok(None);
        }
        let token = match early {
            Some(t) => t,
            None => {
                let t = step::read_token(&y)?;
                self.sampling.accept(t)?;
                t
            }
        };
        if let (Some(p), Some(t0), Some(t1), Some(t2)) = (self.profile.as_mut(), t0, t1, t2) {
            if self.n == 0 {
                p.start();
            } else {
                p.add(t1 - t0, t2 - t1, t2.elapsed());
            }
        }
        if self.n % 256 == 0 {
            memory::clear_cache();
        }
        self.current = next;
        self.n += 1;
        Ok(Some((token, lp)))
    }
}

impl TokenIterator for TokenGenerator<'_> {
    fn next_token(&mut self) -> Result<Option<(u32, Array)>> {
        let stream = self.stream;
        mlx_array::with_stream(stream, || self.next_inner())
    }

    fn prompt_tokens(&self) -> usize {
        self.prompt_total
    }

    fn dead_end(&self) -> bool {
        self.sampling.dead_end()
    }
}

thread_local! {
    static GENERATION_STREAM: std::cell::OnceCell<Stream> = const { std::cell::OnceCell::new() };
}

/// The stream generation runs on: one per thread, made once on the default device (like
/// mlx-lm's module-level `generation_stream`), so a warm-up warms the stream that later
/// generations use.
pub fn generation_stream() -> Result<Stream> {
    // Links mimalloc's malloc/free overrides into the binary (see the crate feature).
    #[cfg(feature = "mimalloc")]
    // SAFETY: frees the block it just allocated.
    unsafe {
        libmimalloc_sys::mi_free(libmimalloc_sys::mi_malloc(8));
    }
    GENERATION_STREAM.with(|cell| {
        if let Some(s) = cell.get() {
            return Ok(*s);
        }
        let s = mlx_array::Device::default_device()?.new_stream()?;
        let _ = cell.set(s);
        Ok(s)
    })
}

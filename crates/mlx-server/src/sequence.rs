//! One generating sequence: its KV caches, sampler, processors and stop state, and the
//! steps of mlx-lm's `generate_step` (chunked prefill, then pipelined decode) split so
//! the scheduler can interleave many sequences.
use crate::error::ApiError;
use crate::text::StopMatcher;
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_cache::KvCache;
use mlx_models::LanguageModel;
use mlx_sample::{LogitsParams, LogitsProcessor, Sampler, SamplerParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Sampling settings of a request (mlx-lm's `make_sampler` arguments plus a seed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// `make_sampler` arguments.
    pub params: SamplerParams,
    /// Per-request seed: sampling is then reproducible whatever else runs.
    pub seed: Option<u64>,
}

/// What one request asks of the engine.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (at least 1).
    pub max_tokens: usize,
    /// Sampler settings.
    pub sampling: Sampling,
    /// Logits processors (bias and penalties).
    pub logits: LogitsParams,
    /// Token sequences that end generation: EOS ids first, then the encoded stop words.
    pub stop_sequences: Vec<Vec<u32>>,
    /// Log-probability of each token wanted.
    pub logprobs: bool,
    /// Number of alternatives per position wanted (0: none).
    pub top_logprobs: usize,
    /// Independent completions of the same prompt (OpenAI's `n`).
    pub n: usize,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// EOS or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// One generated token.
#[derive(Debug, Clone)]
pub struct TokenOut {
    /// Token id.
    pub token: u32,
    /// Its log-probability (when asked for).
    pub logprob: Option<f32>,
    /// The most likely alternatives `(id, logprob)` (when asked for).
    pub top: Vec<(u32, f32)>,
    /// Set on the last token.
    pub finish: Option<Finish>,
    /// Which of the request's stop sequences ended it (when `finish` is `Stop`).
    pub stop_index: Option<usize>,
}

/// What the engine tells a request, tagged with the choice index.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// The sequence got a slot; `cached_tokens` prompt tokens came from the prompt cache.
    Started {
        /// Choice index.
        choice: usize,
        /// Prompt tokens reused from the prompt cache.
        cached_tokens: usize,
    },
    /// A prefill chunk finished.
    Progress {
        /// Choice index.
        choice: usize,
        /// Prompt tokens processed so far (of those not cached).
        processed: usize,
        /// Prompt tokens to process.
        total: usize,
    },
    /// A token.
    Token {
        /// Choice index.
        choice: usize,
        /// The token.
        out: TokenOut,
    },
    /// The sequence failed; no more events follow for this choice.
    Failed {
        /// Choice index.
        choice: usize,
        /// What to answer.
        error: ApiError,
    },
}

/// One queued or running sequence.
pub struct Job {
    /// The request (shared by the `n` choices).
    pub req: Arc<GenerationRequest>,
    /// Choice index.
    pub choice: usize,
    /// Where events go.
    pub events: UnboundedSender<EngineEvent>,
    /// Set when the client went away.
    pub cancel: Arc<AtomicBool>,
    /// Set when this choice alone is no longer wanted (its text hit a stop word).
    pub choice_cancel: Arc<AtomicBool>,
    /// When the request was submitted.
    pub submitted: Instant,
}

impl Job {
    /// Whether the client is gone.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
            || self.choice_cancel.load(Ordering::Relaxed)
            || self.events.is_closed()
    }

    /// Whether the client went away (as opposed to the choice being stopped on purpose).
    pub fn client_gone(&self) -> bool {
        !self.choice_cancel.load(Ordering::Relaxed)
            && (self.cancel.load(Ordering::Relaxed) || self.events.is_closed())
    }

    /// Sends an event; `false` when the receiver is gone.
    pub fn send(&self, e: EngineEvent) -> bool {
        self.events.send(e).is_ok()
    }
}

/// A sequence holding a decode slot.
pub struct Sequence {
    /// The job.
    pub job: Job,
    /// Per-layer caches.
    pub caches: Vec<Box<dyn KvCache>>,
    /// Prompt tokens already in `caches`.
    pub done: usize,
    /// Prompt tokens that came from the prompt cache.
    pub cached: usize,
    /// Tokens fed through the model so far (the key of `caches` in the prompt cache).
    pub processed: Vec<u32>,
    /// Generated tokens.
    pub generated: usize,
    sampler: Box<dyn Sampler>,
    processors: Vec<Box<dyn LogitsProcessor>>,
    history: Option<Array>,
    /// The queued step: sampled token `[1]` and log-probabilities `[vocab]`.
    pub current: Option<(Array, Array)>,
    stop: StopMatcher,
    step_index: u64,
    /// When the last token was emitted.
    pub last_token_at: Option<Instant>,
}

/// What one [`Sequence::prefill`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// A chunk of the prompt: `(processed, total)` of the uncached prompt.
    Chunk(usize, usize),
    /// The first decoding step was queued.
    Started,
}

/// A seed for the `step`-th draw of a request seeded with `seed`.
fn step_seed(seed: u64, step: u64) -> u64 {
    if step == 0 {
        return seed;
    }
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Sequence {
    /// Builds the sequence: sampler and processors from the request, `caches` holding
    /// the first `cached` prompt tokens.
    pub fn new(
        job: Job,
        caches: Vec<Box<dyn KvCache>>,
        cached: usize,
    ) -> Result<Sequence, ApiError> {
        let req = &job.req;
        let sampler = mlx_sample::make_sampler(&req.sampling.params)
            .map_err(|e| ApiError::bad_request(format!("invalid sampling parameters: {e}")))?;
        let processors = mlx_sample::make_logits_processors(&req.logits)
            .map_err(|e| ApiError::bad_request(format!("invalid logits parameters: {e}")))?;
        let history = if processors.is_empty() || cached == 0 {
            None
        } else {
            Some(Array::from_slice(&req.prompt[..cached], &[cached as i32]).map_err(mlx_err)?)
        };
        let stop = StopMatcher::new(req.stop_sequences.clone());
        Ok(Sequence {
            processed: req.prompt[..cached].to_vec(),
            job,
            caches,
            done: cached,
            cached,
            generated: 0,
            sampler,
            processors,
            history,
            current: None,
            stop,
            step_index: 0,
            last_token_at: None,
        })
    }

    /// Whether the prompt is fully processed.
    pub fn decoding(&self) -> bool {
        self.current.is_some()
    }

    fn model_call(&mut self, model: &dyn LanguageModel, input: &Array) -> Result<Array, ApiError> {
        let x = input.expand_dims(&[0]).map_err(mlx_err)?;
        model.forward(&x, &mut self.caches).map_err(mlx_err)
    }

    fn quantize(&mut self, kv: Option<mlx_engine::KvQuantization>) -> Result<(), ApiError> {
        if let Some(q) = kv {
            mlx_cache::maybe_quantize_kv_cache(
                &mut self.caches,
                q.start,
                q.group_size,
                Some(q.bits),
            )
            .map_err(|e| ApiError::unavailable(format!("KV-cache quantization failed: {e}")))?;
        }
        Ok(())
    }

    /// mlx-lm's `_step`: model, last position, processors, cache quantization,
    /// log-softmax, sampling.
    fn step(
        &mut self,
        model: &dyn LanguageModel,
        input: &Array,
        kv: Option<mlx_engine::KvQuantization>,
    ) -> Result<(Array, Array), ApiError> {
        let logits = self.model_call(model, input)?;
        let (l, v) = (
            logits.dim(1).map_err(mlx_err)?,
            logits.dim(2).map_err(mlx_err)?,
        );
        let mut logits = logits
            .slice(&[0, l - 1, 0], &[1, l, v], None)
            .and_then(|a| a.squeeze(Some(&[1])))
            .map_err(mlx_err)?;
        if input.size() > 0 {
            logits = self.process(&logits, input)?;
        }
        self.quantize(kv)?;
        let lse = logits.logsumexp(None, true).map_err(mlx_err)?;
        let logprobs = logits.subtract(&lse).map_err(mlx_err)?;
        let sampled = self.sample(&logprobs)?;
        Ok((sampled, logprobs.squeeze(Some(&[0])).map_err(mlx_err)?))
    }

    /// Whether the sequence rewrites its logits (penalties, bias).
    pub fn has_processors(&self) -> bool {
        !self.processors.is_empty()
    }

    /// The logits processors of mlx-lm's `_step` on `logits` (`[1, vocab]`), with the
    /// history extended by `input` (the tokens just fed to the model).
    pub fn process(&mut self, logits: &Array, input: &Array) -> Result<Array, ApiError> {
        if self.processors.is_empty() {
            return Ok(logits.clone());
        }
        let all = match &self.history {
            Some(t) => ops::concatenate(&[t, input], 0).map_err(mlx_err)?,
            None => input.clone(),
        };
        let out =
            mlx_sample::apply_processors(&self.processors, &all, logits).map_err(sample_err)?;
        self.history = Some(all);
        Ok(out)
    }

    /// Seeds the generator for this draw when the request has a seed, and counts it.
    pub fn seed_draw(&mut self) -> Result<(), ApiError> {
        if let Some(seed) = self.job.req.sampling.seed {
            mlx_array::random::seed(step_seed(seed, self.step_index)).map_err(mlx_err)?;
        }
        self.step_index += 1;
        Ok(())
    }

    /// Samples from `logprobs` (`[rows, vocab]`) with this sequence's sampler, seeded.
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array, ApiError> {
        self.seed_draw()?;
        self.sampler.sample(logprobs).map_err(sample_err)
    }

    /// One prefill chunk (at most `step_size` tokens, always leaving the last prompt
    /// token), or when only that one is left, the first decoding step (per-sequence
    /// decoding; the decode batch prefills through [`crate::prefill::PrefillBatch`]).
    pub fn prefill(
        &mut self,
        model: &dyn LanguageModel,
        step_size: usize,
        kv: Option<mlx_engine::KvQuantization>,
    ) -> Result<Prefill, ApiError> {
        let req = Arc::clone(&self.job.req);
        let prompt = &req.prompt;
        let part = self.next_chunk(step_size).to_vec();
        if !part.is_empty() {
            let chunk = Array::from_slice(&part, &[part.len() as i32]).map_err(mlx_err)?;
            {
                let _pipelined = mlx_nn::pipeline::PipelinedPrefill::from_env();
                self.model_call(model, &chunk)?;
            }
            self.quantize(kv)?;
            let state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
            transforms::eval(&state.iter().collect::<Vec<_>>()).map_err(mlx_err)?;
            mlx_array::memory::clear_cache();
            let (processed, total) = self.advance_prefill(part.len())?;
            return Ok(Prefill::Chunk(processed, total));
        }
        let rest = &prompt[self.done..];
        let input = Array::from_slice(rest, &[rest.len() as i32]).map_err(mlx_err)?;
        let (y, lp) = self.step(model, &input, kv)?;
        transforms::async_eval(&[&y, &lp]).map_err(mlx_err)?;
        self.processed.extend_from_slice(rest);
        self.done = prompt.len();
        self.current = Some((y, lp));
        Ok(Prefill::Started)
    }

    /// The next prefill chunk: at most `step_size` prompt tokens, never the last one
    /// (empty when only that one is left).
    pub fn next_chunk(&self, step_size: usize) -> &[u32] {
        let prompt = &self.job.req.prompt;
        let remaining = prompt.len().saturating_sub(self.done);
        let n = step_size.max(1).min(remaining.saturating_sub(1));
        &prompt[self.done..self.done + n]
    }

    /// Counts the next `n` prompt tokens as in the caches (and in the processors'
    /// history); returns `(processed, total)` of the uncached prompt.
    pub fn advance_prefill(&mut self, n: usize) -> Result<(usize, usize), ApiError> {
        let req = Arc::clone(&self.job.req);
        let prompt = &req.prompt;
        let part = prompt
            .get(self.done..self.done + n)
            .ok_or_else(|| ApiError::internal("prefilled past the prompt"))?;
        if !self.processors.is_empty() {
            let chunk = Array::from_slice(part, &[n as i32]).map_err(mlx_err)?;
            self.history = Some(match &self.history {
                Some(t) => ops::concatenate(&[t, &chunk], 0).map_err(mlx_err)?,
                None => chunk,
            });
        }
        self.processed.extend_from_slice(part);
        self.done += n;
        Ok((self.done - self.cached, prompt.len() - self.cached))
    }

    /// The last prompt token when it is the only one left (what a sequence joining the
    /// decode batch feeds first).
    pub fn last_prompt_token(&self) -> Option<u32> {
        let prompt = &self.job.req.prompt;
        (self.done + 1 == prompt.len()).then(|| prompt[self.done])
    }

    /// Counts the last prompt token as fed to the model (by the decode batch).
    pub fn feed_last_prompt_token(&mut self) {
        if let Some(t) = self.last_prompt_token() {
            self.processed.push(t);
            self.done += 1;
        }
    }

    /// Queues the step after the current token (pipelining, as `generate_step` does),
    /// unless the current token is the last one allowed. Returns the arrays to evaluate.
    pub fn queue_next(
        &mut self,
        model: &dyn LanguageModel,
        kv: Option<mlx_engine::KvQuantization>,
    ) -> Result<Option<(Array, Array)>, ApiError> {
        let Some((y, _)) = &self.current else {
            return Ok(None);
        };
        if self.generated + 1 >= self.job.req.max_tokens {
            return Ok(None);
        }
        let y = y.clone();
        let next = self.step(model, &y, kv)?;
        Ok(Some(next))
    }

    /// Reads the current token and moves `next` in; the token's output, its finish set
    /// when it ends the sequence.
    pub fn emit(&mut self, next: Option<(Array, Array)>) -> Result<TokenOut, ApiError> {
        let (y, lp) = self
            .current
            .take()
            .ok_or_else(|| ApiError::internal("no queued token"))?;
        let token = read_token(&y)?;
        let req = Arc::clone(&self.job.req);
        let logprob = if self.wants_logprobs() {
            Some(scalar_at(&lp, token)?)
        } else {
            None
        };
        let top = if req.top_logprobs > 0 {
            top_logprobs(&lp, req.top_logprobs)?
        } else {
            Vec::new()
        };
        // With a queued step, the model was fed this token: the caches hold it.
        let out = self.record(token, logprob, top, next.is_some());
        self.current = next;
        Ok(out)
    }

    /// Whether the request wants the log-probability of its tokens.
    pub fn wants_logprobs(&self) -> bool {
        self.job.req.logprobs || self.job.req.top_logprobs > 0
    }

    /// Counts a generated token (`fed`: the caches already hold it) and decides whether
    /// it ends the sequence.
    pub fn record(
        &mut self,
        token: u32,
        logprob: Option<f32>,
        top: Vec<(u32, f32)>,
        fed: bool,
    ) -> TokenOut {
        self.generated += 1;
        if fed {
            self.processed.push(token);
        }
        let stop_index = self.stop.advance(token);
        let finish = if stop_index.is_some() {
            Some(Finish::Stop)
        } else if self.generated >= self.job.req.max_tokens {
            Some(Finish::Length)
        } else {
            None
        };
        TokenOut {
            token,
            logprob,
            top,
            finish,
            stop_index,
        }
    }

    /// Bytes held by the caches.
    pub fn nbytes(&self) -> usize {
        self.caches.iter().map(|c| c.nbytes()).sum()
    }
}

fn read_token(y: &Array) -> Result<u32, ApiError> {
    let y = if y.dtype() == Dtype::Uint32 {
        y.clone()
    } else {
        y.astype(Dtype::Uint32).map_err(mlx_err)?
    };
    y.to_vec::<u32>()
        .map_err(mlx_err)?
        .first()
        .copied()
        .ok_or_else(|| ApiError::internal("the sampler returned no token"))
}

fn scalar_at(lp: &Array, token: u32) -> Result<f32, ApiError> {
    let idx = Array::from_slice(&[token], &[1]).map_err(mlx_err)?;
    let v = lp
        .take(&idx, Some(0))
        .and_then(|a| a.astype(Dtype::Float32))
        .map_err(mlx_err)?;
    v.to_vec::<f32>()
        .map_err(mlx_err)?
        .first()
        .copied()
        .ok_or_else(|| ApiError::internal("empty logprob"))
}

/// mlx-lm's `_format_top_logprobs`: `argpartition(-logprobs, kth=n-1)[:n]`, unsorted.
pub(crate) fn top_logprobs(lp: &Array, n: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let vocab = lp.size();
    let n = n.min(vocab);
    if n == 0 {
        return Ok(Vec::new());
    }
    let idx = lp
        .negative()
        .and_then(|neg| neg.argpartition(n as i32 - 1, Some(-1)))
        .and_then(|p| p.slice(&[0], &[n as i32], None))
        .map_err(mlx_err)?;
    let vals = lp
        .take(&idx, Some(0))
        .and_then(|v| v.astype(Dtype::Float32))
        .map_err(mlx_err)?;
    let ids = idx
        .astype(Dtype::Uint32)
        .and_then(|i| i.to_vec::<u32>())
        .map_err(mlx_err)?;
    let vals = vals.to_vec::<f32>().map_err(mlx_err)?;
    Ok(ids.into_iter().zip(vals).collect())
}

/// An MLX failure: the request gets 503 and the server keeps serving.
pub fn mlx_err(e: mlx_array::Error) -> ApiError {
    ApiError::unavailable(format!("generation failed: {e}"))
}

fn sample_err(e: mlx_sample::SampleError) -> ApiError {
    match e {
        mlx_sample::SampleError::InvalidParameter { .. } => ApiError::bad_request(e.to_string()),
        other => ApiError::unavailable(format!("sampling failed: {other}")),
    }
}

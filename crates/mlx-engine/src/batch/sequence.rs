//! One generating sequence: its job, KV caches (while it is not in a batch), sampling
//! state and stop matcher, and the steps of mlx-lm's `generate_step` (chunked prefill,
//! then pipelined decode) split so the scheduler can interleave many sequences.
use super::prompt_cache::CacheKind;
use super::request::{Finish, Job, PromptLogprob, SeqId, TokenOut};
use super::stage::Outcome;
use super::stop::StopMatcher;
use crate::error::{EngineError, Result};
use crate::step::{self, KvQuantization, LogSoftmax, RowSampling};
use mlx_array::{activations::log_softmax, transforms, Array, Dtype};
use mlx_cache::PromptCache;
use mlx_models::LanguageModel;
use std::time::Instant;

/// A queued decoding step: sampled token `[1]` and log-probabilities `[vocab]`.
type Queued = (Array, Array);

/// A sequence holding a slot.
pub(crate) struct Sequence {
    job: Job,
    /// Per-layer caches; empty while the sequence's rows live in a batch cache.
    caches: PromptCache,
    /// Prompt tokens in the caches.
    prompt_done: usize,
    /// Prompt tokens that came from the prompt cache.
    prompt_cached: usize,
    /// Tokens fed through the model so far (the key of the caches in the prompt cache).
    fed: Vec<u32>,
    /// Tokens generated.
    generated: usize,
    sampling: RowSampling,
    /// Decoding alone: the step queued after the last emitted token.
    queued: Option<Queued>,
    stop: StopMatcher,
    last_token_at: Option<Instant>,
    /// Prompt log-probabilities gathered so far (requests with `prompt_logprobs`).
    prompt_logprobs: Vec<PromptLogprob>,
    /// Whether the prompt's [`Outcome::Prompt`] went out.
    prompt_reported: bool,
}

/// What one [`Sequence::prefill_alone`] call did.
pub(crate) enum Prefill {
    /// A chunk of the prompt: `(processed, total)` of the uncached prompt.
    Chunk(usize, usize),
    /// The first decoding step was queued.
    Started,
    /// The prompt is processed: its outcome (sent before decoding starts).
    Prompt(Outcome),
}

impl Sequence {
    /// The sequence of `job`: sampler and processors from its request, `caches`
    /// holding the first `cached` prompt tokens.
    pub fn new(job: Job, caches: PromptCache, cached: usize) -> Result<Sequence> {
        let req = &job.req;
        let mut sampling = RowSampling::from_request(&req.sampling, &req.logits, &req.processors)?;
        sampling.prompt(&req.prompt[..cached])?;
        let stop = StopMatcher::new(req.stop_sequences.clone());
        Ok(Sequence {
            fed: req.prompt[..cached].to_vec(),
            job,
            caches,
            prompt_done: cached,
            prompt_cached: cached,
            generated: 0,
            sampling,
            queued: None,
            stop,
            last_token_at: None,
            prompt_logprobs: Vec::new(),
            prompt_reported: false,
        })
    }

    /// The sequence's id.
    pub fn id(&self) -> SeqId {
        self.job.id
    }

    /// Its job.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// When its last token was emitted.
    pub fn last_token_at(&self) -> Option<Instant> {
        self.last_token_at
    }

    /// Records when a token was emitted.
    pub fn set_last_token_at(&mut self, at: Instant) {
        self.last_token_at = Some(at);
    }

    /// Its sampling state (for a batched step).
    pub fn sampling_mut(&mut self) -> &mut RowSampling {
        &mut self.sampling
    }

    /// Whether the request rewrites its logits (penalties, biases, grammars).
    pub fn has_processors(&self) -> bool {
        self.sampling.has_processors()
    }

    /// Whether the processors need each token before the next step is built.
    pub fn needs_accepted_token(&self) -> bool {
        self.sampling.needs_accepted_token()
    }

    /// Hands the caches over (to a batch cache).
    pub fn take_caches(&mut self) -> PromptCache {
        std::mem::take(&mut self.caches)
    }

    /// Takes the caches back (a batch could not take them).
    pub fn restore_caches(&mut self, caches: PromptCache) {
        self.caches = caches;
    }

    /// The tokens fed to the model and the caches holding them (for the prompt cache).
    pub fn into_fed_and_caches(self) -> (Vec<u32>, PromptCache) {
        (self.fed, self.caches)
    }

    /// Tokens its caches will hold at this point: the whole prompt and what it
    /// generated (the measure of which sequence a step over the memory limit stops).
    pub fn footprint(&self) -> usize {
        self.job.req.prompt.len() + self.generated
    }

    /// Bytes held by its own caches.
    pub fn nbytes(&self) -> usize {
        self.caches.iter().map(|c| c.nbytes()).sum()
    }

    /// Whether a decoding step is queued (decoding alone).
    pub fn decoding(&self) -> bool {
        self.queued.is_some()
    }

    /// The next prefill chunk: at most `step_size` prompt tokens, never the last one
    /// (empty when only that one is left), and with `segmented` never past the end of
    /// the current segment (mlx-lm's batched prompt processing).
    pub fn next_chunk(&self, step_size: usize, segmented: bool) -> &[u32] {
        let prompt = &self.job.req.prompt;
        let remaining = prompt.len().saturating_sub(self.prompt_done);
        let mut n = step_size.max(1).min(remaining.saturating_sub(1));
        if segmented {
            if let Some(end) = self
                .segment_ends()
                .into_iter()
                .find(|(e, _)| *e > self.prompt_done)
            {
                n = n.min(end.0 - self.prompt_done);
            }
        }
        &prompt[self.prompt_done..self.prompt_done + n]
    }

    /// Where segments end, the last at the last prompt token (which is left for
    /// decoding), with the kind of the cache there.
    fn segment_ends(&self) -> Vec<(usize, CacheKind)> {
        let req = &self.job.req;
        let last = req.prompt.len().saturating_sub(1);
        if req.segments.is_empty() {
            return vec![(last, CacheKind::Assistant)];
        }
        req.segments
            .iter()
            .map(|&(e, k)| (e.min(last), k))
            .collect()
    }

    /// The cache kind when the prompt processed so far ends a segment that this
    /// sequence processed (not one the prompt cache gave it): a checkpoint to store.
    pub fn checkpoint(&self) -> Option<CacheKind> {
        if self.prompt_done <= self.prompt_cached {
            return None;
        }
        self.segment_ends()
            .into_iter()
            .find(|(e, _)| *e >= self.prompt_done)
            .filter(|(e, _)| *e == self.prompt_done)
            .map(|(_, k)| k)
    }

    /// The prompt tokens processed so far.
    pub fn prompt_done(&self) -> &[u32] {
        &self.job.req.prompt[..self.prompt_done]
    }

    /// Whether the prefill's logits are wanted (the request asked for prompt
    /// log-probabilities).
    pub fn wants_prompt_logprobs(&self) -> bool {
        self.job.req.prompt_logprobs
    }

    /// Scores the next `n` prompt tokens from their chunk's logits `[n, vocab]` (the
    /// logits at positions `prompt_done..prompt_done + n`, which predict the tokens one
    /// further on), with mlx-lm's `_score_fn` arithmetic: float32 log-softmax over the
    /// vocabulary, then `take_along_axis` of the next tokens; the `top_logprobs` most
    /// likely ids of each position as mlx-lm's `_format_top_logprobs` picks them. Call
    /// before [`Sequence::advance_prefill`] of the same tokens.
    pub fn score_prefill_chunk(&mut self, logits: &Array, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let req = std::sync::Arc::clone(&self.job.req);
        let start = self.prompt_done + 1;
        let targets = req
            .prompt
            .get(start..start + n)
            .ok_or_else(|| EngineError::Internal("scored a prompt chunk past the prompt".into()))?;
        let t: Vec<i32> = targets.iter().map(|&x| x as i32).collect();
        let t = Array::from_slice(&t, &[n as i32, 1])?;
        let lp = log_softmax(&logits.astype(Dtype::Float32)?, -1)?;
        let picked = lp.take_along_axis(&t, -1)?.squeeze(Some(&[-1]))?;
        let k = req.top_logprobs.min(lp.dim(-1)? as usize);
        let top = if k > 0 {
            let idx = lp.negative()?.argpartition(k as i32 - 1, Some(-1))?.slice(
                &[0, 0],
                &[n as i32, k as i32],
                None,
            )?;
            let vals = lp.take_along_axis(&idx, -1)?;
            Some((idx.astype(Dtype::Uint32)?, vals))
        } else {
            None
        };
        let mut pending = vec![&picked];
        if let Some((i, v)) = &top {
            pending.extend([i, v]);
        }
        transforms::eval(&pending)?;
        let values = picked.to_vec::<f32>()?;
        let (ids, vals) = match &top {
            Some((i, v)) => (i.to_vec::<u32>()?, v.to_vec::<f32>()?),
            None => (Vec::new(), Vec::new()),
        };
        for (j, (&token, logprob)) in targets.iter().zip(values).enumerate() {
            let top = if k > 0 {
                ids[j * k..(j + 1) * k]
                    .iter()
                    .copied()
                    .zip(vals[j * k..(j + 1) * k].iter().copied())
                    .collect()
            } else {
                Vec::new()
            };
            self.prompt_logprobs.push(PromptLogprob {
                token,
                logprob,
                top,
            });
        }
        Ok(())
    }

    /// Once the prompt is processed but for its last token: the outcome to report
    /// (once) for a request that wants its prompt's log-probabilities or no tokens
    /// (`max_tokens` 0, which ends the sequence here).
    pub fn prompt_outcome(&mut self) -> Option<Outcome> {
        let req = &self.job.req;
        let wanted = req.prompt_logprobs || req.max_tokens == 0;
        if !wanted || self.prompt_reported || self.last_prompt_token().is_none() {
            return None;
        }
        self.prompt_reported = true;
        Some(Outcome::Prompt {
            logprobs: std::mem::take(&mut self.prompt_logprobs),
            finish: (req.max_tokens == 0).then_some(Finish::Length),
        })
    }

    /// Counts the next `n` prompt tokens as in the caches (and tells the processors);
    /// returns `(processed, total)` of the uncached prompt.
    pub fn advance_prefill(&mut self, n: usize) -> Result<(usize, usize)> {
        let req = std::sync::Arc::clone(&self.job.req);
        let prompt = &req.prompt;
        let part = prompt
            .get(self.prompt_done..self.prompt_done + n)
            .ok_or_else(|| EngineError::Internal("prefilled past the prompt".into()))?;
        self.sampling.prompt(part)?;
        self.fed.extend_from_slice(part);
        self.prompt_done += n;
        Ok((
            self.prompt_done - self.prompt_cached,
            prompt.len() - self.prompt_cached,
        ))
    }

    /// The last prompt token when it is the only one left (what a sequence joining the
    /// decode batch feeds first).
    pub fn last_prompt_token(&self) -> Option<u32> {
        let prompt = &self.job.req.prompt;
        (self.prompt_done + 1 == prompt.len()).then(|| prompt[self.prompt_done])
    }

    /// Counts the last prompt token as fed to the model (by the decode batch).
    pub fn feed_last_prompt_token(&mut self) {
        if let Some(t) = self.last_prompt_token() {
            self.fed.push(t);
            self.prompt_done += 1;
        }
    }

    /// One step of this sequence alone on `input` (`[1]`).
    fn step_alone(
        &mut self,
        model: &dyn LanguageModel,
        input: &Array,
        kv: Option<KvQuantization>,
    ) -> Result<Queued> {
        let logits = step::forward(model, &input.expand_dims(&[0])?, &mut self.caches, kv)?;
        let mut s = step::sample(&mut [&mut self.sampling], input, &logits, LogSoftmax::Whole)?;
        if let Some((_, e)) = s.failed.pop() {
            return Err(e);
        }
        Ok((s.tokens, s.logprobs.squeeze(Some(&[0]))?))
    }

    /// Decoding alone: one prefill chunk (at most `step_size` tokens, always leaving the
    /// last prompt token), or when only that one is left, the first decoding step.
    pub fn prefill_alone(
        &mut self,
        model: &dyn LanguageModel,
        step_size: usize,
        kv: Option<KvQuantization>,
    ) -> Result<Prefill> {
        let part = self.next_chunk(step_size, false).to_vec();
        if !part.is_empty() {
            let chunk = Array::from_slice(&part, &[1, part.len() as i32])?;
            let logits = step::prefill(model, &chunk, &mut self.caches, kv)?;
            if self.wants_prompt_logprobs() {
                self.score_prefill_chunk(&logits.squeeze(Some(&[0]))?, part.len())?;
            }
            drop(logits);
            mlx_array::memory::clear_cache();
            let (processed, total) = self.advance_prefill(part.len())?;
            return Ok(Prefill::Chunk(processed, total));
        }
        if let Some(o) = self.prompt_outcome() {
            return Ok(Prefill::Prompt(o));
        }
        let req = std::sync::Arc::clone(&self.job.req);
        let rest = &req.prompt[self.prompt_done..];
        let input = Array::from_slice(rest, &[rest.len() as i32])?;
        let (y, lp) = self.step_alone(model, &input, kv)?;
        transforms::async_eval(&[&y, &lp])?;
        self.fed.extend_from_slice(rest);
        self.prompt_done = req.prompt.len();
        self.queued = Some((y, lp));
        Ok(Prefill::Started)
    }

    /// Decoding alone: queues the step after the queued token (pipelining, as
    /// `generate_step` does), unless that token is the last one allowed or the
    /// processors need it first. Returns the arrays to evaluate.
    pub fn queue_next(
        &mut self,
        model: &dyn LanguageModel,
        kv: Option<KvQuantization>,
    ) -> Result<Option<Queued>> {
        let Some((y, _)) = &self.queued else {
            return Ok(None);
        };
        if self.generated + 1 >= self.job.req.max_tokens || self.needs_accepted_token() {
            return Ok(None);
        }
        let y = y.clone();
        Ok(Some(self.step_alone(model, &y, kv)?))
    }

    /// Decoding alone: reads the queued token and moves `next` in; the token's output,
    /// its finish set when it ends the sequence. A sequence whose processors need the
    /// token first builds its next step here, after reading it.
    pub fn emit(
        &mut self,
        model: &dyn LanguageModel,
        kv: Option<KvQuantization>,
        next: Option<Queued>,
    ) -> Result<TokenOut> {
        let (y, lp) = self
            .queued
            .take()
            .ok_or_else(|| EngineError::Internal("no queued token".into()))?;
        let token = step::read_token(&y)?;
        let logprob = if self.job.req.wants_logprobs() {
            Some(step::logprob_of(&lp, token)?)
        } else {
            None
        };
        let top = step::top_logprobs(&lp, self.job.req.top_logprobs)?;
        // With a queued step, the model was fed this token: the caches hold it.
        let fed = next.is_some();
        let out = self.record(token, logprob, top, fed)?;
        self.queued = next;
        if !fed && out.finish.is_none() {
            // The processors wanted this token before the next step.
            let input = Array::from_slice(&[token], &[1])?;
            let (y, lp) = self.step_alone(model, &input, kv)?;
            transforms::async_eval(&[&y, &lp])?;
            self.fed.push(token);
            self.queued = Some((y, lp));
        }
        Ok(out)
    }

    /// Counts `token` (generated earlier) as fed to the model now.
    pub fn push_fed(&mut self, token: u32) {
        self.fed.push(token);
    }

    /// How many tokens were fed to the model (what its caches should hold).
    pub fn fed_len(&self) -> usize {
        self.fed.len()
    }

    /// Tokens it may still generate.
    pub fn remaining(&self) -> usize {
        self.job.req.max_tokens.saturating_sub(self.generated)
    }

    /// Counts a generated token (`fed`: the caches already hold it), tells the
    /// processors, and decides whether it ends the sequence.
    pub fn record(
        &mut self,
        token: u32,
        logprob: Option<f32>,
        top: Vec<(u32, f32)>,
        fed: bool,
    ) -> Result<TokenOut> {
        self.sampling.accept(token)?;
        let dead_end = self.sampling.dead_end();
        Ok(self.record_accepted(token, logprob, top, fed, dead_end))
    }

    /// [`Self::record`] of a token the processors accepted already (the grammar worker
    /// of a decode step, `MLX_MASKS_BESIDE`): `dead_end`, whether a processor reached a
    /// dead end by it (asked right after the accept: the next step's mask, which the
    /// worker may have computed since, can find one that belongs to the next token).
    pub(crate) fn record_accepted(
        &mut self,
        token: u32,
        logprob: Option<f32>,
        top: Vec<(u32, f32)>,
        fed: bool,
        dead_end: bool,
    ) -> TokenOut {
        self.generated += 1;
        if fed {
            self.fed.push(token);
        }
        let mut stop_index = self.stop.advance(token);
        let finish = if dead_end {
            stop_index = None;
            Some(Finish::Constraint)
        } else if stop_index.is_some() {
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
            from_draft: false,
            drafted: 0,
        }
    }
}

//! The decode batch: every sequence past its prefill decodes in one forward pass per step
//! (mlx-lm's `GenerationBatch`), through left-padded batch KV caches with per-row RoPE
//! offsets (`mlx_cache::BatchPromptCache`).
//!
//! A step feeds each row its input (the token sampled for it by the previous step, or
//! for a row that just joined its last prompt token), applies each row's logits
//! processors, takes log-softmax over the batch and samples (one call when the rows
//! share their sampler settings and have no seed, else row by row), queues that
//! evaluation, and only then reads the previous step's tokens (mlx-lm's pipelining).
//! Rows that finish or go away are dropped between steps; newly prefilled sequences are
//! merged in.
use crate::error::ApiError;
use crate::sequence::{mlx_err, top_logprobs, Sequence, TokenOut};
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_cache::{BatchPromptCache, KvCache, PromptCache};
use mlx_models::LanguageModel;

/// The sequences decoding together and their batch caches.
#[derive(Default)]
pub struct DecodeBatch {
    rows: Vec<Sequence>,
    cache: BatchPromptCache,
    /// Rows (a prefix of `rows`) whose output of the last step is not read yet.
    pending_rows: usize,
    /// That output.
    pending: Option<Pending>,
    /// Input tokens of rows that joined since the last step, in row order after the
    /// pending ones.
    joined: Vec<u32>,
}

/// What a step hands back: the tokens read for rows that had one pending
/// `(row, token)`, and the rows whose processors or sampler failed `(row, error)`.
pub type StepOutput = (Vec<(usize, TokenOut)>, Vec<(usize, ApiError)>);

/// The output of a step, read during the next one.
struct Pending {
    /// Sampled tokens `[rows]`.
    tokens: Array,
    /// Log-probabilities `[rows, vocab]`.
    logprobs: Array,
    /// The log-probability of each sampled token `[rows, 1]`, when a row asks for it.
    chosen: Option<Array>,
}

impl Pending {
    fn take_rows(&self, idx: &Array) -> mlx_array::Result<Pending> {
        Ok(Pending {
            tokens: self.tokens.take(idx, Some(0))?,
            logprobs: self.logprobs.take(idx, Some(0))?,
            chosen: match &self.chosen {
                Some(c) => Some(c.take(idx, Some(0))?),
                None => None,
            },
        })
    }
}

/// What to do with a row leaving the batch.
pub enum Leave {
    /// Finished: hand its caches back (for the prompt cache).
    Finished,
    /// Dropped (cancelled or failed).
    Dropped,
}

impl DecodeBatch {
    /// An empty batch.
    pub fn new() -> DecodeBatch {
        DecodeBatch::default()
    }

    /// Rows decoding.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row decodes.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows.
    pub fn rows(&self) -> &[Sequence] {
        &self.rows
    }

    /// Row `i`, mutably.
    pub fn row_mut(&mut self, i: usize) -> Option<&mut Sequence> {
        self.rows.get_mut(i)
    }

    /// Bytes held by the batch caches.
    pub fn nbytes(&self) -> usize {
        self.cache.nbytes()
    }

    /// Adds sequences whose prompt is prefilled but for the last token; their caches are
    /// merged into the batch. On failure the sequences come back with the error.
    pub fn join(&mut self, mut seqs: Vec<Sequence>) -> Result<(), (Vec<Sequence>, ApiError)> {
        if seqs.is_empty() {
            return Ok(());
        }
        let tokens: Option<Vec<u32>> = seqs.iter().map(|s| s.last_prompt_token()).collect();
        let Some(tokens) = tokens else {
            return Err((
                seqs,
                ApiError::internal("a sequence joined before its prefill"),
            ));
        };
        let caches: Vec<PromptCache> = seqs
            .iter_mut()
            .map(|s| std::mem::take(&mut s.caches))
            .collect();
        let merged = {
            let refs: Vec<&[Box<dyn KvCache>]> = caches.iter().map(|c| c.as_slice()).collect();
            BatchPromptCache::merge(&refs)
        };
        if let Err(e) = merged.and_then(|m| self.cache.extend(m)) {
            for (s, c) in seqs.iter_mut().zip(caches) {
                s.caches = c;
            }
            return Err((seqs, cache_err(e)));
        }
        for s in &mut seqs {
            s.feed_last_prompt_token();
        }
        self.rows.extend(seqs);
        self.joined.extend(tokens);
        Ok(())
    }

    /// Adds sequences prefilled together, with their batch caches (rows in the same
    /// order). On failure the sequences come back with the error.
    pub fn join_prefilled(
        &mut self,
        mut seqs: Vec<Sequence>,
        cache: BatchPromptCache,
    ) -> Result<(), (Vec<Sequence>, ApiError)> {
        let tokens: Option<Vec<u32>> = seqs.iter().map(|s| s.last_prompt_token()).collect();
        let Some(tokens) = tokens.filter(|t| t.len() == cache.rows()) else {
            return Err((
                seqs,
                ApiError::internal("a sequence joined before its prefill"),
            ));
        };
        if let Err(e) = self.cache.extend(cache) {
            return Err((seqs, cache_err(e)));
        }
        for s in &mut seqs {
            s.feed_last_prompt_token();
        }
        self.rows.extend(seqs);
        self.joined.extend(tokens);
        Ok(())
    }

    /// Runs one batched forward for every row and reads the previous step's tokens.
    /// Returns the tokens of the rows that had one pending (row index, output) and the
    /// rows whose processors or sampler failed. An `Err` means the step failed for the
    /// whole batch.
    pub fn step(&mut self, model: &dyn LanguageModel) -> Result<StepOutput, ApiError> {
        let mut failed: Vec<(usize, ApiError)> = Vec::new();
        if self.rows.is_empty() {
            return Ok((Vec::new(), failed));
        }
        let b = self.rows.len() as i32;
        let joined = || Array::from_slice(&self.joined, &[self.joined.len() as i32]);
        let inputs = match &self.pending {
            Some(p) if self.joined.is_empty() => Ok(p.tokens.clone()),
            Some(p) => p
                .tokens
                .astype(Dtype::Uint32)
                .and_then(|t| ops::concatenate(&[&t, &joined()?], 0)),
            None => joined(),
        }
        .map_err(mlx_err)?;
        let logits = model
            .forward(
                &inputs.reshape(&[b, 1]).map_err(mlx_err)?,
                self.cache.layers_mut(),
            )
            .map_err(mlx_err)?;
        let v = logits.dim(2).map_err(mlx_err)?;
        let mut logits = logits
            .slice(&[0, 0, 0], &[b, 1, v], None)
            .and_then(|a| a.squeeze(Some(&[1])))
            .map_err(mlx_err)?;
        if self.rows.iter().any(|r| r.has_processors()) {
            logits = self.process(&logits, &inputs, &mut failed)?;
        }
        let lse = logits.logsumexp(Some(&[-1]), true).map_err(mlx_err)?;
        let logprobs = logits.subtract(&lse).map_err(mlx_err)?;
        let sampled = self.sample(&logprobs, &mut failed)?;
        let chosen = if self.rows.iter().any(|r| r.wants_logprobs()) {
            let idx = sampled.reshape(&[b, 1]).map_err(mlx_err)?;
            Some(logprobs.take_along_axis(&idx, -1).map_err(mlx_err)?)
        } else {
            None
        };
        let mut queued = vec![&sampled, &logprobs];
        queued.extend(chosen.as_ref());
        transforms::async_eval(&queued).map_err(mlx_err)?;
        let emitted = self.read_pending(&mut failed)?;
        self.pending = Some(Pending {
            tokens: sampled,
            logprobs,
            chosen,
        });
        self.pending_rows = self.rows.len();
        self.joined.clear();
        Ok((emitted, failed))
    }

    /// Each row's processors on its row of `logits`, with its input token.
    fn process(
        &mut self,
        logits: &Array,
        inputs: &Array,
        failed: &mut Vec<(usize, ApiError)>,
    ) -> Result<Array, ApiError> {
        let v = logits.dim(1).map_err(mlx_err)?;
        let mut parts = Vec::with_capacity(self.rows.len());
        for (e, r) in self.rows.iter_mut().enumerate() {
            let e32 = e as i32;
            let row = logits
                .slice(&[e32, 0], &[e32 + 1, v], None)
                .map_err(mlx_err)?;
            if !r.has_processors() {
                parts.push(row);
                continue;
            }
            let input = inputs.slice(&[e32], &[e32 + 1], None).map_err(mlx_err)?;
            match r.process(&row, &input) {
                Ok(p) => parts.push(p),
                Err(err) => {
                    failed.push((e, err));
                    parts.push(row);
                }
            }
        }
        let refs: Vec<&Array> = parts.iter().collect();
        ops::concatenate(&refs, 0).map_err(mlx_err)
    }

    /// One sampler call for the whole batch when every row samples the same way without
    /// a seed (greedy at temperature 0 is the common case), else one call per row.
    fn sample(
        &mut self,
        logprobs: &Array,
        failed: &mut Vec<(usize, ApiError)>,
    ) -> Result<Array, ApiError> {
        let first = &self.rows[0].job.req.sampling;
        let shared = first.seed.is_none() && self.rows.iter().all(|r| r.job.req.sampling == *first);
        if shared {
            if let Ok(t) = self.rows[0].sample(logprobs) {
                for r in &mut self.rows[1..] {
                    r.seed_draw()?;
                }
                return Ok(t);
            }
        }
        let v = logprobs.dim(1).map_err(mlx_err)?;
        let mut parts = Vec::with_capacity(self.rows.len());
        for (e, r) in self.rows.iter_mut().enumerate() {
            let e32 = e as i32;
            let row = logprobs
                .slice(&[e32, 0], &[e32 + 1, v], None)
                .map_err(mlx_err)?;
            match r.sample(&row) {
                Ok(t) => parts.push(t.astype(Dtype::Uint32).map_err(mlx_err)?),
                Err(err) => {
                    failed.push((e, err));
                    parts.push(Array::from_slice(&[0u32], &[1]).map_err(mlx_err)?);
                }
            }
        }
        let refs: Vec<&Array> = parts.iter().collect();
        ops::concatenate(&refs, 0).map_err(mlx_err)
    }

    /// Reads the previous step's tokens (and log-probabilities where asked for); the
    /// step just queued fed them to the model, so the caches hold them.
    fn read_pending(
        &mut self,
        failed: &mut [(usize, ApiError)],
    ) -> Result<Vec<(usize, TokenOut)>, ApiError> {
        let Some(Pending {
            tokens,
            logprobs,
            chosen,
        }) = self.pending.take()
        else {
            return Ok(Vec::new());
        };
        let n = self.pending_rows;
        let ids = tokens
            .astype(Dtype::Uint32)
            .and_then(|t| t.to_vec::<u32>())
            .map_err(mlx_err)?;
        if ids.len() != n {
            return Err(ApiError::internal(
                "the sampler returned a wrong number of tokens",
            ));
        }
        let chosen = match chosen {
            Some(c) => c
                .astype(Dtype::Float32)
                .and_then(|c| c.to_vec::<f32>())
                .map_err(mlx_err)?,
            None => Vec::new(),
        };
        let v = logprobs.dim(1).map_err(mlx_err)?;
        let mut out = Vec::with_capacity(n);
        for (i, (r, &token)) in self.rows[..n].iter_mut().zip(&ids).enumerate() {
            if failed.iter().any(|(f, _)| *f == i) {
                continue;
            }
            let logprob = if r.wants_logprobs() {
                chosen.get(i).copied()
            } else {
                None
            };
            let k = r.job.req.top_logprobs;
            let top = if k > 0 {
                let i32_ = i as i32;
                let row = logprobs
                    .slice(&[i32_, 0], &[i32_ + 1, v], None)
                    .and_then(|a| a.reshape(&[v]))
                    .map_err(mlx_err)?;
                top_logprobs(&row, k)?
            } else {
                Vec::new()
            };
            out.push((i, r.record(token, logprob, top, true)));
        }
        Ok(out)
    }

    /// Removes rows (any order, no duplicates); finished rows come back with their
    /// caches extracted from the batch, dropped ones without.
    pub fn remove(
        &mut self,
        leaving: Vec<(usize, Leave)>,
    ) -> Result<Vec<(Sequence, Option<PromptCache>)>, ApiError> {
        if leaving.is_empty() {
            return Ok(Vec::new());
        }
        let mut extracted: Vec<(usize, Option<PromptCache>)> = Vec::with_capacity(leaving.len());
        for (i, how) in &leaving {
            let caches = match how {
                Leave::Finished => self.cache.extract(*i).ok(),
                Leave::Dropped => None,
            };
            extracted.push((*i, caches));
        }
        let gone: Vec<usize> = leaving.iter().map(|(i, _)| *i).collect();
        let keep: Vec<usize> = (0..self.rows.len()).filter(|i| !gone.contains(i)).collect();
        self.cache.filter(&keep).map_err(cache_err)?;
        let keep_pending: Vec<usize> = keep
            .iter()
            .copied()
            .filter(|&i| i < self.pending_rows)
            .collect();
        if let Some(p) = self.pending.take() {
            if !keep_pending.is_empty() {
                let idx: Vec<i32> = keep_pending.iter().map(|&i| i as i32).collect();
                let idx = Array::from_slice(&idx, &[idx.len() as i32]).map_err(mlx_err)?;
                self.pending = Some(p.take_rows(&idx).map_err(mlx_err)?);
            }
        }
        let joined_keep: Vec<u32> = keep
            .iter()
            .filter(|&&i| i >= self.pending_rows)
            .map(|&i| self.joined[i - self.pending_rows])
            .collect();
        self.pending_rows = keep_pending.len();
        self.joined = joined_keep;
        let mut rows: Vec<Option<Sequence>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        self.rows = keep.iter().filter_map(|&i| rows[i].take()).collect();
        Ok(extracted
            .into_iter()
            .filter_map(|(i, c)| rows[i].take().map(|s| (s, c)))
            .collect())
    }

    /// Empties the batch, handing every row back (after a failed step).
    pub fn drain(&mut self) -> Vec<Sequence> {
        self.cache = BatchPromptCache::new();
        self.pending = None;
        self.pending_rows = 0;
        self.joined.clear();
        std::mem::take(&mut self.rows)
    }
}

fn cache_err(e: mlx_cache::CacheError) -> ApiError {
    ApiError::unavailable(format!("batching the KV caches failed: {e}"))
}

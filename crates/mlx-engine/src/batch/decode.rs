//! The decode batch: every sequence past its prefill decodes in one forward pass per step
//! (mlx-lm's `GenerationBatch`), through left-padded batch KV caches with per-row RoPE
//! offsets (`mlx_cache::BatchPromptCache`).
//!
//! A step feeds each row its input (the token sampled for it by the previous step, or
//! for a row that just joined its last prompt token) through [`step::forward`] and
//! [`step::sample`] (each row's processors and sampler), queues that evaluation, and
//! only then reads the previous step's tokens (mlx-lm's pipelining). When a row's
//! processors need the accepted token first, the previous tokens are read between the
//! forward and the sampling instead, while the device runs the forward. Rows are
//! removed by id between steps; newly prefilled sequences are merged in.
use super::request::{GenerationRequest, SeqId, TokenOut};
use super::sequence::Sequence;
use super::stage::{keep_in_place, leaving_rows, Leave, Left, Outcome, Stage};
use crate::error::{EngineError, Result};
use crate::profile::{BatchPhase, BatchProfile, Lap};
use crate::step::{self, LogSoftmax, RowSampling};
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_cache::{BatchPromptCache, KvCache, PromptCache};
use mlx_models::LanguageModel;

/// The sequences decoding together and their batch caches.
#[derive(Default)]
pub(crate) struct DecodeBatch {
    rows: Vec<Sequence>,
    cache: BatchPromptCache,
    /// Rows (a prefix of `rows`) whose output of the last step is not read yet.
    pending_rows: usize,
    /// That output.
    pending: Option<Queued>,
    /// Input tokens of rows that joined since the last step, in row order after the
    /// pending ones.
    joined: Vec<u32>,
    /// Host times per step (`MLX_ENGINE_PROFILE`).
    profile: Option<Box<BatchProfile>>,
}

/// The output of a plain step queued on the device, read during the next step (the
/// decode batch's, and a speculating batch's plain steps).
pub(crate) struct Queued {
    /// Sampled tokens, one a row.
    pub tokens: Array,
    /// Log-probabilities `[rows, vocab]`.
    pub logprobs: Array,
    /// The log-probability of each sampled token, one a row, when a row asks for it.
    pub chosen: Option<Array>,
}

/// A token's log-probability and top alternatives, where its request asks for them.
pub(crate) type TokenDetails = (Option<f32>, Vec<(u32, f32)>);

/// A token read from a queued step: its id, log-probability and top alternatives (the
/// last two where its request asks for them).
pub(crate) type ReadToken = (u32, Option<f32>, Vec<(u32, f32)>);

impl Queued {
    /// The rows at `idx`.
    pub fn take_rows(&self, idx: &Array) -> mlx_array::Result<Queued> {
        Ok(Queued {
            tokens: self.tokens.take(idx, Some(0))?,
            logprobs: self.logprobs.take(idx, Some(0))?,
            chosen: match &self.chosen {
                Some(c) => Some(c.take(idx, Some(0))?),
                None => None,
            },
        })
    }

    /// Of a queued step over a batch's first `rows` rows, the rows that stay (`keep`:
    /// the batch's rows that stay, in order; those past `rows` joined since), with their
    /// count; `None` when none stays. They are queued now, behind the step that sampled
    /// them: left unqueued, they would be queued with the next forward (whose input they
    /// are), and reading them would wait for that whole forward.
    pub fn keep_prefix(&self, keep: &[usize], rows: usize) -> Result<Option<(Queued, usize)>> {
        let idx: Vec<i32> = keep
            .iter()
            .filter(|&&i| i < rows)
            .map(|&i| i as i32)
            .collect();
        if idx.is_empty() {
            return Ok(None);
        }
        let kept = self.take_rows(&Array::from_slice(&idx, &[idx.len() as i32])?)?;
        kept.queue()?;
        Ok(Some((kept, idx.len())))
    }

    /// Whether its tokens (and log-probabilities) are computed, so that reading them
    /// does not wait.
    pub fn is_available(&self) -> bool {
        self.tokens.is_available()
            && self.logprobs.is_available()
            && self.chosen.as_ref().is_none_or(Array::is_available)
    }

    /// Queues its evaluation.
    pub fn queue(&self) -> Result<()> {
        let mut queued = vec![&self.tokens, &self.logprobs];
        queued.extend(self.chosen.as_ref());
        transforms::async_eval(&queued)?;
        Ok(())
    }

    /// Waits for the tokens and reads each row's, with what its request (`reqs`, one a
    /// row, in order) asks for.
    pub fn read<'a>(
        &self,
        reqs: impl ExactSizeIterator<Item = &'a GenerationRequest>,
    ) -> Result<Vec<ReadToken>> {
        let ids = step::read_tokens(&self.tokens)?;
        if ids.len() != reqs.len() {
            return Err(EngineError::Internal(
                "the sampler returned a wrong number of tokens".into(),
            ));
        }
        let chosen = match &self.chosen {
            Some(c) => c.astype(Dtype::Float32)?.to_vec::<f32>()?,
            None => Vec::new(),
        };
        let mut out = Vec::with_capacity(ids.len());
        for (i, (req, token)) in reqs.zip(ids).enumerate() {
            let (logprob, top) = token_details(req, &chosen, &self.logprobs, i)?;
            out.push((token, logprob, top));
        }
        Ok(out)
    }
}

/// The log-probability and top log-probabilities `req` asks for of sampled position `i`:
/// `chosen` holds the sampled tokens' log-probabilities (flat, empty when no row asks),
/// `logprobs` is `[positions, vocab]`.
pub(crate) fn token_details(
    req: &GenerationRequest,
    chosen: &[f32],
    logprobs: &Array,
    i: usize,
) -> Result<TokenDetails> {
    let logprob = if req.wants_logprobs() {
        chosen.get(i).copied()
    } else {
        None
    };
    let top = if req.top_logprobs > 0 {
        let (i32_, v) = (i as i32, logprobs.dim(-1)?);
        let row = logprobs
            .slice(&[i32_, 0], &[i32_ + 1, v], None)?
            .reshape(&[v])?;
        step::top_logprobs(&row, req.top_logprobs)?
    } else {
        Vec::new()
    };
    Ok((logprob, top))
}

impl DecodeBatch {
    /// Adds sequences whose prompt is prefilled but for the last token; their own
    /// caches are merged into the batch. On failure the sequences come back.
    pub fn join(&mut self, mut seqs: Vec<Sequence>) -> Result<(), (Vec<Sequence>, EngineError)> {
        if seqs.is_empty() {
            return Ok(());
        }
        let Some(tokens) = seqs.iter().map(|s| s.last_prompt_token()).collect() else {
            return Err((seqs, not_prefilled()));
        };
        if let Err(e) = merge_caches(&mut self.cache, &mut seqs) {
            return Err((seqs, e));
        }
        self.admit(seqs, tokens);
        Ok(())
    }

    /// Adds sequences prefilled together, with their batch caches (rows in the same
    /// order). On failure the sequences come back.
    pub fn join_prefilled(
        &mut self,
        seqs: Vec<Sequence>,
        cache: BatchPromptCache,
    ) -> Result<(), (Vec<Sequence>, EngineError)> {
        let tokens: Option<Vec<u32>> = seqs.iter().map(|s| s.last_prompt_token()).collect();
        let Some(tokens) = tokens else {
            return Err((seqs, not_prefilled()));
        };
        self.join_with_inputs(seqs, cache, tokens)
    }

    /// Adds sequences with their batch caches (rows in the same order), each fed its
    /// `inputs` token first: rows that stepped aside from a speculating batch (their
    /// caches hold their history but that token, which counts as fed already). On
    /// failure the sequences come back.
    pub fn join_with_inputs(
        &mut self,
        seqs: Vec<Sequence>,
        cache: BatchPromptCache,
        inputs: Vec<u32>,
    ) -> Result<(), (Vec<Sequence>, EngineError)> {
        if inputs.len() != seqs.len() || inputs.len() != cache.rows() {
            return Err((seqs, not_prefilled()));
        }
        if let Err(e) = self.cache.extend(cache) {
            return Err((seqs, cache_err(e)));
        }
        self.admit(seqs, inputs);
        Ok(())
    }

    fn admit(&mut self, mut seqs: Vec<Sequence>, tokens: Vec<u32>) {
        // (A no-op for rows past their prompt.)
        for s in &mut seqs {
            s.feed_last_prompt_token();
        }
        self.rows.extend(seqs);
        self.joined.extend(tokens);
    }

    /// Runs one batched forward for every row and reads the previous step's tokens:
    /// the outcomes by id (rows whose processors or sampler failed first). An `Err`
    /// means the step failed for the whole batch.
    ///
    /// With a grammar row, the forward is queued first; while the device runs it, the
    /// host reads the previous tokens, moves each grammar on by its token and computes
    /// every grammar row's mask for this step (a bitset per row), then queues the
    /// sampling with one `where` for the batch: the host's grammar work overlaps the
    /// forward instead of following it. With `MLX_MASKS_BESIDE=1` (opt-in), where the
    /// previous tokens are computed once the forward's graph is built (a host-bound
    /// step: the device finished them while the host built the graph) and at least two
    /// rows have a grammar, they are read before the forward is queued, and one
    /// persistent worker thread moves each grammar on by its token and computes the
    /// masks while this one queues the forward (MLX's encoding of the step), so that
    /// the grammars' work adds no host time to the step (`always`: the worker at every
    /// step, for tests). Session 43 measured a thread started at each step for the
    /// masks alone: they cost twice as much there (the grammars' state in another
    /// core's caches after their accept on this one), no gain; the worker does both.
    /// With `MLX_MASKS_FIRST=1` (opt-in) and no masks beside, where the previous tokens
    /// are computed once the forward's graph is built, the masks are computed on this
    /// thread before the forward is queued, and the sampling's evaluation queues the
    /// forward with it: one evaluation call a step, as without a grammar.
    pub fn step(&mut self, model: &dyn LanguageModel) -> Result<Vec<(SeqId, Outcome)>> {
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        if self.profile.is_none() && crate::profile::enabled() {
            self.profile = Some(Box::default());
        }
        let mut lap = Lap::new(self.profile.is_some());
        let b = self.rows.len() as i32;
        let joined = || Array::from_slice(&self.joined, &[self.joined.len() as i32]);
        let inputs = match &self.pending {
            Some(p) if self.joined.is_empty() => p.tokens.clone(),
            Some(p) => ops::concatenate(&[&p.tokens.astype(Dtype::Uint32)?, &joined()?], 0)?,
            None => joined()?,
        };
        // Each row's resident adapter (pending rows first, then joined ones: `rows` order).
        let adapters: Vec<u32> = self.rows.iter().map(|r| r.job().req.adapter).collect();
        let x = inputs.reshape(&[b, 1])?;
        // Rows whose processors need their last token get it while the forward runs.
        let grammar_rows = self
            .rows
            .iter()
            .filter(|r| r.needs_accepted_token())
            .count();
        let read_first = grammar_rows > 0;
        let mut emitted = Vec::new();
        let mut masks = step::HostMasks::default();
        let logits = mlx_nn::lora::with_row_adapters(&adapters, || {
            step::forward(model, &x, self.cache.layers_mut(), None)
        })?;
        lap.mark(&mut self.profile, BatchPhase::Forward);
        if !read_first && split_eval() {
            transforms::async_eval(&[&logits])?;
            lap.mark(&mut self.profile, BatchPhase::ForwardEval);
        }
        if read_first {
            let vocab = logits.dim(-1)? as usize;
            let ready = || self.pending.as_ref().is_none_or(Queued::is_available);
            let beside = match MasksBeside::from_env() {
                MasksBeside::Off => false,
                MasksBeside::Always => true,
                MasksBeside::WhenReady => grammar_rows >= MASKS_BESIDE_MIN_ROWS && ready(),
            };
            let first = !beside
                && match MasksBeside::first_from_env() {
                    MasksBeside::Off => false,
                    MasksBeside::Always => true,
                    MasksBeside::WhenReady => ready(),
                };
            if first {
                // The masks before the forward is queued: the sampling's evaluation
                // queues both (one `async_eval` a step, as without a grammar).
                emitted = self.read_pending(&mut lap)?;
                let mut rows: Vec<&mut RowSampling> =
                    self.rows.iter_mut().map(|r| r.sampling_mut()).collect();
                masks = step::host_masks(&mut rows, vocab);
                MASKS_FIRST_STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else if beside {
                let read = self.read_pending_tokens(&mut lap)?;
                let (accepted, m) = self.queue_with_masks(&logits, vocab, &read)?;
                masks = m;
                emitted = self.record_read(read, Some(accepted), &mut lap)?;
                MASKS_BESIDE_STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // The masks were computed during the queueing: the profile charges the
                // pair to the forward's `async_eval`.
                lap.mark(&mut self.profile, BatchPhase::ForwardEval);
            } else {
                transforms::async_eval(&[&logits])?;
                lap.mark(&mut self.profile, BatchPhase::ForwardEval);
                emitted = self.read_pending(&mut lap)?;
                let mut rows: Vec<&mut RowSampling> =
                    self.rows.iter_mut().map(|r| r.sampling_mut()).collect();
                masks = step::host_masks(&mut rows, vocab);
            }
            lap.mark(&mut self.profile, BatchPhase::Masks);
        }
        let mut rows: Vec<&mut RowSampling> =
            self.rows.iter_mut().map(|r| r.sampling_mut()).collect();
        let sampled = step::sample_masked(&mut rows, &inputs, &logits, masks, LogSoftmax::PerRow)?;
        let chosen = if self.rows.iter().any(|r| r.job().req.wants_logprobs()) {
            let idx = sampled.tokens.reshape(&[b, 1])?;
            Some(sampled.logprobs.take_along_axis(&idx, -1)?)
        } else {
            None
        };
        lap.mark(&mut self.profile, BatchPhase::Sample);
        let queued = Queued {
            tokens: sampled.tokens,
            logprobs: sampled.logprobs,
            chosen,
        };
        queued.queue()?;
        lap.mark(&mut self.profile, BatchPhase::SampleEval);
        if !read_first {
            emitted = self.read_pending(&mut lap)?;
        }
        let mut out: Vec<(SeqId, Outcome)> = sampled
            .failed
            .into_iter()
            .map(|(i, e)| (self.rows[i].id(), Outcome::Failed(e)))
            .collect();
        out.extend(emitted.into_iter().map(|(id, t)| (id, Outcome::Token(t))));
        self.pending = Some(queued);
        self.pending_rows = self.rows.len();
        self.joined.clear();
        if let Some(line) = self
            .profile
            .as_mut()
            .and_then(|p| p.step(self.rows.len(), grammar_rows))
        {
            eprintln!("{line}");
        }
        Ok(out)
    }

    /// Queues `logits` (MLX encodes the forward on this thread) while the grammar
    /// worker ([`step::accept_and_mask_beside`]) moves each row that was read on by its
    /// token (`read`, the first rows) and computes every row's host mask over `vocab`
    /// tokens (host work only, no MLX call): each read row's accept result and the masks.
    fn queue_with_masks(
        &mut self,
        logits: &Array,
        vocab: usize,
        read: &[ReadToken],
    ) -> Result<(Vec<Result<bool>>, step::HostMasks)> {
        let tokens: Vec<u32> = read.iter().map(|(t, _, _)| *t).collect();
        let mut rows: Vec<&mut RowSampling> =
            self.rows.iter_mut().map(|r| r.sampling_mut()).collect();
        let (accepted, masks, queued) =
            step::accept_and_mask_beside(&mut rows, &tokens, vocab, || {
                transforms::async_eval(&[logits])
            })?;
        queued?;
        Ok((accepted, masks))
    }

    /// Reads the previous step's tokens (and log-probabilities where asked for); the
    /// step being built fed them to the model, so the caches hold them.
    fn read_pending(&mut self, lap: &mut Lap) -> Result<Vec<(SeqId, TokenOut)>> {
        let read = self.read_pending_tokens(lap)?;
        self.record_read(read, None, lap)
    }

    /// The previous step's tokens as read, one for each of its rows (the first
    /// `pending_rows`), nothing recorded yet.
    fn read_pending_tokens(&mut self, lap: &mut Lap) -> Result<Vec<ReadToken>> {
        let Some(queued) = self.pending.take() else {
            return Ok(Vec::new());
        };
        let rows = &self.rows[..self.pending_rows];
        let read = queued.read(rows.iter().map(|r| &*r.job().req))?;
        lap.mark(&mut self.profile, BatchPhase::Wait);
        Ok(read)
    }

    /// Records each read token in its row; `accepted`: the rows' processors were given
    /// their tokens already (by the grammar worker), with these results (whether the
    /// token led to a dead end).
    fn record_read(
        &mut self,
        read: Vec<ReadToken>,
        accepted: Option<Vec<Result<bool>>>,
        lap: &mut Lap,
    ) -> Result<Vec<(SeqId, TokenOut)>> {
        let mut out = Vec::with_capacity(read.len());
        let mut accepted = accepted.map(Vec::into_iter);
        for (r, (token, logprob, top)) in self.rows.iter_mut().zip(read) {
            let done = match accepted.as_mut().map(Iterator::next) {
                None => r.record(token, logprob, top, true)?,
                Some(Some(result)) => r.record_accepted(token, logprob, top, true, result?),
                Some(None) => {
                    return Err(EngineError::Internal(
                        "a read token without its grammar's accept".into(),
                    ))
                }
            };
            out.push((r.id(), done));
        }
        lap.mark(&mut self.profile, BatchPhase::Record);
        Ok(out)
    }

    fn position(&self, id: SeqId) -> Option<usize> {
        self.rows.iter().position(|r| r.id() == id)
    }
}

impl Stage for DecodeBatch {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn nbytes(&self) -> usize {
        self.cache.nbytes()
    }

    fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.rows.iter_mut().find(|r| r.id() == id)
    }

    fn stepping(&self) -> Vec<SeqId> {
        self.rows.iter().map(|r| r.id()).collect()
    }

    fn cancelled(&self) -> Vec<SeqId> {
        self.rows
            .iter()
            .filter(|r| r.job().cancelled())
            .map(|r| r.id())
            .collect()
    }

    /// Finished rows come back with their caches extracted from the batch, dropped ones
    /// without.
    fn remove(&mut self, leaving: &[(SeqId, Leave)]) -> Result<Vec<Left>> {
        let (gone, keep) = leaving_rows(self.rows.len(), leaving, |id| self.position(id));
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let gone: Vec<(usize, Option<PromptCache>)> = gone
            .into_iter()
            .map(|(i, how)| match how {
                Leave::Finished => (i, self.cache.extract(i).ok()),
                Leave::Dropped => (i, None),
            })
            .collect();
        self.cache.filter(&keep).map_err(cache_err)?;
        if let Some(p) = self.pending.take() {
            self.pending = p.keep_prefix(&keep, self.pending_rows)?.map(|(q, _)| q);
        }
        let joined_keep: Vec<u32> = keep
            .iter()
            .filter(|&&i| i >= self.pending_rows)
            .map(|&i| self.joined[i - self.pending_rows])
            .collect();
        self.pending_rows = keep.iter().filter(|&&i| i < self.pending_rows).count();
        self.joined = joined_keep;
        let mut rows = keep_in_place(&mut self.rows, &keep);
        Ok(gone
            .into_iter()
            .filter_map(|(i, caches)| rows[i].take().map(|seq| Left { seq, caches }))
            .collect())
    }

    fn drain(&mut self) -> Vec<Sequence> {
        self.cache = BatchPromptCache::new();
        self.pending = None;
        self.pending_rows = 0;
        self.joined.clear();
        std::mem::take(&mut self.rows)
    }
}

/// Moves the sequences' own caches into `batch` as new rows (in order); on failure
/// each sequence gets its caches back.
pub(crate) fn merge_caches(batch: &mut BatchPromptCache, seqs: &mut [Sequence]) -> Result<()> {
    let caches: Vec<PromptCache> = seqs.iter_mut().map(|s| s.take_caches()).collect();
    let merged = {
        let refs: Vec<&[Box<dyn KvCache>]> = caches.iter().map(|c| c.as_slice()).collect();
        BatchPromptCache::merge(&refs)
    };
    if let Err(e) = merged.and_then(|m| batch.extend(m)) {
        for (s, c) in seqs.iter_mut().zip(caches) {
            s.restore_caches(c);
        }
        return Err(cache_err(e));
    }
    Ok(())
}

fn not_prefilled() -> EngineError {
    EngineError::Internal("a sequence joined the decode batch before its prefill".into())
}

pub(crate) fn cache_err(e: mlx_cache::CacheError) -> EngineError {
    EngineError::Unavailable(format!("batching the KV caches failed: {e}"))
}

/// Where a decode step with grammar rows computes their masks, by one of two switches
/// read at every such step: `MLX_MASKS_BESIDE` (on the grammar worker while the forward
/// is queued) and `MLX_MASKS_FIRST` (on the step's thread before it is queued, one
/// evaluation call for the step).
enum MasksBeside {
    /// Where the previous step's tokens are computed once the forward's graph is built
    /// (and, beside, at least `MASKS_BESIDE_MIN_ROWS` rows have a grammar) (`1`).
    WhenReady,
    /// After the forward is queued, on the step's thread (the default).
    Off,
    /// At every step, waiting for the previous tokens first (`always`: for tests, on a
    /// CPU whose steps rarely find them computed).
    Always,
}

impl MasksBeside {
    fn from_env() -> MasksBeside {
        Self::read("MLX_MASKS_BESIDE")
    }

    /// Whether a decode step with grammar rows (and no masks beside) reads the previous
    /// tokens and computes the masks before the forward is queued, so that the step
    /// makes one evaluation call instead of two (`MLX_MASKS_FIRST`: `1` where the
    /// previous tokens are computed once the forward's graph is built, `always` at every
    /// step, for tests). Off by default (not yet measured on a device): a step bound by
    /// the host saves the second call (~70 us a step on an H100's host, GPU.md session
    /// 43), the masks then being in series with the forward's queueing.
    fn first_from_env() -> MasksBeside {
        Self::read("MLX_MASKS_FIRST")
    }

    fn read(var: &str) -> MasksBeside {
        match std::env::var(var).as_deref() {
            Ok("1") => MasksBeside::WhenReady,
            Ok("always") => MasksBeside::Always,
            _ => MasksBeside::Off,
        }
    }
}

/// The fewest grammar rows whose masks go to the worker: one row's mask (~5-35 us) costs
/// about what handing it over does.
const MASKS_BESIDE_MIN_ROWS: usize = 2;

/// `MLX_DECODE_SPLIT_EVAL=1` (an experiment, off): a step without grammar rows queues
/// its forward before building the sampling, as a step with them does (two evaluation
/// calls a step instead of one; the same graph, the same tokens). Session 47's profile
/// of the 0.5B on an H100 showed the single call of forward and sampling at 1.6-2.0 ms a
/// step where a constrained step's two took 1.3 + 0.03 (different minutes of a noisy
/// run): for an A/B on a quiet device.
fn split_eval() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_DECODE_SPLIT_EVAL").as_deref() == Ok("1"))
}

static MASKS_BESIDE_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many decode steps of this process computed their grammar rows' masks on the
/// grammar worker while the forward was queued (`MLX_MASKS_BESIDE`).
pub fn masks_beside_steps() -> u64 {
    MASKS_BESIDE_STEPS.load(std::sync::atomic::Ordering::Relaxed)
}

static MASKS_FIRST_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many decode steps of this process computed their grammar rows' masks before the
/// forward was queued, in one evaluation with the sampling (`MLX_MASKS_FIRST`).
pub fn masks_first_steps() -> u64 {
    MASKS_FIRST_STEPS.load(std::sync::atomic::Ordering::Relaxed)
}

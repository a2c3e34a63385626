//! mlx-lm's `_step`, written once: the model call on the last position, KV-cache
//! quantization, each row's logits processors, log-softmax and each row's sampler.
//! [`crate::TokenGenerator`] (one sequence), the scheduler's sequences decoding alone
//! and the decode batch all build their steps from [`forward`] and [`sample`], prefill
//! with [`prefill`], and read their tokens back with [`read_tokens`].
//!
//! The two halves are separate so a step can read the previous tokens back between
//! them: a row whose processors need the accepted token before processing
//! ([`RowSampling::needs_accepted_token`]) gets it while the device runs the forward.
use crate::error::{EngineError, Result};
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use mlx_sample::{LogitsParams, LogitsProcessors, Sampler, SamplerParams};

/// Whether this thread's MLX device is a GPU (where steps are bound by the host's work,
/// so a step's time barely grows with its positions and a queued step costs less than a
/// synchronous one).
pub(crate) fn on_gpu() -> bool {
    mlx_array::current_device().is_ok_and(|d| d.kind == mlx_array::DeviceType::Gpu)
}

/// KV-cache quantization (mlx-lm's `--kv-bits`, `--kv-group-size`,
/// `--quantized-kv-start`): caches switch to quantized once their offset reaches `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuantization {
    /// Bits per element.
    pub bits: i32,
    /// Group size.
    pub group_size: i32,
    /// Offset from which caches are quantized.
    pub start: i32,
}

/// Sampling settings of a request (mlx-lm's `make_sampler` arguments plus a seed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// `make_sampler` arguments.
    pub params: SamplerParams,
    /// Per-request seed: sampling is then reproducible whatever else runs.
    pub seed: Option<u64>,
}

/// How log-probabilities are normalized: mlx-lm's `generate_step` reduces over the
/// whole `[1, vocab]` array, its `BatchGenerator` over each row (the two reductions
/// can differ in the last bit, so each path keeps its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSoftmax {
    /// `logits - logsumexp(logits, keepdims=True)`.
    Whole,
    /// `logits - logsumexp(logits, axis=-1, keepdims=True)`.
    PerRow,
}

/// The sampling side of one sequence: its sampler, logits processors and seed.
pub struct RowSampling {
    sampler: Box<dyn Sampler>,
    /// Rows with equal settings and no seed may sample in one call.
    settings: Option<Sampling>,
    processors: LogitsProcessors,
    /// A seeded row's own key sequence (see [`RowSampling::sample`]).
    keys: Option<mlx_array::random::KeyState>,
}

impl RowSampling {
    /// `sampler` (greedy when `None`) and `processors`; never shares a sampler call
    /// with other rows.
    pub fn new(sampler: Option<Box<dyn Sampler>>, processors: LogitsProcessors) -> RowSampling {
        RowSampling {
            sampler: sampler.unwrap_or_else(|| Box::new(mlx_sample::GreedySampler)),
            settings: None,
            processors,
            keys: None,
        }
    }

    /// The sampler of `sampling` (with its own key sequence when it has a seed) and the
    /// processors of `logits` followed by `extra` (each built fresh).
    pub fn from_request(
        sampling: &Sampling,
        logits: &LogitsParams,
        extra: &[std::sync::Arc<dyn mlx_sample::BuildProcessor>],
    ) -> Result<RowSampling> {
        let sampler = mlx_sample::make_sampler(&sampling.params)
            .map_err(|e| EngineError::Invalid(format!("invalid sampling parameters: {e}")))?;
        let mut processors = mlx_sample::make_logits_processors(logits)
            .map_err(|e| EngineError::Invalid(format!("invalid logits parameters: {e}")))?;
        for b in extra {
            processors.push(
                b.build()
                    .map_err(|e| EngineError::Invalid(format!("invalid logits processor: {e}")))?,
            );
        }
        let keys = match sampling.seed {
            Some(seed) => Some(mlx_array::random::KeyState::seeded(seed)?),
            None => None,
        };
        Ok(RowSampling {
            sampler,
            settings: Some(sampling.clone()),
            processors,
            keys,
        })
    }

    /// Whether the row rewrites its logits.
    pub fn has_processors(&self) -> bool {
        !self.processors.is_empty()
    }

    /// Whether the row's processors need each token accepted before the next step
    /// (the row then does not queue a step ahead).
    pub fn needs_accepted_token(&self) -> bool {
        self.processors.needs_accepted_token()
    }

    /// Whether a processor (a constraint) reached a dead end: the sequence ends with
    /// [`crate::batch::Finish::Constraint`].
    pub fn dead_end(&self) -> bool {
        self.processors.dead_end()
    }

    /// Swaps in `processors` (e.g. a [`Self::fork_processors`] copy that drafts or
    /// verifies ahead) and returns the row's own.
    pub fn swap_processors(&mut self, processors: LogitsProcessors) -> LogitsProcessors {
        std::mem::replace(&mut self.processors, processors)
    }

    /// A copy of the row's processors in their current state.
    pub fn fork_processors(&self) -> LogitsProcessors {
        self.processors.fork()
    }

    /// Prompt tokens put into the caches without a sample.
    pub fn prompt(&mut self, tokens: &[u32]) -> Result<()> {
        Ok(self.processors.prompt(tokens)?)
    }

    /// The token the sequence accepted (read back on the host).
    pub fn accept(&mut self, token: u32) -> Result<()> {
        Ok(self.processors.accept(token)?)
    }

    /// A copy in the same state (another sequence continuing from here).
    pub fn fork(&self) -> Result<RowSampling> {
        let sampler = match &self.settings {
            Some(s) => mlx_sample::make_sampler(&s.params)?,
            None => {
                return Err(EngineError::Invalid(
                    "a sampler given as an object cannot be forked".into(),
                ))
            }
        };
        Ok(RowSampling {
            sampler,
            settings: self.settings.clone(),
            processors: self.processors.fork(),
            keys: match &self.keys {
                Some(k) => Some(k.try_clone()?),
                None => None,
            },
        })
    }

    fn process(&mut self, input: &Array, logits: &Array) -> Result<Array> {
        Ok(self.processors.process(input, logits)?)
    }

    /// The host side of a grammar row's step ([`mlx_sample::LogitsProcessors::host_mask`]):
    /// the allowed tokens among `vocab` as a bitset, computed without MLX. `None`: the
    /// row has no such processor, or it is not active this step.
    pub fn host_mask(&mut self, vocab: usize) -> Option<Result<Vec<u32>>> {
        self.processors
            .host_mask(vocab)
            .map(|r| r.map_err(EngineError::from))
    }

    /// [`Self::host_mask`] written into `dst` (`vocab.div_ceil(32)` words): a step's
    /// buffer of every row's mask.
    pub fn host_mask_into(&mut self, vocab: usize, dst: &mut [u32]) -> Option<Result<()>> {
        self.processors
            .host_mask_into(vocab, dst)
            .map(|r| r.map_err(EngineError::from))
    }

    /// Whether the row has a grammar whose mask is its only processing this step.
    fn only_masks(&self) -> bool {
        self.processors.only_masks()
    }

    /// The row's sampler on `logprobs`. A seeded row draws from its own key sequence,
    /// started by `mx.random.seed(seed)` and continued draw after draw, as mlx-lm's
    /// server seeds MLX's global sequence for the request it serves alone: for the
    /// draw it is made the thread's sequence, and the thread's own is put back after
    /// (so other rows' draws are neither disturbed nor disturbing).
    fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        let Some(keys) = &mut self.keys else {
            return Ok(self.sampler.sample(logprobs)?);
        };
        let outside = mlx_array::random::KeyState::save()?;
        keys.restore()?;
        let drawn = self.sampler.sample(logprobs);
        let saved = mlx_array::random::KeyState::save();
        outside.restore()?;
        *keys = saved?;
        Ok(drawn?)
    }

    fn shares_sampler_with(&self, other: &RowSampling) -> bool {
        match (&self.settings, &other.settings) {
            (Some(a), Some(b)) => a.seed.is_none() && a == b,
            _ => false,
        }
    }
}

/// A prefill chunk `tokens` (`[B, L]`) into the caches: the model call (pipelined layer
/// by layer, `mlx_nn::pipeline`), KV-cache quantization when `kv` says so, and
/// evaluation of the caches' state (so the chunk's intermediates can be freed before
/// the next). Returns the chunk's logits `[B, L, vocab]` unevaluated: a caller that
/// drops them never computes them (prompt log-probabilities read them).
pub fn prefill(
    model: &dyn LanguageModel,
    tokens: &Array,
    caches: &mut [Box<dyn KvCache>],
    kv: Option<KvQuantization>,
) -> Result<Array> {
    let logits = {
        let _pipelined = mlx_nn::pipeline::PipelinedPrefill::from_env();
        model.forward(tokens, caches)?
    };
    if let Some(q) = kv {
        mlx_cache::maybe_quantize_kv_cache(caches, q.start, q.group_size, Some(q.bits))?;
    }
    eval_state(caches)?;
    Ok(logits)
}

/// Evaluates the caches' state.
pub fn eval_state(caches: &[Box<dyn KvCache>]) -> Result<()> {
    let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
    Ok(transforms::eval(&state.iter().collect::<Vec<_>>())?)
}

/// The model on `inputs` (`[B, L]`): logits of the last position `[B, vocab]`; the
/// caches are then quantized when `kv` says so.
pub fn forward(
    model: &dyn LanguageModel,
    inputs: &Array,
    caches: &mut [Box<dyn KvCache>],
    kv: Option<KvQuantization>,
) -> Result<Array> {
    Ok(forward_tail(model, inputs, caches, kv, 1)?.squeeze(Some(&[1]))?)
}

/// The model on `inputs` (`[B, L]`): logits of the last `n` positions `[B, n, vocab]`
/// (mlx-lm's `logits[:, -n:, :]`, the verification of speculative decoding); the
/// caches are then quantized when `kv` says so.
pub fn forward_tail(
    model: &dyn LanguageModel,
    inputs: &Array,
    caches: &mut [Box<dyn KvCache>],
    kv: Option<KvQuantization>,
    n: i32,
) -> Result<Array> {
    let logits = model.forward(inputs, caches)?;
    let (b, l, v) = (logits.dim(0)?, logits.dim(1)?, logits.dim(2)?);
    let n = n.clamp(1, l);
    let tail = logits.slice(&[0, l - n, 0], &[b, l, v], None)?;
    if let Some(q) = kv {
        mlx_cache::maybe_quantize_kv_cache(caches, q.start, q.group_size, Some(q.bits))?;
    }
    Ok(tail)
}

/// What [`sample`] queued.
pub struct Sampled {
    /// One token per row `[B]`.
    pub tokens: Array,
    /// Log-probabilities `[B, vocab]`.
    pub logprobs: Array,
    /// Rows whose processors or sampler failed (their token is meaningless).
    pub failed: Vec<(usize, EngineError)>,
}

/// Each row's processors on its logits (with `inputs` `[B]`, the tokens just fed),
/// log-softmax, and each row's sampler: one sampler call for all rows when they share
/// their settings and have no seed (greedy is the common case), else one call per row.
/// A row that fails is reported in [`Sampled::failed`]; the others go on.
pub fn sample(
    rows: &mut [&mut RowSampling],
    inputs: &Array,
    logits: &Array,
    norm: LogSoftmax,
) -> Result<Sampled> {
    sample_masked(rows, inputs, logits, HostMasks::default(), norm)
}

/// [`sample`] with the rows' grammar masks already computed on the host
/// ([`host_masks`]; an empty `masks` computes them here): the rows' other processors
/// run row by row as in [`sample`], then one `where` sets every logit a row's mask
/// forbids to `-inf` for the whole batch (where each row's grammar would have set
/// them: it is the last processor of its row), leaving every other logit's bits
/// alone.
pub fn sample_masked(
    rows: &mut [&mut RowSampling],
    inputs: &Array,
    logits: &Array,
    masks: HostMasks,
    norm: LogSoftmax,
) -> Result<Sampled> {
    let mut failed: Vec<(usize, EngineError)> = Vec::new();
    let logits = if rows.iter().any(|r| r.has_processors()) {
        let masks = if masks.masked.len() == rows.len() {
            masks
        } else if rows.iter().any(|r| r.needs_accepted_token()) {
            let vocab = logits.dim(-1)? as usize;
            host_masks(rows, vocab)
        } else {
            // No grammar row (penalties, a bias): no mask buffer is made for the step,
            // as the decode batch does; a processor's own `process` applies what it
            // forbids.
            HostMasks::none(rows.len())
        };
        process_rows(rows, inputs, logits, masks, &mut failed)?
    } else {
        logits.clone()
    };
    let logprobs = match norm {
        LogSoftmax::Whole => logits.subtract(&logits.logsumexp(None, true)?)?,
        LogSoftmax::PerRow => logits.subtract(&logits.logsumexp(Some(&[-1]), true)?)?,
    };
    let tokens = sample_rows(rows, &logprobs, &mut failed)?;
    Ok(Sampled {
        tokens,
        logprobs,
        failed,
    })
}

/// Every row's grammar mask for a step ([`host_masks`]): one buffer of each row's bitset
/// in row order (`vocab.div_ceil(32)` words a row, all ones for a row without a mask),
/// which the step uploads as it is. `Default` (no rows): [`sample_masked`] computes the
/// masks itself.
#[derive(Debug, Default)]
pub struct HostMasks {
    /// Words a row.
    n: usize,
    /// Every row's words.
    packed: Packed,
    /// Whether each row has a mask this step.
    masked: Vec<bool>,
    /// Rows whose mask could not be computed, with why (their words are all ones).
    failed: Vec<(usize, EngineError)>,
}

impl HostMasks {
    /// No row masked on the host (each row's processors run whole).
    fn none(rows: usize) -> HostMasks {
        HostMasks {
            masked: vec![false; rows],
            ..HostMasks::default()
        }
    }
}

/// Where a step's mask words are.
#[derive(Debug, Default)]
enum Packed {
    /// None computed.
    #[default]
    Nothing,
    /// Written straight into the upload's buffer (`[rows, words, 1]` uint32).
    Upload(Array),
    /// In host memory (computed on a thread that makes no MLX call).
    Host(Vec<u32>),
}

/// Each row's mask into its `n` words of `dst` (`vocab` tokens; all ones for a row
/// without one): which rows have one, and the rows that failed.
fn fill_masks(
    rows: &mut [&mut RowSampling],
    vocab: usize,
    n: usize,
    dst: &mut [u32],
) -> (Vec<bool>, Vec<(usize, EngineError)>) {
    let mut masked = vec![false; rows.len()];
    let mut failed = Vec::new();
    for (i, (r, d)) in rows
        .iter_mut()
        .zip(dst.chunks_exact_mut(n.max(1)))
        .enumerate()
    {
        match r.host_mask_into(vocab, d) {
            None => d.fill(u32::MAX),
            Some(Ok(())) => masked[i] = true,
            Some(Err(e)) => {
                d.fill(u32::MAX);
                failed.push((i, e));
            }
        }
    }
    (masked, failed)
}

/// Every row's grammar mask for this step ([`RowSampling::host_mask_into`]), computed on
/// the host straight into the step's upload array (its one MLX call allocates that
/// array; [`host_masks_apart`] makes none, for another thread). Writing into the upload
/// instead of a bitset a row copied into it took the constrained sampling's host work
/// at 32 rows of a 152k vocabulary from ~0.49 to ~0.42 ms a step on the 2-core CPU
/// (session 43, `examples/constraint_host.rs`). One row after the other: at a 128k vocabulary a grammar's mask
/// takes ~15 us once its lazily built state is warm (benchmarks/RESULTS.md, "CPU
/// structured output"), less than starting a thread. Sharing the rows out to a thread
/// pool was measured slower (session 33-34: 32 rows' masks 0.32-0.35 ms a step against
/// 0.21-0.25 on this project's 2-core CPU; constrained / unconstrained decoding of the
/// 0.5B shape at 32 streams 0.76 against 1.07 on an H100's host) and removed; with
/// `MLX_MASKS_BESIDE=1` the decode batch runs [`host_masks_apart`] on one second thread
/// while it queues the forward (`DecodeBatch::step`, session 42, opt-in).
pub fn host_masks(rows: &mut [&mut RowSampling], vocab: usize) -> HostMasks {
    let n = vocab.div_ceil(32);
    let mut filled = None;
    let upload = Array::from_fill::<u32>(&[rows.len() as i32, n as i32, 1], |dst| {
        filled = Some(fill_masks(rows, vocab, n, dst));
    });
    match (upload, filled) {
        (Ok(a), Some((masked, failed))) => HostMasks {
            n,
            packed: Packed::Upload(a),
            masked,
            failed,
        },
        // No upload buffer (or nothing to fill): the masks in host memory.
        _ => host_masks_apart(rows, vocab),
    }
}

/// [`host_masks`] without any MLX call (the words in host memory, uploaded by the step
/// that uses them): for a thread beside the one queueing MLX's work.
pub fn host_masks_apart(rows: &mut [&mut RowSampling], vocab: usize) -> HostMasks {
    let n = vocab.div_ceil(32);
    let mut words = vec![0u32; n * rows.len()];
    let (masked, failed) = fill_masks(rows, vocab, n, &mut words);
    HostMasks {
        n,
        packed: Packed::Host(words),
        masked,
        failed,
    }
}

/// The persistent thread of [`accept_and_mask_beside`], started at its first use (`None`
/// if it could not be started: the work then runs on the caller's thread).
fn mask_worker() -> Option<&'static rayon_core::ThreadPool> {
    static WORKER: std::sync::OnceLock<Option<rayon_core::ThreadPool>> = std::sync::OnceLock::new();
    WORKER
        .get_or_init(|| {
            rayon_core::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(|_| "mlx-grammar".into())
                .build()
                .ok()
        })
        .as_ref()
}

/// A decode step's grammar work on one persistent worker thread while `beside` runs on
/// this one (the forward's queueing): the first `tokens.len()` rows accept their token
/// ([`RowSampling::accept`]), then every row's mask is written into the step's upload
/// buffer ([`host_masks`]). The same thread does both at every step, so the grammars'
/// state stays in its core's caches (session 43 measured a thread started each step
/// computing the masks at twice the cost, the accept having run on another core).
/// Returns each accepting row's result (whether it reached a dead end by its token, as
/// [`RowSampling::dead_end`] says after its accept and before its mask), the masks and
/// what `beside` returned. The
/// rows' processors run on the worker: a processor whose `accept` or host mask called
/// MLX must not be used here (the crate's grammars make no MLX call). Where the worker
/// or the upload buffer cannot be had, all of it runs on this thread.
pub fn accept_and_mask_beside<R>(
    rows: &mut [&mut RowSampling],
    tokens: &[u32],
    vocab: usize,
    beside: impl FnOnce() -> R,
) -> Result<(Vec<Result<bool>>, HostMasks, R)> {
    let n = vocab.div_ceil(32);
    let mut beside = Some(beside);
    let (mut done, mut side, mut upload) = (None, None, None);
    if let Some(pool) = mask_worker() {
        upload = Array::from_fill::<u32>(&[rows.len() as i32, n as i32, 1], |dst| {
            pool.in_place_scope(|s| {
                let (rows, done) = (&mut *rows, &mut done);
                s.spawn(move |_| {
                    let accepted = accept_rows(rows, tokens);
                    *done = Some((accepted, fill_masks(rows, vocab, n, dst)));
                });
                side = beside.take().map(|f| f());
            });
        })
        .ok();
    }
    // What did not run on the worker (no worker, no upload buffer) runs here, in order.
    let r = match (side, beside) {
        (Some(r), _) => r,
        (None, Some(f)) => f(),
        (None, None) => {
            return Err(EngineError::Internal(
                "the step's queueing beside the grammar work did not run".into(),
            ))
        }
    };
    let (accepted, masks) = match (done, upload) {
        (Some((accepted, (masked, failed))), Some(a)) => {
            let masks = HostMasks {
                n,
                packed: Packed::Upload(a),
                masked,
                failed,
            };
            (accepted, masks)
        }
        (Some((accepted, _)), None) => (accepted, host_masks(rows, vocab)),
        (None, _) => (accept_rows(rows, tokens), host_masks(rows, vocab)),
    };
    Ok((accepted, masks, r))
}

/// The first `tokens.len()` rows each accept their token: whether the row reached a dead
/// end by it ([`RowSampling::dead_end`], asked before its next mask, which may find one
/// more).
fn accept_rows(rows: &mut [&mut RowSampling], tokens: &[u32]) -> Vec<Result<bool>> {
    rows.iter_mut()
        .zip(tokens)
        .map(|(r, &t)| r.accept(t).map(|()| r.dead_end()))
        .collect()
}

fn process_rows(
    rows: &mut [&mut RowSampling],
    inputs: &Array,
    logits: &Array,
    masks: HostMasks,
    failed: &mut Vec<(usize, EngineError)>,
) -> Result<Array> {
    let v = logits.dim(1)?;
    let HostMasks {
        n,
        packed,
        masked,
        failed: mask_failed,
    } = masks;
    failed.extend(mask_failed);
    let rest = |r: &RowSampling, masked: bool| r.has_processors() && !(masked && r.only_masks());
    let processed = if !rows.iter().zip(&masked).any(|(r, &m)| rest(r, m)) {
        logits.clone()
    } else if let ([row], [m], []) = (&mut *rows, masked.as_slice(), failed.as_slice()) {
        if *m {
            row.processors.process_masked(inputs, logits)?
        } else {
            row.process(inputs, logits)?
        }
    } else {
        let mut parts = Vec::with_capacity(rows.len());
        for (e, r) in rows.iter_mut().enumerate() {
            let e32 = e as i32;
            let row = logits.slice(&[e32, 0], &[e32 + 1, v], None)?;
            let m = masked[e];
            if !rest(r, m) || failed.iter().any(|(i, _)| *i == e) {
                parts.push(row);
                continue;
            }
            let input = inputs.slice(&[e32], &[e32 + 1], None)?;
            let done = if m {
                r.processors
                    .process_masked(&input, &row)
                    .map_err(EngineError::from)
            } else {
                r.process(&input, &row)
            };
            match done {
                Ok(p) => parts.push(p),
                Err(err) => {
                    failed.push((e, err));
                    parts.push(row);
                }
            }
        }
        let refs: Vec<&Array> = parts.iter().collect();
        ops::concatenate(&refs, 0)?
    };
    if !masked.iter().any(|&m| m) {
        return Ok(processed);
    }
    let vocab = v as usize;
    if n != vocab.div_ceil(32) {
        return Err(EngineError::Internal(format!(
            "token masks of {n} words a row for {vocab} tokens"
        )));
    }
    // Each row's bitset is in the upload's buffer already (computed into it), or is
    // copied there once from a helper thread's host memory.
    let shape = [rows.len() as i32, n as i32, 1];
    let packed = match packed {
        Packed::Upload(a) => a,
        Packed::Host(w) => Array::from_fill::<u32>(&shape, |dst| dst.copy_from_slice(&w))?,
        Packed::Nothing => {
            return Err(EngineError::Internal(
                "masked rows without mask words".into(),
            ))
        }
    };
    crate::constrain::apply_mask_words(&packed, &processed, vocab)
}

fn sample_rows(
    rows: &mut [&mut RowSampling],
    logprobs: &Array,
    failed: &mut Vec<(usize, EngineError)>,
) -> Result<Array> {
    let Some((first, rest)) = rows.split_first_mut() else {
        return Err(EngineError::Internal("a step with no rows".into()));
    };
    if rest.is_empty() {
        return first.sample(logprobs);
    }
    if rest.iter().all(|r| first.shares_sampler_with(r)) {
        if let Ok(t) = first.sample(logprobs) {
            return Ok(t);
        }
    }
    let v = logprobs.dim(1)?;
    let mut parts = Vec::with_capacity(rows.len());
    for (e, r) in rows.iter_mut().enumerate() {
        let e32 = e as i32;
        let row = logprobs.slice(&[e32, 0], &[e32 + 1, v], None)?;
        match r.sample(&row) {
            Ok(t) => parts.push(t.astype(Dtype::Uint32)?),
            Err(err) => {
                failed.push((e, err));
                parts.push(Array::from_slice(&[0u32], &[1])?);
            }
        }
    }
    let refs: Vec<&Array> = parts.iter().collect();
    Ok(ops::concatenate(&refs, 0)?)
}

/// Each row's sampler on every position of `logits` (`[B, L, vocab]`, rows without
/// logits processors): log-softmax per position, then one sampler call for all rows
/// when they share their settings and have no seed, else one per row (one draw each).
/// Returns `(tokens [B, L] uint32, logprobs [B, L, vocab])`: the verification of a
/// batch of speculating rows.
pub fn sample_positions(rows: &mut [&mut RowSampling], logits: &Array) -> Result<(Array, Array)> {
    let (b, l, v) = (logits.dim(0)?, logits.dim(1)?, logits.dim(2)?);
    let logprobs = logits.subtract(&logits.logsumexp(Some(&[-1]), true)?)?;
    let flat = logprobs.reshape(&[b * l, v])?;
    let Some((first, rest)) = rows.split_first_mut() else {
        return Err(EngineError::Internal("a step with no rows".into()));
    };
    let tokens = if rest.iter().all(|r| first.shares_sampler_with(r)) {
        first.sample(&flat)?.astype(Dtype::Uint32)?
    } else {
        let mut parts = Vec::with_capacity(rows.len());
        for (e, r) in rows.iter_mut().enumerate() {
            let e = e as i32;
            let row = flat.slice(&[e * l, 0], &[(e + 1) * l, v], None)?;
            parts.push(r.sample(&row)?.astype(Dtype::Uint32)?);
        }
        let refs: Vec<&Array> = parts.iter().collect();
        ops::concatenate(&refs, 0)?
    };
    Ok((tokens.reshape(&[b, l])?, logprobs))
}

/// One row's processors on `logits` (`[R, vocab]`) with an explicit token `history`
/// (the row's stored history is neither used nor changed), log-softmax over each row
/// and the row's sampler: mlx-lm's `_process_and_sample` inside
/// `speculative_generate_step`, whose history is its own. `history` is ignored when the
/// row has no processors. Returns `(tokens [R], logprobs [R, vocab])`.
pub fn sample_with_history(
    row: &mut RowSampling,
    history: Option<&Array>,
    logits: &Array,
) -> Result<(Array, Array)> {
    let logits = match history {
        Some(h) if row.has_processors() => row.processors.process_with_history(h, logits)?,
        _ => logits.clone(),
    };
    let logprobs = logits.subtract(&logits.logsumexp(Some(&[-1]), true)?)?;
    let tokens = row.sample(&logprobs)?;
    Ok((tokens, logprobs))
}

/// Reads sampled tokens back to the host (waiting for them).
pub fn read_tokens(tokens: &Array) -> Result<Vec<u32>> {
    let t = if tokens.dtype() == Dtype::Uint32 {
        tokens.clone()
    } else {
        tokens.astype(Dtype::Uint32)?
    };
    Ok(t.to_vec::<u32>()?)
}

/// Reads the one token of a single-row step.
pub fn read_token(tokens: &Array) -> Result<u32> {
    read_tokens(tokens)?
        .first()
        .copied()
        .ok_or_else(|| EngineError::Internal("the sampler returned no token".into()))
}

/// The log-probability of `token` in `logprobs` (`[vocab]`).
pub fn logprob_of(logprobs: &Array, token: u32) -> Result<f32> {
    let idx = Array::from_slice(&[token], &[1])?;
    let v = logprobs.take(&idx, Some(0))?.astype(Dtype::Float32)?;
    v.to_vec::<f32>()?
        .first()
        .copied()
        .ok_or_else(|| EngineError::Internal("empty log-probabilities".into()))
}

/// mlx-lm's `_format_top_logprobs`: `argpartition(-logprobs, kth=n-1)[:n]`, unsorted,
/// as `(id, logprob)` pairs.
pub fn top_logprobs(logprobs: &Array, n: usize) -> Result<Vec<(u32, f32)>> {
    let n = n.min(logprobs.size());
    if n == 0 {
        return Ok(Vec::new());
    }
    let idx = logprobs
        .negative()?
        .argpartition(n as i32 - 1, Some(-1))?
        .slice(&[0], &[n as i32], None)?;
    let vals = logprobs.take(&idx, Some(0))?.astype(Dtype::Float32)?;
    let ids = idx.astype(Dtype::Uint32)?.to_vec::<u32>()?;
    let vals = vals.to_vec::<f32>()?;
    Ok(ids.into_iter().zip(vals).collect())
}

//! Speculative decoding inside continuous batching (mlx-lm's server turns batching off
//! when it loads a draft model; here speculating rows stay batched). Each step:
//!
//! 1. drafts for every row: with the draft model, `k` batched draft forwards (greedy
//!    drafts, the draft model's caches in a batch cache of their own); with prompt
//!    lookup, each row's continuation of its latest n-gram match, padded to the longest;
//! 2. verifies every row in ONE batched target forward over `[y, drafts...]`, each row's
//!    own sampler on every position;
//! 3. accepts per row the drafts up to its first mismatch (`a` drafts) and emits the
//!    target's samples at positions `0..=a`. Up to a row's first mismatch its drafts
//!    equal the target's own samples, so those positions were computed on the right
//!    history. Each row keeps its own `a`: the caches are trimmed to the most any row
//!    kept and each row's rejected positions are rolled in front of it and masked, as
//!    a right-padded prefill chunk is finalized; with the draft model its batch caches
//!    too (each row keeps what it accepted, less the tokens the draft was not fed).
//!    Every emitted token is the target's sample: greedy rows give the tokens they give
//!    without speculation.
//!
//! Invariant between steps: the target caches hold each row's history but its next
//! input `y`; the draft caches hold the same but for the last `lag` tokens, as many for
//! every row after a drafting step (the draft model never saw its own last draft when a
//! row accepted every draft, mlx-lm's `draft_y = [last draft, bonus]`; the other rows
//! then lag by their last kept token too), fed before the next drafts. Plain steps add
//! their tokens to every row's lag, and a prompt whose draft prefill was deferred
//! ([`SpecBatch::deferred_draft_prefill`]) starts its row lagging by all of it, so rows
//! may lag by different counts until the next catch-up feeds them all.
//!
//! Rows with logits processors (an output constraint, penalties, a logit bias)
//! speculate too, as `mlx-generate`'s speculative decoding does
//! ([`crate::speculative`]): the draft model drafts under the row's processors on a
//! fork of them that takes each draft; the verification processes position `i` of the
//! row on another fork that took drafts `0..i`, with the history those drafts make
//! (prompt, generated tokens, drafts before `i`), so every position is masked and
//! penalized as the plain batch would at that token. A draft the constraint rejects
//! ends the row's acceptance there. The row's own processors then take exactly the
//! emitted tokens; rejected drafts never reach them. Other rows' logits are not
//! touched.
//!
//! Only trimmable (standard KV) caches speculate.
//!
//! A row whose drafts are mostly rejected steps aside
//! ([`crate::speculative::AcceptancePolicy`] with the engine's `draft_min_acceptance`):
//! after the step whose round takes its acceptance over the last rounds below the
//! minimum, [`SpecBatch::step_aside`] hands it out with its target caches (its history
//! but `y`, as the invariant says) and its next input `y`, its draft caches dropped;
//! the scheduler has it join the plain decode batch, which feeds it `y` next as it
//! feeds a prefilled sequence its last prompt token.
//!
//! While more rows decode than the engine's `draft_max_batch` (speculating and plain
//! together), speculating rows step aside the same way before their batch steps
//! ([`SpecBatch::over_batch`]): at large batches the verification of `k + 1` positions
//! per row and the draft's steps cost more than plain decoding. This is one-way per
//! request: its draft caches are dropped, so it decodes plainly to its end even when
//! the batch shrinks again (requests that join later speculate).
mod aside;
mod draft;
mod guide;
mod plain;
mod timing;

use guide::Guide;
use plain::Pending;

use super::decode::{cache_err, merge_caches, token_details};
use super::request::{DraftFrom, SeqId};
use super::sequence::Sequence;
use super::stage::{keep_in_place, leaving_rows, Leave, Left, Outcome, Stage};
use super::width::{Acceptance, DraftWidth, Width};
use crate::error::{EngineError, Result};
use crate::profile::{SpecPhase, SpecProfile};
use crate::speculative::{lookup_draft, AcceptancePolicy};
use crate::step;
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_cache::{BatchPromptCache, PromptCache};
use mlx_models::LanguageModel;

/// The longest n-gram prompt lookup matches against a prediction.
const PREDICTION_NGRAM: usize = 3;

/// One speculating sequence.
struct Row {
    seq: Sequence,
    /// The next target input (not in the caches yet).
    y: u32,
    /// `y` is a generated token the sequence has not counted as fed yet.
    y_unfed: bool,
    /// Tokens drafted per round.
    k: usize,
    /// Prompt lookup: the prediction searched.
    reference: Vec<u32>,
    /// Prompt lookup: the tokens generated so far.
    generated: Vec<u32>,
    /// Draft tokens proposed for it so far.
    drafted: u64,
    /// Of those, emitted.
    accepted: u64,
    /// Its acceptance over the last rounds.
    policy: AcceptancePolicy,
    /// Its drafts' acceptance rate, for the width of its batch's steps.
    acceptance: Acceptance,
    /// Why it stops speculating: it leaves at [`SpecBatch::step_aside`].
    aside: Option<Aside>,
}

/// Why a row leaves its speculating batch for the plain decode batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aside {
    /// Its drafts' acceptance fell below the minimum.
    Acceptance,
    /// More rows decoded than `draft_max_batch`.
    BatchSize,
}

/// What one step drafted, accepted and emitted (for the metrics).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Round {
    /// Draft tokens proposed (all rows).
    pub drafted: u64,
    /// Draft tokens emitted (all rows).
    pub accepted: u64,
    /// Rows verified.
    pub rows: u64,
}

/// The speculating sequences, their target batch caches and (with a draft model) the
/// draft model's.
#[derive(Default)]
pub(crate) struct SpecBatch {
    rows: Vec<Row>,
    cache: BatchPromptCache,
    draft_cache: BatchPromptCache,
    /// Per row, the tokens the target caches hold and the draft caches do not yet (as
    /// many for every row but where deferred prompts joined since the last catch-up).
    lag: Vec<Vec<u32>>,
    /// Rows whose acceptance falls below this step aside (0: never).
    min_acceptance: f64,
    /// Rows step aside while more rows than this decode (0: never).
    max_batch: usize,
    /// The rows decoding when [`SpecBatch::over_batch`] last marked rows (for the log).
    running: usize,
    /// Without a draft model (drafts from predictions): the step-time model that picks
    /// each step's width ([`Width`]), made at the first such step.
    width: Option<Width>,
    /// With a draft model: one per row count (a step's drafting costs the draft's
    /// forwards of every row, so the times of one row count do not scale to another).
    model_widths: std::collections::BTreeMap<usize, Width>,
    /// How many drafts a step verifies.
    drafts: DraftWidth,
    /// Whether a draft-model batch times plain steps against its drafting ones and
    /// pipelines them ([`SpecBatch::plain_model_steps`]).
    plain_model_steps: bool,
    /// Whether joining prompts reach the draft model only when the batch drafts again,
    /// where its last step was plain ([`SpecBatch::deferred_draft_prefill`]).
    defer_draft_prefill: bool,
    /// Whether the last step drafted with the draft model.
    last_drafted: bool,
    /// The prefill chunk of the draft model's catch-ups on joined prompts.
    prefill_step: usize,
    /// The number of rows of the last step.
    last_rows: usize,
    /// A prediction batch's plain step whose tokens are not read yet (see
    /// [`SpecBatch::step_plain`]).
    pending: Option<Pending>,
    /// The fastest catch-up of the draft model timed so far, in row-tokens a second
    /// (the lag of its longest row times its rows; from catch-ups of at least
    /// `RATE_MIN_TOKENS`; the fastest, so that a compile stall does not count).
    catch_up_rate: Option<f64>,
    /// The share of the rows' remaining plain decoding time that a catch-up before a
    /// drafting step may take ([`SpecBatch::catch_up_share`]).
    catch_up_share: f64,
    /// Prompts admitted and prefilling that will join the decoding batches, and whether
    /// a catch-up waits for them ([`SpecBatch::expect_joining`]).
    joining: usize,
    hold_for_joining: bool,
    /// Whether a plain batch's try of drafts is its widest step ([`Width::try_widest`]).
    widest_tries: bool,
    /// Whether a draft-model round feeds every row's last draft to the draft model right
    /// behind the verification ([`SpecBatch::eager_feed`]).
    eager_feed: bool,
    /// The draft model's acceptance over every row's rounds (decayed as a row's own),
    /// which rows joining start from where [`SpecBatch::pooled_acceptance`] is on.
    model_acceptance: Acceptance,
    pooled_acceptance: bool,
    /// Whether a step's time counts only once a step of its shape ran before
    /// ([`SpecBatch::first_shapes_untimed`]), and (where it does) the shapes `(draft
    /// model, rows, positions)` that ran.
    first_shapes_untimed: bool,
    shapes_run: std::collections::HashSet<(bool, usize, usize)>,
    /// Per-phase step times (`MLX_ENGINE_PROFILE`).
    profile: Option<Box<SpecProfile>>,
}

/// A draft model's catch-up before a drafting step may take at most this share of the
/// time the rows' remaining tokens take in plain steps: a self-draft saves at most ~30%
/// of them on the H200 (1.4x, GPU.md session 26), and the untried row counts whose
/// catch-ups this bounds are mostly plain there.
pub(crate) const CATCH_UP_SHARE: f64 = 0.25;

/// What a verification forward gave, read back.
struct Verified {
    /// Sampled tokens, `l` a row.
    toks: Vec<u32>,
    /// Their log-probabilities (flat as `toks`) where a row asks for them.
    chosen: Vec<f32>,
    /// Log-probabilities `[rows, l, vocab]`.
    logprobs: Array,
    /// How many of its drafts each row may accept at most (its own, fewer where its
    /// processors rejected one; none where they failed).
    limits: Vec<usize>,
    /// Each row's processors' failure.
    failed: Vec<Option<EngineError>>,
    /// Positions a row.
    l: usize,
    /// The drafts verified, each row's (read back with the tokens where they stayed on
    /// the device).
    drafts: Vec<Vec<u32>>,
}

/// A step's drafts: on the host (prompt lookup, drafts under a row's processors, which
/// take each draft before the next is masked), or the draft model's greedy drafts still
/// on the device, `[rows, k]` (`MLX_DRAFTS_ON_DEVICE`: the verification's input is built
/// from them without reading them first, as `mlx-generate`'s rounds do; read back with
/// the verification's tokens).
pub(super) enum Drafts {
    Host(Vec<Vec<u32>>),
    Device { tokens: Array, k: usize },
}

impl Drafts {
    /// The most drafts of a row.
    fn width(&self) -> usize {
        match self {
            Drafts::Host(d) => d.iter().map(Vec::len).max().unwrap_or(0),
            Drafts::Device { k, .. } => *k,
        }
    }

    /// Whether every row has `k` drafts.
    fn all_of(&self, k: usize) -> bool {
        match self {
            Drafts::Host(d) => d.iter().all(|x| x.len() == k),
            Drafts::Device { k: n, .. } => *n == k,
        }
    }

    /// Row `r`'s number of drafts.
    fn row_len(&self, r: usize) -> usize {
        match self {
            Drafts::Host(d) => d.get(r).map_or(0, Vec::len),
            Drafts::Device { k, .. } => *k,
        }
    }
}

/// Whether the draft model's greedy drafts stay on the device into the verification
/// (`MLX_DRAFTS_ON_DEVICE=1`; read once).
pub(super) fn drafts_on_device() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_DRAFTS_ON_DEVICE").is_ok_and(|v| v == "1"))
}

/// Rows that stepped aside from speculation, to join the plain decode batch.
pub(crate) struct SteppedAside {
    /// The sequences (their fed tokens counting `inputs`, their processors' history
    /// everything before them).
    pub seqs: Vec<Sequence>,
    /// Their target caches, rows in the same order: each holds its history but its
    /// input.
    pub cache: BatchPromptCache,
    /// Each one's next input.
    pub inputs: Vec<u32>,
    /// How many of them left because more rows decoded than `draft_max_batch` (the
    /// others: their drafts' acceptance, or plain rows going back).
    pub over_batch: usize,
    /// How many of them are plain rows that stepped with the prediction batch.
    pub plain: usize,
}

impl SpecBatch {
    /// An empty batch whose rows step aside below `min_acceptance` (0: never) and
    /// while more than `max_batch` rows decode (0: never).
    pub fn new(min_acceptance: f64, max_batch: usize) -> SpecBatch {
        SpecBatch {
            min_acceptance,
            max_batch,
            catch_up_share: CATCH_UP_SHARE,
            ..SpecBatch::default()
        }
    }

    /// A draft model's catch-up on the tokens it lags by (after plain steps, or the
    /// prompts of rows that joined while it stepped plainly) goes ahead of a drafting
    /// step only when its expected time, from the fastest catch-up timed, is at most
    /// `share` of the rows' mean remaining tokens at this row count's plain step time
    /// ([`Width::expect_catch_up`]); 0.25 by default (`MLX_DRAFT_CATCH_UP_SHARE`;
    /// `inf` tries drafting whatever its catch-up costs, as before session 33).
    pub fn catch_up_share(mut self, share: f64) -> SpecBatch {
        self.catch_up_share = share;
        self
    }

    /// Before a step: `n` admitted prompts are prefilling (or queued to) to join the
    /// decoding batches (requests still waiting for a slot do not count: under a long
    /// queue at full concurrency the batch does not grow). While at least as many as
    /// this batch's rows are, a drafting step that
    /// would first feed the draft model its lag (deferred prompts, plain steps' tokens)
    /// is not taken: the batch is about to grow, and the joining rows lag by their
    /// prompts. In a burst the first row drafted alone (its whole prompt fed to the
    /// draft model) while the others waited for their prefill, which the draft model
    /// then took at once too, and at 32 rows, where plain steps are best, the batch
    /// kept trying drafts: 2,298-2,369 tok/s against 3,126-3,263 without a draft model
    /// (GPU.md session 48; on a warm machine, two runs of three rounds, 3,022-3,495 with
    /// the hold but for one round of 2,433 that tried 7 drafts a row, 3,314-3,476 without
    /// it: at par). Only where [`SpecBatch::hold_for_joining`] is on.
    pub fn expect_joining(&mut self, n: usize) {
        self.joining = n;
    }

    /// Whether a catch-up waits while prompts join ([`SpecBatch::expect_joining`]); the
    /// scheduler turns it on (`MLX_DRAFT_JOINING_HOLD=0` turns it off).
    pub fn hold_for_joining(mut self, on: bool) -> SpecBatch {
        self.hold_for_joining = on;
        self
    }

    /// Whether the draft model's width models try the widest step rather than one draft
    /// a row ([`Width::try_widest`]; off by default, `MLX_WIDTH_TRY_WIDEST=1` on).
    pub fn widest_tries(mut self, on: bool) -> SpecBatch {
        self.widest_tries = on;
        self
    }

    /// How many drafts each step verifies (as many as pay by default; see [`Width`]).
    pub fn widths(mut self, drafts: DraftWidth) -> SpecBatch {
        self.drafts = drafts;
        self
    }

    /// A draft-model batch also times a plain step against its drafting ones
    /// ([`Width::timing_plain`]) and queues its plain steps as a prediction batch does,
    /// the draft model lagging by their tokens (a batch of one row catches up in pieces
    /// of [`ONE_ROW_PIECE`]). The scheduler turns it on where the device is a GPU
    /// (`MLX_MODEL_PLAIN_STEPS=0` / `1` overrides): on the H200 (GPU.md, session 31) it
    /// took the echo 8B bf16 with its 4-bit copy from 520.1 to 812.6 tok/s at 8 streams
    /// and from 1,069.5 to 1,347.3 at 32; on the CPU it measured within the noise of
    /// off (session 29), so it stays off there.
    pub fn plain_model_steps(mut self, on: bool) -> SpecBatch {
        self.plain_model_steps = on;
        self
    }

    /// A draft-model round feeds every row's last draft to the draft model right behind
    /// the verification (queued after it, so it runs while the host reads the
    /// verification's tokens), as the single-sequence generator's eager feed does
    /// (`MLX_DRAFT_EAGER_FEED`, [`crate::speculative`]): the rows then keep what they
    /// accepted of it, and no row lags into the next round's first draft step, which
    /// feeds one token a row instead of two after a round some row accepted in full.
    /// Off by default (`MLX_DRAFT_EAGER_FEED=1` turns it on for the server's batch): not
    /// measured on a device yet. The emitted tokens are the target's either way.
    pub fn eager_feed(mut self, on: bool) -> SpecBatch {
        self.eager_feed = on;
        self
    }

    /// A row joining a draft-model batch starts from the acceptance the draft model had
    /// in the batch's rounds so far, not from the fixed prior (0.7). A row's rate is
    /// learned only from rounds that draft for it, and drafts are tried rarely while the
    /// batch steps plainly, so from the prior a well-matched draft may never
    /// be found to pay (the echo 8B with its 4-bit copy on an H100, session 41: one
    /// stream's requests drafted once each, 1 of 1 accepted, and decoded at the plain
    /// server's speed); the draft model's pooled acceptance carries what earlier rows
    /// showed to the next ones. Widths only: every row's tokens are the target's. The
    /// server's batch turns it on (`MLX_DRAFT_POOLED_ACCEPTANCE=0` off): session 47's
    /// trace of the width on an H100 showed the trap (a request starting from the prior
    /// tried one draft, reached 0.88, where seven drafts were worth 0.126 tokens a ms
    /// against plain's 0.128, and stepped plainly to its end, the first request having
    /// accepted every draft), and on the CPU with a useless draft the pooled start was
    /// no slower (benchmarks/runs/2026-12-07-session47/cpu_pooled_ab.txt). Off where a
    /// batch is built without it.
    pub fn pooled_acceptance(mut self, on: bool) -> SpecBatch {
        self.pooled_acceptance = on;
        self
    }

    /// The first step of each shape (draft model or not, rows, positions) is not timed
    /// for the width: it may compile kernels for its shapes (MLX's CUDA backend builds
    /// a kernel the first time a process meets a shape it specializes on, tens to
    /// hundreds of ms, below the width's stall bound of 1 s), and a drafting size's
    /// time, however old, stands for it until it is timed again, so one such step
    /// could keep the batch plain for good. Off by default
    /// (`MLX_WIDTH_FIRST_SHAPES_UNTIMED=1` turns it on for the server's batches): not
    /// measured on a device yet.
    pub fn first_shapes_untimed(mut self, on: bool) -> SpecBatch {
        self.first_shapes_untimed = on;
        self
    }

    /// With plain steps timed and queued ([`SpecBatch::plain_model_steps`]), prompts
    /// that join while the batch steps plainly are not prefilled into the draft model:
    /// each row lags by its prompt, which the draft model is fed when the batch drafts
    /// again (the rows' unequal lags in right-padded chunks), so a batch that stays
    /// plain never runs the draft model. Prompts that join a drafting batch are
    /// prefilled at once, as before (fed later, they would pad every row's catch-up to
    /// their length). Draft models whose padded prefill is not exact (recurrent
    /// layers) always prefill at once. The scheduler turns it on with plain steps
    /// (`MLX_DRAFT_PREFILL=eager` turns it off).
    pub fn deferred_draft_prefill(mut self, on: bool) -> SpecBatch {
        self.defer_draft_prefill = on;
        self
    }

    /// Adds sequences whose prompt is prefilled but for the last token, with their
    /// target caches (`cache`: a batch of them in order, or `None` when each holds its
    /// own). With `draft`, each prompt but its last token is prefilled into new draft
    /// caches (the draft model is small; the prompt cache keeps only target caches). On
    /// failure the sequences come back.
    pub fn join(
        &mut self,
        mut seqs: Vec<Sequence>,
        cache: Option<BatchPromptCache>,
        draft: Option<&dyn LanguageModel>,
        prefill_step: usize,
    ) -> Result<(), (Vec<Sequence>, EngineError)> {
        if seqs.is_empty() {
            return Ok(());
        }
        let Some(ys) = seqs
            .iter()
            .map(|s| s.last_prompt_token())
            .collect::<Option<Vec<u32>>>()
        else {
            return Err((
                seqs,
                EngineError::Internal("a sequence speculated before its prefill".into()),
            ));
        };
        self.prefill_step = prefill_step.max(1);
        let deferred = draft.is_some_and(|d| {
            self.plain_model_steps
                && self.defer_draft_prefill
                && !self.last_drafted
                && d.padded_prefill_is_exact()
        });
        let drafted = match draft {
            Some(d) if deferred => match draft::empty_draft_rows(d, seqs.len()) {
                Ok(c) => Some(c),
                Err(e) => return Err((seqs, e)),
            },
            Some(d) => match self.draft_prefill(d, &seqs) {
                Ok(c) => Some(c),
                Err(e) => return Err((seqs, e)),
            },
            None => None,
        };
        let joined = match cache {
            Some(c) => self.cache.extend(c).map_err(cache_err),
            None => merge_caches(&mut self.cache, &mut seqs),
        };
        if let Err(e) = joined {
            return Err((seqs, e));
        }
        if let Some(c) = drafted {
            if let Err(e) = self.draft_cache.extend(c) {
                // The target rows went in: the batch no longer matches its caches.
                return Err((seqs, cache_err(e)));
            }
        }
        for (mut seq, y) in seqs.into_iter().zip(ys) {
            // A deferred prompt: the draft model lags by all of it but `y`.
            let lagging = match deferred {
                true => {
                    let prompt = &seq.job().req.prompt;
                    prompt[..prompt.len().saturating_sub(1)].to_vec()
                }
                false => Vec::new(),
            };
            seq.feed_last_prompt_token();
            let spec = seq.job().req.speculate.clone();
            let model_row = matches!(&spec, Some(s) if matches!(s.from, DraftFrom::DraftModel));
            let (k, reference) = match spec {
                Some(s) => (
                    s.num_draft_tokens.max(1),
                    match s.from {
                        DraftFrom::Prediction(p) => p,
                        DraftFrom::DraftModel => Vec::new(),
                    },
                ),
                // A plain row stepping with the prediction batch: no drafts.
                None => (0, Vec::new()),
            };
            let acceptance = match model_row && self.pooled_acceptance {
                true => self.model_acceptance,
                false => Acceptance::default(),
            };
            self.rows.push(Row {
                seq,
                y,
                y_unfed: false,
                k,
                reference,
                generated: Vec::new(),
                drafted: 0,
                accepted: 0,
                policy: AcceptancePolicy::new(self.min_acceptance),
                acceptance,
                aside: None,
            });
            if draft.is_some() {
                self.lag.push(lagging);
            }
        }
        Ok(())
    }

    /// One speculative step of every row: the outcomes by id and what was drafted. An
    /// `Err` means the step failed for the whole batch.
    pub fn step(
        &mut self,
        model: &dyn LanguageModel,
        draft: Option<&dyn LanguageModel>,
    ) -> Result<(Vec<(SeqId, Outcome)>, Round)> {
        if self.rows.is_empty() {
            return Ok((Vec::new(), Round::default()));
        }
        let b = self.rows.len();
        if self.profile.is_none() && crate::profile::enabled() {
            self.profile = Some(Box::default());
        }
        if let Some(p) = self.profile.as_mut() {
            p.begin();
        }
        let mut flushed = Vec::new();
        if let Some(p) = self.pending.take() {
            // Plain again whatever the last tokens draft: queue the step before reading
            // them. (Rows the scheduler routes the last tokens to cannot have finished
            // yet: they finish when those tokens are read.)
            if self.may_pipeline(draft.is_some()) && self.stays_plain(draft.is_some()) {
                return self.step_plain(model, Some(p));
            }
            flushed = self.read_pending(p, false)?;
            self.mark(SpecPhase::Flush);
            // A row the last tokens ended must not step again before it leaves.
            let ended = flushed
                .iter()
                .any(|(_, o)| !matches!(o, Outcome::Token(t) if t.finish.is_none()));
            if ended {
                return Ok((flushed, Round::default()));
            }
        }
        // At most `remaining - 1` drafts, so a round's tokens never pass `max_tokens`.
        let caps: Vec<usize> = self
            .rows
            .iter()
            .map(|r| r.k.min(r.seq.remaining().saturating_sub(1)))
            .collect();
        // A batch whose width follows its step times times each step alone: what is
        // queued before it (the plain batch's step, a prefill chunk) finishes first. A
        // draft model's step is timed from its drafting.
        let timed = self.drafts == DraftWidth::Paying;
        if timed && draft.is_some() {
            mlx_array::current_stream().synchronize()?;
        }
        let mut started = std::time::Instant::now();
        let mut lagged = 0;
        let (drafts, lens): (Drafts, Vec<usize>) = match draft {
            Some(d) => {
                // Drafting costs the draft model's forwards: as many drafts as pay for
                // them and their positions, by this row count's step times.
                let w = self.choose_width(true, &caps);
                let lens: Vec<usize> = caps.iter().map(|&c| c.min(w)).collect();
                let k = lens.iter().copied().max().unwrap_or(0);
                self.mark(SpecPhase::Before);
                if k > 0 {
                    started = self.catch_up_timed(d, started, timed)?;
                    self.mark(SpecPhase::CatchUp);
                }
                self.last_drafted = k > 0;
                // Tokens the draft caches lag by (fed with this round's first draft step).
                lagged = self.lag.first().map_or(0, Vec::len);
                (self.draft_with_model(d, k, &lens)?, lens)
            }
            None => {
                let mut d: Vec<Vec<u32>> = self
                    .rows
                    .iter()
                    .zip(&caps)
                    .map(|(r, &cap)| r.lookup(cap))
                    .collect();
                // Drafts from predictions cost nothing to make: verify as many as pay
                // for their positions (see `Width`).
                let avail: Vec<usize> = d.iter().map(Vec::len).collect();
                let w = self.choose_width(false, &avail);
                for x in &mut d {
                    x.truncate(w);
                }
                let lens = d.iter().map(Vec::len).collect();
                (Drafts::Host(d), lens)
            }
        };
        let k = drafts.width();
        let known = match self.drafts {
            DraftWidth::Paying => self
                .width_of(draft.is_some(), b)
                .is_some_and(|w| w.knows_plain(b)),
            _ => true,
        };
        if k == 0 && known && self.may_pipeline(draft.is_some()) {
            let (mut out, round) = self.step_plain(model, None)?;
            flushed.append(&mut out);
            return Ok((flushed, round));
        }
        if k == 0 {
            // The target alone takes `y`: the draft model now lags by it too.
            for (l, r) in self.lag.iter_mut().zip(&self.rows) {
                l.push(r.y);
            }
        }
        let l = k + 1;
        if timed && draft.is_none() {
            mlx_array::current_stream().synchronize()?;
            started = std::time::Instant::now();
        }
        self.mark(SpecPhase::Before);
        // Every row's last draft fed right behind the verification (every row drafted
        // `k`: the draft model's rounds draft as many for each).
        let eager = draft.filter(|_| self.eager_feed && k > 0 && drafts.all_of(k));
        let mut ver = self.verify(model, drafts, &lens, k, eager)?;
        let drafts = std::mem::take(&mut ver.drafts);
        // Each row keeps its own acceptance: its drafts up to the first that is not the
        // target's own sample.
        let keep: Vec<usize> = (0..b)
            .map(|r| {
                (0..ver.limits[r])
                    .take_while(|&i| ver.toks[r * l + i] == drafts[r][i])
                    .count()
            })
            .collect();
        let most = keep.iter().copied().max().unwrap_or(0);
        // The target caches hold `y` and every row's `k` drafts: keep `y` and `most`,
        // then roll each row's rejected positions in front of it, where they are
        // masked (as a right-padded prefill chunk is finalized).
        mlx_cache::trim_prompt_cache(self.cache.layers_mut(), (k - most) as i32);
        roll_rejected(&mut self.cache, &keep, most, 1)?;
        if draft.is_some() && k > 0 {
            self.keep_drafted(&keep, &drafts, k, lagged, eager.is_some())?;
        }
        if timed {
            self.time_verification(
                draft.is_some(),
                b * l,
                keep.iter().any(|&a| a != most),
                started,
            )?;
        }
        self.mark(SpecPhase::Keep);
        tracing::trace!(
            "speculative: {b} row(s) of {l} position(s) verified in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        let round = self.emit(ver, &keep, &lens, draft.is_some() && k > 0, &mut flushed)?;
        self.mark(SpecPhase::Emit);
        self.end_profile(l);
        Ok((flushed, round))
    }

    /// Adds the time since the last mark to `phase` of this step's profile.
    fn mark(&mut self, phase: SpecPhase) {
        if let Some(p) = self.profile.as_mut() {
            p.mark(phase);
        }
    }

    /// Whether this step's profile waits for each forward (`MLX_ENGINE_PROFILE=sync`).
    fn profile_sync(&self) -> bool {
        self.profile.is_some() && crate::profile::sync()
    }

    /// Ends this step's profile (`l` positions a row), printing the summary when due.
    fn end_profile(&mut self, l: usize) {
        let b = self.rows.len();
        if let Some(line) = self.profile.as_mut().and_then(|p| p.end(b, l)) {
            eprintln!("{line}");
        }
    }

    /// The verification forward over every row's `[y, drafts...]` (`k` positions after
    /// `y`, shorter rows padded), each position processed as the row would at that token
    /// and sampled by the row's sampler; waits for the tokens. With `eager`, the draft
    /// model's forward of every row's last draft is queued behind it
    /// ([`SpecBatch::eager_feed`]).
    fn verify(
        &mut self,
        model: &dyn LanguageModel,
        drafts: Drafts,
        lens: &[usize],
        k: usize,
        eager: Option<&dyn LanguageModel>,
    ) -> Result<Verified> {
        let b = self.rows.len();
        let l = k + 1;
        let input = match &drafts {
            Drafts::Host(drafts) => {
                let mut flat = Vec::with_capacity(b * l);
                for (r, d) in self.rows.iter().zip(drafts) {
                    flat.push(r.y);
                    flat.extend_from_slice(d);
                    // Padding (never accepted: a row accepts at most its own drafts).
                    flat.extend(std::iter::repeat_n(r.y, k - d.len()));
                }
                Array::from_slice(&flat, &[b as i32, l as i32])?
            }
            Drafts::Device { tokens, .. } => {
                let ys: Vec<u32> = self.rows.iter().map(|r| r.y).collect();
                let ys = Array::from_slice(&ys, &[b as i32, 1])?;
                ops::concatenate(&[&ys, tokens], 1)?
            }
        };
        let logits = step::forward_tail(model, &input, self.cache.layers_mut(), None, l as i32)?;
        if self.profile_sync() {
            transforms::eval(&[&logits])?;
        }
        self.mark(SpecPhase::VerifyForward);
        // How many of its drafts each row may accept at most (its own, then fewer when
        // its processors reject one); rows whose processors failed accept none.
        let mut limits: Vec<usize> = (0..b).map(|r| lens[r].min(drafts.row_len(r))).collect();
        let mut failed: Vec<Option<EngineError>> = (0..b).map(|_| None).collect();
        let logits = if self.rows.iter().any(|r| r.seq.has_processors()) {
            let v = logits.dim(2)?;
            let mut parts = Vec::with_capacity(b);
            for (r, row) in self.rows.iter_mut().enumerate() {
                let r32 = r as i32;
                let own = logits
                    .slice(&[r32, 0, 0], &[r32 + 1, l as i32, v], None)?
                    .reshape(&[l as i32, v])?;
                if !row.seq.has_processors() {
                    parts.push(own);
                    continue;
                }
                // Rows with processors draft on the host (`draft_with_model`): a row
                // drafted on the device has none to verify under them.
                let host = match &drafts {
                    Drafts::Host(d) => &d[r][..limits[r]],
                    Drafts::Device { .. } => &[][..],
                };
                match Guide::new(row).verify(&own, host) {
                    Ok((p, n)) => {
                        limits[r] = n;
                        parts.push(p);
                    }
                    Err(e) => {
                        limits[r] = 0;
                        failed[r] = Some(e);
                        parts.push(own);
                    }
                }
            }
            let refs: Vec<&Array> = parts.iter().collect();
            ops::stack(&refs, 0)?
        } else {
            logits
        };
        let mut samplers: Vec<&mut step::RowSampling> =
            self.rows.iter_mut().map(|r| r.seq.sampling_mut()).collect();
        let (tokens, logprobs) = step::sample_positions(&mut samplers, &logits)?;
        let wants = self.rows.iter().any(|r| r.seq.job().req.wants_logprobs());
        let chosen = if wants {
            let idx = tokens.reshape(&[b as i32, l as i32, 1])?;
            Some(logprobs.take_along_axis(&idx, -1)?)
        } else {
            None
        };
        let mut pending = vec![&tokens];
        pending.extend(chosen.as_ref());
        if let Drafts::Device { tokens, .. } = &drafts {
            pending.push(tokens);
        }
        if let Some(d) = eager {
            transforms::async_eval(&pending)?;
            let input = match &drafts {
                Drafts::Host(drafts) => {
                    let last: Vec<u32> = drafts.iter().filter_map(|x| x.last().copied()).collect();
                    Array::from_slice(&last, &[b as i32, 1])?
                }
                Drafts::Device { tokens, k } => {
                    let k = *k as i32;
                    tokens.slice(&[0, k - 1], &[b as i32, k], None)?
                }
            };
            let fed = step::forward(d, &input, self.draft_cache.layers_mut(), None)?;
            transforms::async_eval(&[&fed])?;
        }
        self.mark(SpecPhase::VerifySample);
        transforms::eval(&pending)?;
        let toks = step::read_tokens(&tokens)?;
        if toks.len() != b * l {
            return Err(EngineError::Internal(
                "the sampler returned a wrong number of tokens".into(),
            ));
        }
        let chosen = match chosen {
            Some(c) => c.astype(Dtype::Float32)?.to_vec::<f32>()?,
            None => Vec::new(),
        };
        let drafts = match drafts {
            Drafts::Host(d) => d,
            Drafts::Device { tokens, k } => {
                let flat = step::read_tokens(&tokens)?;
                if flat.len() != b * k {
                    return Err(EngineError::Internal(
                        "the draft model returned a wrong number of drafts".into(),
                    ));
                }
                flat.chunks(k).map(<[u32]>::to_vec).collect()
            }
        };
        self.mark(SpecPhase::VerifyWait);
        Ok(Verified {
            toks,
            chosen,
            logprobs,
            limits,
            failed,
            l,
            drafts,
        })
    }

    /// Records each row's verified tokens (the kept drafts, then the target's own
    /// sample), its acceptance and its next input, appending the outcomes to `out`;
    /// `model_round`: drafted by the draft model (a row may then step aside).
    fn emit(
        &mut self,
        ver: Verified,
        keep: &[usize],
        lens: &[usize],
        model_round: bool,
        out: &mut Vec<(SeqId, Outcome)>,
    ) -> Result<Round> {
        let Verified {
            toks,
            chosen,
            logprobs,
            mut failed,
            l,
            ..
        } = ver;
        let b = self.rows.len();
        // One row a position, as the sampled tokens are laid out.
        let positions = logprobs.reshape(&[-1, logprobs.dim(2)?])?;
        out.reserve(b * (keep.iter().copied().max().unwrap_or(0) + 1));
        let mut round = Round {
            rows: b as u64,
            ..Round::default()
        };
        for (r, row) in self.rows.iter_mut().enumerate() {
            if row.y_unfed {
                row.seq.push_fed(row.y);
            }
            round.drafted += lens[r] as u64;
            row.drafted += lens[r] as u64;
            row.acceptance.record(lens[r], keep[r]);
            if model_round {
                self.model_acceptance.record(lens[r], keep[r]);
            }
            // A row drafting from its prediction never steps aside for its acceptance:
            // its drafts cost nothing and the width leaves them out when they do not
            // pay, while a row aside would cost a forward of its own each step.
            // (A step that drafted for no row by its width is no round.)
            if model_round && row.policy.record(lens[r], keep[r]).is_some() {
                row.aside.get_or_insert(Aside::Acceptance);
            }
            if let Some(e) = failed[r].take() {
                out.push((row.seq.id(), Outcome::Failed(e)));
                row.y = toks[r * l];
                row.y_unfed = true;
                continue;
            }
            let req = std::sync::Arc::clone(&row.seq.job().req);
            let m = keep[r];
            for i in 0..=m {
                let token = toks[r * l + i];
                let (logprob, top) = token_details(&req, &chosen, &positions, r * l + i)?;
                let mut t = match row.seq.record(token, logprob, top, i < m) {
                    Ok(t) => t,
                    Err(e) => {
                        out.push((row.seq.id(), Outcome::Failed(e)));
                        break;
                    }
                };
                t.from_draft = i < m;
                t.drafted = if i == 0 { lens[r] } else { 0 };
                round.accepted += u64::from(i < m);
                row.accepted += u64::from(i < m);
                row.generated.push(token);
                let done = t.finish.is_some();
                out.push((row.seq.id(), Outcome::Token(t)));
                if done {
                    break;
                }
            }
            row.y = toks[r * l + keep[r]];
            row.y_unfed = true;
        }
        Ok(round)
    }

    fn position(&self, id: SeqId) -> Option<usize> {
        self.rows.iter().position(|r| r.seq.id() == id)
    }

    /// Keeps the rows at `keep` (the target cache already holds just those) with their
    /// draft caches and lags; returns every row as it was indexed, the kept ones taken.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<Vec<Option<Row>>> {
        if let Some(p) = self.pending.take() {
            // The pending rows are a prefix: the kept ones stay one, in order.
            self.pending = p
                .out
                .keep_prefix(keep, p.rows)?
                .map(|(out, rows)| Pending { rows, out });
        }
        if !self.lag.is_empty() {
            self.draft_cache.filter(keep).map_err(cache_err)?;
            self.lag = keep.iter().map(|&i| self.lag[i].clone()).collect();
        }
        let rows = keep_in_place(&mut self.rows, keep);
        if self.rows.is_empty() {
            self.cache = BatchPromptCache::new();
            self.draft_cache = BatchPromptCache::new();
            self.lag.clear();
        }
        Ok(rows)
    }
}

/// Rolls each row's positions past its `kept[r]` of a chunk (the batch holds `most` of
/// it for every row, after `before` positions of the same chunk) in front of the row,
/// where they are masked: the finalization of a right-padded prefill chunk.
fn roll_rejected(
    cache: &mut BatchPromptCache,
    kept: &[usize],
    most: usize,
    before: usize,
) -> Result<()> {
    if kept.iter().all(|&a| a == most) {
        return Ok(());
    }
    let pad: Vec<i32> = kept.iter().map(|&a| (most - a) as i32).collect();
    let lengths: Vec<i32> = kept.iter().map(|&a| (a + before) as i32).collect();
    cache
        .prepare_right_padding(&lengths, &pad)
        .map_err(cache_err)?;
    cache.finalize().map_err(cache_err)
}

impl Row {
    /// Prompt lookup: up to `cap` drafts, from the prediction first (its start while
    /// nothing is generated), then from the prompt and the text so far.
    fn lookup(&self, cap: usize) -> Vec<u32> {
        if cap == 0 {
            return Vec::new();
        }
        let mut d = if self.reference.is_empty() {
            Vec::new()
        } else if self.generated.is_empty() {
            self.reference[..cap.min(self.reference.len())].to_vec()
        } else {
            lookup_draft(&self.reference, &self.generated, PREDICTION_NGRAM, cap)
        };
        if d.is_empty() && self.reference.is_empty() {
            let mut all = self.seq.job().req.prompt.clone();
            all.extend_from_slice(&self.generated);
            d = lookup_draft(&all, &all, PREDICTION_NGRAM, cap);
        }
        d
    }
}

impl Stage for SpecBatch {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn nbytes(&self) -> usize {
        self.cache.nbytes() + self.draft_cache.nbytes()
    }

    fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.rows
            .iter_mut()
            .find(|r| r.seq.id() == id)
            .map(|r| &mut r.seq)
    }

    fn stepping(&self) -> Vec<SeqId> {
        self.rows.iter().map(|r| r.seq.id()).collect()
    }

    fn cancelled(&self) -> Vec<SeqId> {
        self.rows
            .iter()
            .filter(|r| r.seq.job().cancelled())
            .map(|r| r.seq.id())
            .collect()
    }

    /// Finished rows come back with their target caches extracted (trimmed to the
    /// tokens the sequence fed: a row that stopped mid-round leaves positions behind).
    fn remove(&mut self, leaving: &[(SeqId, Leave)]) -> Result<Vec<Left>> {
        let (gone, keep) = leaving_rows(self.rows.len(), leaving, |id| self.position(id));
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let mut with_caches: Vec<(usize, Option<PromptCache>)> = Vec::with_capacity(gone.len());
        for (i, how) in gone {
            if how == Leave::Finished && self.rows[i].k > 0 {
                let r = &self.rows[i];
                let rate = if r.drafted > 0 {
                    100.0 * r.accepted as f64 / r.drafted as f64
                } else {
                    0.0
                };
                tracing::info!(
                    "speculative: {} of {} drafted tokens accepted ({rate:.1}%) over {} tokens",
                    r.accepted,
                    r.drafted,
                    r.seq.generated()
                );
            }
            let caches = match how {
                Leave::Finished => self.cache.extract(i).ok().map(|mut c| {
                    let extra = c
                        .first()
                        .map_or(0, |l| l.offset() - self.rows[i].seq.fed_len() as i32);
                    if extra > 0 {
                        mlx_cache::trim_prompt_cache(&mut c, extra);
                    }
                    c
                }),
                Leave::Dropped => None,
            };
            with_caches.push((i, caches));
        }
        self.cache.filter(&keep).map_err(cache_err)?;
        let mut rows = self.keep_rows(&keep)?;
        Ok(with_caches
            .into_iter()
            .filter_map(|(i, caches)| rows[i].take().map(|r| Left { seq: r.seq, caches }))
            .collect())
    }

    fn drain(&mut self) -> Vec<Sequence> {
        self.pending = None;
        self.cache = BatchPromptCache::new();
        self.draft_cache = BatchPromptCache::new();
        self.lag.clear();
        std::mem::take(&mut self.rows)
            .into_iter()
            .map(|r| r.seq)
            .collect()
    }
}

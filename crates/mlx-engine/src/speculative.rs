//! Speculative decoding: mlx-lm's `speculative_generate_step` as a second
//! [`TokenIterator`], built from the same step pieces as [`crate::TokenGenerator`]
//! ([`step::prefill`], [`step::forward_tail`], [`step::sample_with_history`]).
//!
//! Each round drafts `n = min(remaining, num_draft_tokens)` tokens, verifies them in
//! one target forward over `[last, drafts...]`, emits the longest prefix where the
//! target's own sample equals the draft (then the target's token at the first mismatch,
//! or the bonus token), and trims both caches by what was rejected. Every emitted token
//! is the target's sample, so greedy output equals plain greedy output.
//!
//! Drafts come from a draft model (mlx-lm's `--draft-model`: its caches follow the
//! target's in the cache list, as in mlx-lm's prompt-cache files) or, an addition of
//! ours, from prompt lookup ([`PromptLookup`]: the continuation of the latest earlier
//! occurrence of the last n-gram of the prompt and the text so far, or of a given text
//! such as OpenAI's predicted output).
//!
//! Where mlx-lm raises or goes wrong we keep going: a rotating (sliding-window) cache
//! that a round would wrap cannot be trimmed, so generation falls back to plain decoding
//! from there ([`SpeculativeStats::fallback`] says why).
//!
//! An addition of ours: a sequence whose drafts are mostly rejected steps aside
//! ([`AcceptancePolicy`]): once [`ACCEPTANCE_WINDOW`] rounds have run and fewer than
//! `min_acceptance` of the drafts of the last ones were accepted, it decodes plainly
//! for the rest of its generation (the same fallback). The single generator's
//! minimum is 0 unless set ([`SpeculativeGenerator::with_min_acceptance`]): it never
//! steps aside, mlx-lm's behaviour; the server's speculating batch applies the same
//! policy per row (`batch/speculate/`).
use crate::error::{EngineError, Result};
use crate::generate::{generation_stream, GenerateOptions, TokenIterator};
use crate::step::{self, KvQuantization, RowSampling};
use mlx_array::{memory, ops, transforms, Array, Stream};
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use mlx_sample::LogitsProcessors;
use std::collections::VecDeque;
use std::time::Instant;

/// The largest `num_draft_tokens` accepted: more would only waste target compute.
pub const MAX_NUM_DRAFT_TOKENS: i32 = 64;

/// Checks a `num_draft_tokens` value (1 to [`MAX_NUM_DRAFT_TOKENS`]).
pub fn check_num_draft_tokens(n: i64) -> Result<i32> {
    if n < 1 || n > MAX_NUM_DRAFT_TOKENS as i64 {
        return Err(EngineError::Invalid(format!(
            "num_draft_tokens must be between 1 and {MAX_NUM_DRAFT_TOKENS}, got {n}"
        )));
    }
    Ok(n as i32)
}

/// Checks a draft max batch (the server's `--draft-max-batch`: speculating rows decode
/// plainly while more rows than this decode): 0 (never) or fewer rows than
/// `decode_concurrency`, the most that decode at once (a larger value never applies).
pub fn check_max_batch(n: i64, decode_concurrency: usize) -> Result<usize> {
    if n < 0 {
        return Err(EngineError::Invalid(format!(
            "the draft max batch must be 0 (never stop drafting) or a number of rows, got {n}"
        )));
    }
    if n > 0 && n as u64 >= decode_concurrency as u64 {
        return Err(EngineError::Invalid(format!(
            "the draft max batch {n} would never apply: at most {decode_concurrency} rows \
             decode at once (the decode concurrency); give fewer rows, or 0 to never stop \
             drafting"
        )));
    }
    Ok(n as usize)
}

/// The rounds over which a speculating sequence's acceptance is judged.
pub const ACCEPTANCE_WINDOW: usize = 8;

/// The minimum acceptance a [`SpeculativeGenerator`] keeps to by default for greedy
/// decoding with a draft model (not in mlx-lm, which never stops drafting): below it the
/// draft costs more than it saves, and greedy tokens do not depend on whether they were
/// drafted (on the CPU they are the same bits; sampled decoding, whose random draws
/// follow the rounds, keeps mlx-lm's behaviour, and so does prompt lookup, whose rounds
/// without a match cost a plain step). With a draft step of about a sixth of the
/// target's and a verification of about 1.3 plain steps, k = 3 drafts pay from ~30%
/// accepted (an H100, the 8B bf16 target with a random 1B draft: 0% accepted decoded at
/// 0.5x of plain; benchmarks/GPU.md session 39). The server's `--draft-min-acceptance`
/// default is the same.
pub const GREEDY_MIN_ACCEPTANCE: f64 = 0.3;

/// Checks a minimum acceptance rate (a number from 0 to 1).
pub fn check_min_acceptance(f: f64) -> Result<f64> {
    if !f.is_finite() || !(0.0..=1.0).contains(&f) {
        return Err(EngineError::Invalid(format!(
            "the minimum draft acceptance must be a number from 0 to 1, got {f}"
        )));
    }
    Ok(f)
}

/// When a speculating sequence steps aside: its drafts accepted over drafted in its
/// last [`ACCEPTANCE_WINDOW`] rounds (0 when those rounds drafted nothing: a
/// prediction that stopped matching). Once at least that many rounds have run and the
/// rate is below `min_acceptance`, the sequence decodes plainly for the rest of its
/// generation. A minimum of 0 never steps aside.
#[derive(Debug, Clone, Default)]
pub struct AcceptancePolicy {
    min_acceptance: f64,
    /// `(drafted, accepted)` of the last rounds, oldest first.
    recent: VecDeque<(u64, u64)>,
}

/// The acceptance over the window when a sequence stepped aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepAside {
    /// Draft tokens proposed in the window.
    pub drafted: u64,
    /// Of those, accepted.
    pub accepted: u64,
}

impl AcceptancePolicy {
    /// The policy with `min_acceptance` (see [`check_min_acceptance`]).
    pub fn new(min_acceptance: f64) -> AcceptancePolicy {
        AcceptancePolicy {
            min_acceptance,
            recent: VecDeque::with_capacity(ACCEPTANCE_WINDOW),
        }
    }

    /// The minimum acceptance.
    pub fn min_acceptance(&self) -> f64 {
        self.min_acceptance
    }

    /// Records a round that drafted `drafted` tokens and accepted `accepted` of them;
    /// `Some` when the sequence is to stop speculating now.
    pub fn record(&mut self, drafted: usize, accepted: usize) -> Option<StepAside> {
        if self.min_acceptance <= 0.0 {
            return None;
        }
        if self.recent.len() == ACCEPTANCE_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back((drafted as u64, accepted as u64));
        if self.recent.len() < ACCEPTANCE_WINDOW {
            return None;
        }
        let (d, a) = self
            .recent
            .iter()
            .fold((0, 0), |(d, a), (dr, ac)| (d + dr, a + ac));
        let rate = if d == 0 { 0.0 } else { a as f64 / d as f64 };
        (rate < self.min_acceptance).then_some(StepAside {
            drafted: d,
            accepted: a,
        })
    }
}

/// Prompt-lookup drafting (draft-free speculation): the draft is the continuation of
/// the most recent earlier occurrence of the last `ngram` tokens (then shorter n-grams
/// down to 1) in the searched tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptLookup {
    /// The longest n-gram matched.
    pub ngram: usize,
    /// Tokens searched besides the prompt and the generated tokens (e.g. an OpenAI
    /// predicted output); searched first.
    pub reference: Vec<u32>,
    /// Whether the prompt and the generated tokens are searched too.
    pub search_context: bool,
}

impl PromptLookup {
    /// Searches the prompt and the generated tokens with n-grams up to `ngram`.
    pub fn new(ngram: usize) -> PromptLookup {
        PromptLookup {
            ngram,
            reference: Vec::new(),
            search_context: true,
        }
    }

    /// Drafts from `reference` (OpenAI's predicted output) and the generated text.
    pub fn prediction(reference: Vec<u32>, ngram: usize) -> PromptLookup {
        PromptLookup {
            ngram,
            reference,
            search_context: false,
        }
    }
}

/// Where draft tokens come from.
pub enum DraftSource<'a> {
    /// A draft model of the same vocabulary; its caches follow the target's in the
    /// cache list.
    Model(&'a dyn LanguageModel),
    /// Prompt lookup.
    Lookup(PromptLookup),
}

/// Counts of a speculative generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpeculativeStats {
    /// Draft tokens proposed.
    pub drafted: u64,
    /// Draft tokens accepted (emitted with `from_draft`).
    pub accepted: u64,
    /// Verification rounds.
    pub rounds: u64,
    /// Why generation fell back to plain decoding, if it did.
    pub fallback: Option<String>,
    /// Whether it fell back because its drafts were rejected ([`AcceptancePolicy`]).
    pub stepped_aside: bool,
    /// Rounds whose drafts the round before queued behind its verification
    /// (`MLX_DRAFT_PIPELINE=1`).
    pub pipelined: u64,
}

/// Up to `k` tokens that follow the latest match, in `haystack`, of the final n-gram of
/// `context` (n from `max_ngram` down to 1); a match must be followed by a token.
pub(crate) fn lookup_draft(
    haystack: &[u32],
    context: &[u32],
    max_ngram: usize,
    k: usize,
) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=max_ngram.min(context.len())).rev() {
        let pattern = &context[context.len() - n..];
        // Latest start whose match is followed by at least one token; in the
        // context itself the final n-gram is excluded (it has no continuation).
        let limit = haystack.len().saturating_sub(n);
        for start in (0..limit).rev() {
            if &haystack[start..start + n] == pattern {
                let from = start + n;
                let to = (from + k).min(haystack.len());
                return haystack[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

enum Drafter<'a> {
    Model(&'a dyn LanguageModel),
    Lookup {
        cfg: PromptLookup,
        /// Prompt tokens and emitted tokens, in order.
        tokens: Vec<u32>,
        prompt_len: usize,
    },
}

/// A verified round whose tokens are being handed out.
struct Round {
    num_draft: i32,
    /// mlx-lm's `n` at the end of the round's accept loop.
    n: i32,
    queue: VecDeque<(u32, Array, bool)>,
    consumed: i32,
    /// `max_tokens` was reached in this round.
    last: bool,
    /// The last draft was fed to the draft model in this round ([`EagerFeed`]).
    fed: bool,
}

/// When the draft model is fed a round's last draft right behind the verification
/// (`MLX_DRAFT_EAGER_FEED`): `1` every round, `0` never (mlx-lm's way), unset on the GPU
/// only, in the rounds after one that accepted every draft (and the first).
///
/// mlx-lm feeds the last draft at the start of the next round, along with the target's
/// token (a two-token draft step, after a round that accepted every draft). On the GPU
/// that step runs MLX's `qmm` instead of its one-row `qmv` for a quantized draft, and the
/// draft's steps after it ran slower too (H100, echo 8B bf16 with its 4-bit copy, k = 7:
/// 3.5-3.7 ms a later step against 2.7 ms; benchmarks/GPU.md session 39); fed eagerly, the
/// step runs while the host reads the verification, and every draft step takes one
/// token. Between rounds the draft's caches then hold the last draft too (a rejection
/// trims one more); at the end they are left as mlx-lm leaves them. The emitted tokens
/// are the target's either way; on the GPU a draft token from a one-row step can round
/// differently from mlx-lm's two-row step (docs/parity.md). On the CPU the two-token step
/// costs about one step, so it stays mlx-lm's way there. The server's speculating batch
/// feeds eagerly only with `1` (every round; `batch::speculate`'s `eager_feed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EagerFeed {
    Never,
    Always,
    AfterFullAcceptance,
}

/// Whether `MLX_DRAFT_EAGER_FEED` asks for the eager feed in every round (`1`): the
/// server's speculating batch feeds eagerly only then (`SpecBatch::eager_feed`).
pub(crate) fn eager_feed_every_round() -> bool {
    eager_feed_policy() == EagerFeed::Always
}

fn eager_feed_policy() -> EagerFeed {
    match std::env::var("MLX_DRAFT_EAGER_FEED").as_deref() {
        Ok("1") => EagerFeed::Always,
        Ok("0") => EagerFeed::Never,
        _ if crate::step::on_gpu() => EagerFeed::AfterFullAcceptance,
        _ => EagerFeed::Never,
    }
}

/// Whether a round that feeds its last draft eagerly also drafts the next round behind
/// its verification (`MLX_DRAFT_PIPELINE=1`; an experiment, off by default).
///
/// A round's host work (the draft steps' graphs, the verification's) and the GPU's run
/// one after the other around the round's one wait: while the host waits for the
/// verification, it builds nothing, and while it reads the tokens and builds the next
/// round's first draft step, the GPU idles (H100, echo 8B bf16 with its 4-bit copy,
/// k = 7: a 41.7 ms round, 12.5 ms of it the wait; benchmarks/GPU.md session 48). Pipelined,
/// the round queues, right behind the eager feed, the draft model's next round as if every
/// draft were accepted: the draft's own sample after the last draft stands for the
/// target's bonus token, and `k` more one-token draft steps from it give the next round's
/// drafts, all on the device. The next round uses them when the guess was right (every
/// draft accepted and the target's token equal to the guess): its draft steps are then
/// exactly those it would have run (the same inputs on the same caches), so the tokens
/// and caches are unchanged; otherwise they are trimmed from the draft's caches and the
/// round drafts as before. Greedy decoding with a draft model only (a sampled draft would
/// draw random numbers mlx-lm does not), without logits processors, quantized KV caches
/// or rotating caches. Measured on an H100 (session 49): not told apart from the default
/// (k = 7 171-192 tok/s against 192, k = 10 177-243 against 186-210): the host still
/// waited ~14.6 ms a round for the verification, so the device, not the host, sets the
/// round there (eight 4-bit draft steps and a ~10-11 ms verification).
fn pipeline_policy() -> bool {
    std::env::var("MLX_DRAFT_PIPELINE").as_deref() == Ok("1")
}

/// The next round's drafts, queued behind a round's verification ([`pipeline_policy`]).
struct Predraft {
    /// The draft model's sample after the round's last draft (`[1]`): its guess of the
    /// target's token after a fully accepted round, fed to it first.
    guess: Array,
    /// The drafts after the guess (`[fed]`, uint32).
    drafts: Array,
    /// Tokens fed to the draft model for them (the guess and all drafts but the last).
    fed: i32,
}

/// mlx-lm's `speculative_generate_step` behind [`TokenIterator`].
pub struct SpeculativeGenerator<'a> {
    model: &'a dyn LanguageModel,
    drafter: Drafter<'a>,
    caches: &'a mut Vec<Box<dyn KvCache>>,
    n_target: usize,
    max_tokens: i64,
    num_draft_tokens: i32,
    prefill_step_size: usize,
    kv: Option<KvQuantization>,
    sampling: RowSampling,
    /// The processors need each accepted token (an output constraint): drafts are
    /// sampled and verified on copies of them, position by position, and the row's
    /// own processors are told only the emitted tokens (a rejected draft never reaches
    /// them, so nothing has to be rolled back).
    constrained: bool,
    stream: Stream,
    prompt: Option<Vec<u32>>,
    prompt_total: usize,
    /// The target's next input (mlx-lm's `y`).
    y: Vec<u32>,
    /// The draft model's next input (mlx-lm's `draft_y`).
    draft_y: Vec<u32>,
    /// mlx-lm's `prev_tokens`: the history logits processors see.
    history: Option<Array>,
    ntoks: i64,
    round: Option<Round>,
    plain: bool,
    finished: bool,
    last_from_draft: bool,
    stats: SpeculativeStats,
    acceptance: AcceptancePolicy,
    /// The policy asked to step aside after the current round.
    step_aside: Option<StepAside>,
    /// After the fallback: the step queued on the token handed out last.
    queued: Option<(Array, Array)>,
    /// `MLX_ENGINE_PROFILE`'s per-round times.
    profile: Option<crate::profile::RoundProfile>,
    /// When a round's last draft is fed to the draft model behind the verification.
    eager: EagerFeed,
    /// The last round accepted every draft (true before the first).
    all_accepted: bool,
    /// Rounds may draft the next round behind their verification ([`pipeline_policy`]).
    pipeline: bool,
    /// The next round's drafts, queued by the last round (their tokens are in the draft
    /// model's caches until used or dropped).
    predraft: Option<Predraft>,
}

impl Drop for SpeculativeGenerator<'_> {
    fn drop(&mut self) {
        if let Some(line) = self.profile.as_ref().and_then(|p| p.summary()) {
            eprintln!("{line}");
        }
        // mlx-lm's `finally: _rewind_cache(num_draft, n)` with `n` as the consumer left
        // it: the caches keep what the tokens handed out so far imply.
        if let Some(r) = self.round.take() {
            self.rewind(r.num_draft, r.consumed.min(r.n), r.fed, true);
        }
        self.drop_predraft();
    }
}

impl<'a> SpeculativeGenerator<'a> {
    /// Prepares speculative generation of `prompt`. `caches` holds the target's caches
    /// followed by the draft model's (none for prompt lookup), e.g. both
    /// `make_prompt_cache`s or a prompt-cache file saved with both. `opts` are those of
    /// [`crate::TokenGenerator`] (`prompt_progress` is not called, as in mlx-lm).
    pub fn new(
        model: &'a dyn LanguageModel,
        source: DraftSource<'a>,
        prompt: &[u32],
        caches: &'a mut Vec<Box<dyn KvCache>>,
        num_draft_tokens: i32,
        opts: GenerateOptions,
    ) -> Result<SpeculativeGenerator<'a>> {
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt has no tokens".into()));
        }
        let num_draft_tokens = check_num_draft_tokens(num_draft_tokens as i64)?;
        let n_target = model.cache_specs().len();
        let tv = model.vocab_size();
        let (drafter, n_draft) = match source {
            DraftSource::Model(draft) => {
                let dv = draft.vocab_size();
                // Draft ids index the target's embedding: a larger draft vocabulary
                // could feed ids the target has no row for.
                if dv > tv {
                    return Err(EngineError::Invalid(format!(
                        "the draft model's vocabulary ({dv}) is larger than the target \
                         model's ({tv}): the draft must use the target's tokenizer"
                    )));
                }
                (Drafter::Model(draft), draft.cache_specs().len())
            }
            DraftSource::Lookup(cfg) => {
                if cfg.ngram == 0 {
                    return Err(EngineError::Invalid(
                        "the prompt-lookup n-gram size must be at least 1".into(),
                    ));
                }
                (
                    Drafter::Lookup {
                        cfg,
                        tokens: Vec::new(),
                        prompt_len: 0,
                    },
                    0,
                )
            }
        };
        if let Some((i, &id)) = prompt
            .iter()
            .enumerate()
            .find(|(_, &id)| tv > 0 && id as i64 >= tv as i64)
        {
            return Err(EngineError::Invalid(format!(
                "prompt token {i} is id {id}, outside the model's vocabulary of {tv} \
                 (is the tokenizer the model's?)"
            )));
        }
        if caches.len() != n_target + n_draft {
            let what = if n_draft > 0 {
                format!(
                    "the target's {n_target} followed by the draft model's {n_draft} \
                     (a prompt-cache file for speculative decoding must be saved with both)"
                )
            } else {
                format!("one per cache of the model ({n_target})")
            };
            return Err(EngineError::Invalid(format!(
                "{} caches given; speculative decoding needs {what}",
                caches.len()
            )));
        }
        let untrimmable = |cs: &[Box<dyn KvCache>]| -> Vec<&'static str> {
            let mut kinds: Vec<&'static str> = cs
                .iter()
                .filter(|c| !c.is_trimmable() && rotating_room(c.as_ref()).is_none())
                .map(|c| c.class_name())
                .collect();
            kinds.sort_unstable();
            kinds.dedup();
            kinds
        };
        let (target_caches, draft_caches) = caches.split_at(n_target);
        let bad = untrimmable(target_caches);
        if !bad.is_empty() {
            return Err(EngineError::Invalid(format!(
                "speculative decoding requires trimmable caches; the model's {} caches \
                 cannot be trimmed",
                bad.join(", ")
            )));
        }
        let bad = untrimmable(draft_caches);
        if !bad.is_empty() {
            return Err(EngineError::Invalid(format!(
                "speculative decoding requires trimmable caches; the draft model's {} \
                 caches cannot be trimmed",
                bad.join(", ")
            )));
        }
        let greedy_draft = opts.sampler.as_ref().is_none_or(|s| s.is_greedy())
            && matches!(drafter, Drafter::Model(_));
        let sampling =
            RowSampling::new(opts.sampler, LogitsProcessors::new(opts.logits_processors));
        let constrained = sampling.needs_accepted_token();
        let pipeline = pipeline_policy()
            && greedy_draft
            && !sampling.has_processors()
            && opts.kv_quantization.is_none()
            && caches.iter().all(|c| rotating_room(c.as_ref()).is_none());
        Ok(SpeculativeGenerator {
            model,
            drafter,
            caches,
            n_target,
            max_tokens: opts.max_tokens,
            num_draft_tokens,
            prefill_step_size: opts.prefill_step_size.max(1),
            kv: opts.kv_quantization,
            sampling,
            constrained,
            stream: generation_stream()?,
            prompt: Some(prompt.to_vec()),
            prompt_total: prompt.len(),
            y: Vec::new(),
            draft_y: Vec::new(),
            history: None,
            ntoks: 0,
            round: None,
            plain: false,
            finished: false,
            last_from_draft: false,
            stats: SpeculativeStats::default(),
            acceptance: AcceptancePolicy::new(if greedy_draft {
                GREEDY_MIN_ACCEPTANCE
            } else {
                0.0
            }),
            step_aside: None,
            queued: None,
            profile: crate::profile::enabled().then(Default::default),
            eager: eager_feed_policy(),
            all_accepted: true,
            pipeline,
            predraft: None,
        })
    }

    /// Steps aside to plain decoding when fewer than `min_acceptance` (0 to 1) of the
    /// drafts are accepted ([`AcceptancePolicy`]); 0 never does, as mlx-lm. The
    /// default: [`GREEDY_MIN_ACCEPTANCE`] for greedy decoding (no sampler, or one whose
    /// [`mlx_sample::Sampler::is_greedy`]) with a draft model, else 0.
    pub fn with_min_acceptance(mut self, min_acceptance: f64) -> Result<Self> {
        self.acceptance = AcceptancePolicy::new(check_min_acceptance(min_acceptance)?);
        Ok(self)
    }

    /// [`SpeculativeGenerator::with_min_acceptance`] when `Some`, else the default.
    pub fn with_min_acceptance_if(self, min_acceptance: Option<f64>) -> Result<Self> {
        match min_acceptance {
            Some(m) => self.with_min_acceptance(m),
            None => Ok(self),
        }
    }

    /// Tokens that came before `prompt` and are already in the caches (a chat's earlier
    /// turns), for prompt lookup to search as well, ahead of the prompt; no effect with
    /// a draft model or once generation has started.
    pub fn with_lookup_context(mut self, earlier: &[u32]) -> Self {
        if self.prompt.is_some() {
            if let Drafter::Lookup { tokens, .. } = &mut self.drafter {
                tokens.splice(0..0, earlier.iter().copied());
            }
        }
        self
    }

    /// Counts so far.
    pub fn stats(&self) -> &SpeculativeStats {
        &self.stats
    }

    fn start(&mut self, prompt: Vec<u32>) -> Result<()> {
        let (target, draft) = self.caches.split_at_mut(self.n_target);
        // mlx-lm prefills the draft model first.
        let draft_y = match &mut self.drafter {
            Drafter::Model(d) => {
                prefill_chunks(*d, draft, &prompt, self.prefill_step_size, self.kv)?
            }
            Drafter::Lookup {
                tokens, prompt_len, ..
            } => {
                tokens.extend_from_slice(&prompt);
                *prompt_len = tokens.len();
                prompt[prompt.len() - 1..].to_vec()
            }
        };
        let y = prefill_chunks(self.model, target, &prompt, self.prefill_step_size, self.kv)?;
        self.draft_y = draft_y;
        self.y = y;
        Ok(())
    }

    /// mlx-lm's `_rewind_cache(num_draft, num_accept)`; `fed`: the round's last draft
    /// is in the draft's caches too ([`EagerFeed`]); `end`: generation stops here, so
    /// the draft's caches are left as mlx-lm's would be (without the last draft when
    /// every draft was accepted).
    fn rewind(&mut self, num_draft: i32, num_accept: i32, fed: bool, end: bool) {
        let (target, draft) = self.caches.split_at_mut(self.n_target);
        mlx_cache::trim_prompt_cache(target, num_draft - num_accept);
        if matches!(self.drafter, Drafter::Model(_)) {
            let trim = if !fed {
                (num_draft - num_accept - 1).max(0)
            } else if end && num_accept >= num_draft {
                1
            } else {
                num_draft - num_accept
            };
            mlx_cache::trim_prompt_cache(draft, trim);
        }
    }

    /// Queues the next round's `next` drafts behind this round's verification
    /// ([`pipeline_policy`]): the draft model's sample from `fed` (its logits after the
    /// round's last draft) as the guess of the target's token, then `next` one-token
    /// draft steps from it.
    fn queue_predraft(&mut self, draft: &dyn LanguageModel, fed: &Array, next: i32) -> Result<()> {
        let (guess, _) =
            step::sample_with_history(&mut self.sampling, None, &fed.squeeze(Some(&[0]))?)?;
        let mut y = guess.clone();
        let mut ys = Vec::with_capacity(next as usize);
        self.draft_loop(draft, next, &mut y, &mut ys)?;
        let refs: Vec<&Array> = ys.iter().collect();
        self.predraft = Some(Predraft {
            guess,
            drafts: ops::concatenate(&refs, 0)?.astype(mlx_array::Dtype::Uint32)?,
            fed: next,
        });
        Ok(())
    }

    /// After a round's tokens were handed out: keeps the next round's predraft only if
    /// that round starts where it guessed (every draft accepted, the target's token the
    /// guess, speculation going on), else trims it from the draft model's caches.
    fn settle_predraft(&mut self, r: &Round) -> Result<()> {
        let Some(p) = &self.predraft else {
            return Ok(());
        };
        let keep = !r.last
            && r.num_draft > 0
            && r.n == r.num_draft
            && self.step_aside.is_none()
            && !self.plain
            && self.y.len() == 1
            && step::read_token(&p.guess)? == self.y[0];
        if !keep {
            self.drop_predraft();
        }
        Ok(())
    }

    /// Trims an unused predraft's tokens from the draft model's caches.
    fn drop_predraft(&mut self) {
        if let Some(p) = self.predraft.take() {
            mlx_cache::trim_prompt_cache(&mut self.caches[self.n_target..], p.fed);
        }
    }

    /// Whether this round feeds its last draft to the draft model eagerly.
    fn feeds_eagerly(&self, num_draft: i32) -> bool {
        num_draft > 0
            && matches!(self.drafter, Drafter::Model(_))
            && match self.eager {
                EagerFeed::Never => false,
                EagerFeed::Always => true,
                EagerFeed::AfterFullAcceptance => self.all_accepted,
            }
    }

    fn extend_history(&mut self, input: &Array) -> Result<()> {
        if !self.sampling.has_processors() {
            return Ok(());
        }
        self.history = Some(match &self.history {
            Some(h) => ops::concatenate(&[h, input], 0)?,
            None => input.clone(),
        });
        Ok(())
    }

    /// Keeps the first `len` history tokens (mlx-lm's `prev_tokens[:len]`).
    fn truncate_history(&mut self, len: i64) -> Result<()> {
        if let Some(h) = &self.history {
            let size = h.size() as i64;
            let len = len.clamp(0, size);
            self.history = if len == 0 {
                None
            } else {
                Some(h.slice(&[0], &[len as i32], None)?)
            };
        }
        Ok(())
    }

    /// mlx-lm's `_draft_generate` with the draft model: `[num_draft]` tokens.
    fn draft_with_model(&mut self, draft: &dyn LanguageModel, num_draft: i32) -> Result<Array> {
        let mut y = Array::from_slice(&self.draft_y, &[self.draft_y.len() as i32])?;
        let mut ys = Vec::with_capacity(num_draft as usize);
        // Under a constraint the draft is sampled under its mask, on a copy that takes
        // each draft token.
        let own = self.constrained.then(|| {
            self.sampling
                .swap_processors(self.sampling.fork_processors())
        });
        let drafted = self.draft_loop(draft, num_draft, &mut y, &mut ys);
        if let Some(own) = own {
            self.sampling.swap_processors(own);
        }
        drafted?;
        let refs: Vec<&Array> = ys.iter().collect();
        Ok(ops::concatenate(&refs, 0)?.astype(mlx_array::Dtype::Uint32)?)
    }

    fn draft_loop(
        &mut self,
        draft: &dyn LanguageModel,
        num_draft: i32,
        y: &mut Array,
        ys: &mut Vec<Array>,
    ) -> Result<()> {
        for i in 0..num_draft {
            let draft_caches = &mut self.caches[self.n_target..];
            let logits =
                step::forward_tail(draft, &y.expand_dims(&[0])?, draft_caches, self.kv, 1)?;
            self.extend_history(y)?;
            let (t, _) = step::sample_with_history(
                &mut self.sampling,
                self.history.as_ref(),
                &logits.squeeze(Some(&[0]))?,
            )?;
            let tic = self.profile.is_some().then(Instant::now);
            if crate::profile::sync() {
                transforms::eval(&[&t])?;
            } else {
                transforms::async_eval(&[&t])?;
            }
            if let (Some(p), Some(tic)) = (self.profile.as_mut(), tic) {
                p.draft_eval(i as usize, tic.elapsed());
            }
            if self.constrained {
                self.sampling.accept(step::read_token(&t)?)?;
            }
            ys.push(t.clone());
            *y = t;
        }
        Ok(())
    }

    /// Whether feeding `target_in` tokens to the target and `draft_in` to the draft
    /// would leave a rotating cache that could no longer be trimmed.
    fn would_wrap(&self, target_in: i32, draft_in: i32) -> Option<String> {
        let (target, draft) = self.caches.split_at(self.n_target);
        let check = |cs: &[Box<dyn KvCache>], fed: i32, who: &str| {
            cs.iter().find_map(|c| {
                rotating_room(c.as_ref()).and_then(|room| {
                    (fed >= room).then(|| {
                        format!(
                            "the {who}'s rotating (sliding-window) cache is full \
                             ({} positions): it cannot be trimmed, so speculative decoding \
                             fell back to plain decoding after {} tokens",
                            c.offset() + room,
                            self.ntoks
                        )
                    })
                })
            })
        };
        check(target, target_in, "model").or_else(|| {
            if matches!(self.drafter, Drafter::Model(_)) {
                check(draft, draft_in, "draft model")
            } else {
                None
            }
        })
    }

    fn remaining(&self) -> i64 {
        if self.max_tokens < 0 {
            i64::MAX
        } else {
            self.max_tokens - self.ntoks
        }
    }

    /// One speculative round: draft, verify, accept; queues the round's tokens.
    fn run_round(&mut self) -> Result<()> {
        let t0 = self.profile.is_some().then(Instant::now);
        let num_draft = self.remaining().min(self.num_draft_tokens as i64) as i32;
        let y_len = self.y.len() as i32;
        let (draft_tokens, num_draft): (Array, i32) = match &self.drafter {
            Drafter::Model(d) => {
                let d = *d;
                if self
                    .predraft
                    .as_ref()
                    .is_some_and(|p| p.fed != num_draft || num_draft == 0)
                {
                    self.drop_predraft();
                }
                // Queued by the last round, whose guess was right.
                if let Some(p) = self.predraft.take() {
                    self.stats.pipelined += 1;
                    (p.drafts, num_draft)
                } else if num_draft == 0 {
                    (Array::from_slice::<u32>(&[], &[0])?, 0)
                } else {
                    (self.draft_with_model(d, num_draft)?, num_draft)
                }
            }
            Drafter::Lookup {
                cfg,
                tokens,
                prompt_len,
            } => {
                let k = num_draft.max(0) as usize;
                let generated = &tokens[(*prompt_len).min(tokens.len())..];
                let mut d = if cfg.reference.is_empty() {
                    Vec::new()
                } else if generated.is_empty() {
                    // A predicted output starts where the answer starts.
                    cfg.reference[..k.min(cfg.reference.len())].to_vec()
                } else {
                    lookup_draft(&cfg.reference, generated, cfg.ngram, k)
                };
                if d.is_empty() && cfg.search_context {
                    d = lookup_draft(tokens, tokens, cfg.ngram, k);
                }
                let n = d.len() as i32;
                (Array::from_slice(&d, &[n])?, n)
            }
        };
        if self.history.is_some() {
            let size = self.history.as_ref().map_or(0, |h| h.size() as i64);
            self.truncate_history(size - y_len as i64 - num_draft as i64 + 1)?;
        }
        let t1 = t0.map(|_| Instant::now());
        let y_arr = Array::from_slice(&self.y, &[y_len])?;
        let input = if num_draft > 0 {
            ops::concatenate(&[&y_arr, &draft_tokens], 0)?
        } else {
            y_arr.clone()
        };
        let n_predict = num_draft + 1;
        let target_caches = &mut self.caches[..self.n_target];
        let logits = step::forward_tail(
            self.model,
            &input.expand_dims(&[0])?,
            target_caches,
            self.kv,
            n_predict,
        )?;
        let (tokens, logprobs) = if self.sampling.has_processors() {
            // The processors see the target's own samples as history, position by
            // position (mlx-lm's loop over `n_predict`).
            let v = logits.dim(2)?;
            // mlx-lm's `y[: -(n_predict - 1)]`: the round's input without the drafts.
            let mut inp = y_arr.clone();
            let (mut ts, mut lps) = (Vec::new(), Vec::new());
            // Under a constraint, position i is masked by a copy that took the drafts
            // before it (the target's logits there follow them); from the first draft
            // the constraint rejects on, the positions are not emitted.
            let (own, drafted) = if self.constrained {
                transforms::eval(&[&draft_tokens])?;
                let own = self
                    .sampling
                    .swap_processors(self.sampling.fork_processors());
                (Some(own), step::read_tokens(&draft_tokens)?)
            } else {
                (None, Vec::new())
            };
            let mut verified = Ok(());
            for i in 0..n_predict {
                let r = (|| -> Result<()> {
                    self.extend_history(&inp)?;
                    let row = logits
                        .slice(&[0, i, 0], &[1, i + 1, v], None)?
                        .squeeze(Some(&[1]))?;
                    let (t, lp) =
                        step::sample_with_history(&mut self.sampling, self.history.as_ref(), &row)?;
                    if let Some(&d) = drafted.get(i as usize) {
                        self.sampling.accept(d)?;
                    }
                    ts.push(t.clone());
                    lps.push(lp);
                    inp = t;
                    Ok(())
                })();
                if r.is_err() {
                    verified = r;
                    break;
                }
            }
            if let Some(own) = own {
                self.sampling.swap_processors(own);
            }
            verified?;
            let tr: Vec<&Array> = ts.iter().collect();
            let lr: Vec<&Array> = lps.iter().collect();
            (ops::concatenate(&tr, 0)?, ops::concatenate(&lr, 0)?)
        } else {
            step::sample_with_history(&mut self.sampling, None, &logits.squeeze(Some(&[0]))?)?
        };
        let t2 = t0.map(|_| Instant::now());
        let mut predraft_time = std::time::Duration::ZERO;
        let fed = match &self.drafter {
            Drafter::Model(d) if self.feeds_eagerly(num_draft) => {
                let d = *d;
                transforms::async_eval(&[&tokens, &draft_tokens])?;
                let last = draft_tokens.slice(&[num_draft - 1], &[num_draft], None)?;
                let draft_caches = &mut self.caches[self.n_target..];
                let fed =
                    step::forward_tail(d, &last.expand_dims(&[0])?, draft_caches, self.kv, 1)?;
                transforms::async_eval(&[&fed])?;
                // The next round's drafts, if every draft here is accepted: as many as
                // it will draft then (`max_tokens` permitting).
                let left = self.remaining().saturating_sub(num_draft as i64 + 1);
                let next = left.min(self.num_draft_tokens as i64) as i32;
                if self.pipeline && next > 0 {
                    let tic = Instant::now();
                    self.queue_predraft(d, &fed, next)?;
                    predraft_time = tic.elapsed();
                }
                true
            }
            _ => false,
        };
        transforms::eval(&[&tokens, &draft_tokens])?;
        let drafts: Vec<u32> = step::read_tokens(&draft_tokens)?;
        let tokens: Vec<u32> = step::read_tokens(&tokens)?;
        if let (Some(p), Some(t0), Some(t1), Some(t2)) = (self.profile.as_mut(), t0, t1, t2) {
            p.round(
                num_draft as usize,
                t1 - t0 + predraft_time,
                t2 - t1,
                t2.elapsed().saturating_sub(predraft_time),
            );
        }
        let row = |i: i32| -> Result<Array> {
            Ok(logprobs
                .slice(&[i, 0], &[i + 1, logprobs.dim(1)?], None)?
                .squeeze(Some(&[0]))?)
        };
        let mut queue = VecDeque::new();
        let mut n = 0i32;
        while n < num_draft {
            let (tn, dtn) = (tokens[n as usize], drafts[n as usize]);
            if tn != dtn {
                break;
            }
            queue.push_back((tn, row(n)?, true));
            n += 1;
            self.ntoks += 1;
            if self.remaining() == 0 {
                break;
            }
        }
        if self.remaining() > 0 {
            self.ntoks += 1;
            queue.push_back((tokens[n as usize], row(n)?, false));
        }
        if self.constrained {
            for (t, _, _) in &queue {
                self.sampling.accept(*t)?;
            }
        }
        self.stats.rounds += 1;
        self.stats.drafted += num_draft as u64;
        self.stats.accepted += n as u64;
        self.all_accepted = n == num_draft;
        if let Some(w) = self.acceptance.record(num_draft as usize, n as usize) {
            self.step_aside = Some(w);
        }
        let last = self.remaining() == 0;
        if !last {
            let next = tokens[n as usize];
            self.y = vec![next];
            self.draft_y = if n == num_draft && num_draft > 0 && !fed {
                vec![drafts[num_draft as usize - 1], next]
            } else {
                vec![next]
            };
            if let Some(h) = &self.history {
                let size = h.size() as i64;
                self.truncate_history(size - (num_draft - n).max(1) as i64)?;
            }
        }
        if let Drafter::Lookup { tokens: seen, .. } = &mut self.drafter {
            seen.extend(queue.iter().map(|(t, _, _)| *t));
        }
        self.round = Some(Round {
            num_draft,
            n,
            queue,
            consumed: 0,
            last,
            fed,
        });
        Ok(())
    }

    /// The target's step on `y` (`[1]`) after the fallback, queued: the sampled token
    /// `[1]` and its log-probabilities `[vocab]`.
    fn plain_forward(&mut self, y: &Array) -> Result<(Array, Array)> {
        let target_caches = &mut self.caches[..self.n_target];
        let logits = step::forward(self.model, &y.expand_dims(&[0])?, target_caches, self.kv)?;
        self.extend_history(y)?;
        let (t, lp) =
            step::sample_with_history(&mut self.sampling, self.history.as_ref(), &logits)?;
        let lp = lp.squeeze(Some(&[0]))?;
        transforms::async_eval(&[&t, &lp])?;
        Ok((t, lp))
    }

    /// A plain decoding step after the fallback, pipelined as mlx-lm's `generate_step`
    /// is: the step on the token handed out now is queued before that token is read
    /// (unless it is the last one, or a constraint needs the token first).
    fn plain_step(&mut self) -> Result<Option<(u32, Array)>> {
        if self.remaining() == 0 {
            self.finished = true;
            return Ok(None);
        }
        let (t, lp) = match self.queued.take() {
            Some(q) => q,
            None => {
                let y = Array::from_slice(&self.y, &[self.y.len() as i32])?;
                self.plain_forward(&y)?
            }
        };
        if !self.constrained && self.remaining() > 1 {
            self.queued = Some(self.plain_forward(&t)?);
        }
        let token = step::read_token(&t)?;
        if self.constrained {
            self.sampling.accept(token)?;
        }
        self.ntoks += 1;
        self.y = vec![token];
        if self.ntoks % 256 == 0 {
            memory::clear_cache();
        }
        Ok(Some((token, lp)))
    }

    fn next_inner(&mut self) -> Result<Option<(u32, Array)>> {
        if self.finished {
            return Ok(None);
        }
        if let Some(prompt) = self.prompt.take() {
            let t0 = self.profile.is_some().then(Instant::now);
            self.start(prompt)?;
            if let (Some(p), Some(t0)) = (self.profile.as_mut(), t0) {
                p.prompt(t0.elapsed());
            }
        }
        loop {
            if let Some(r) = self.round.as_mut() {
                if let Some((t, lp, from_draft)) = r.queue.pop_front() {
                    r.consumed += 1;
                    self.last_from_draft = from_draft;
                    return Ok(Some((t, lp)));
                }
                let r = self
                    .round
                    .take()
                    .ok_or_else(|| EngineError::Internal("speculative round vanished".into()))?;
                self.rewind(r.num_draft, r.n, r.fed, r.last);
                self.settle_predraft(&r)?;
                if r.last {
                    self.finished = true;
                    return Ok(None);
                }
                if self.stats.rounds.is_multiple_of(64) {
                    memory::clear_cache();
                }
            }
            if self.plain {
                self.last_from_draft = false;
                return self.plain_step();
            }
            if self.remaining() == 0 {
                self.finished = true;
                return Ok(None);
            }
            if let Some(w) = self.step_aside.take() {
                let rate = 100.0 * w.accepted as f64 / w.drafted.max(1) as f64;
                self.stats.fallback = Some(format!(
                    "{} of {} drafted tokens accepted ({rate:.1}%) over the last {} rounds, \
                     below the minimum acceptance of {}: speculative decoding stepped aside \
                     to plain decoding after {} tokens",
                    w.accepted,
                    w.drafted,
                    ACCEPTANCE_WINDOW,
                    self.acceptance.min_acceptance(),
                    self.ntoks
                ));
                self.stats.stepped_aside = true;
                self.drop_predraft();
                self.plain = true;
                continue;
            }
            let num_draft = self.remaining().min(self.num_draft_tokens as i64) as i32;
            let fed = self.feeds_eagerly(num_draft);
            let draft_in = self.draft_y.len() as i32 + num_draft - 1 + i32::from(fed);
            if let Some(why) = self.would_wrap(self.y.len() as i32 + num_draft, draft_in) {
                self.drop_predraft();
                self.stats.fallback = Some(why);
                self.plain = true;
                continue;
            }
            self.run_round()?;
        }
    }
}

/// `max_size - offset` of a rotating cache (how many more positions it takes before it
/// wraps and can no longer be trimmed); `None` for other kinds.
fn rotating_room(c: &dyn KvCache) -> Option<i32> {
    c.as_any()
        .downcast_ref::<mlx_cache::RotatingKVCache>()
        .map(|r| r.max_size() - r.offset())
}

fn prefill_chunks(
    model: &dyn LanguageModel,
    caches: &mut [Box<dyn KvCache>],
    prompt: &[u32],
    step_size: usize,
    kv: Option<KvQuantization>,
) -> Result<Vec<u32>> {
    let total = prompt.len();
    let mut done = 0usize;
    while total - done > 1 {
        let n = step_size.min(total - done - 1);
        let chunk = Array::from_slice(&prompt[done..done + n], &[1, n as i32])?;
        step::prefill(model, &chunk, caches, kv)?;
        done += n;
        memory::clear_cache();
    }
    Ok(prompt[done..].to_vec())
}

impl TokenIterator for SpeculativeGenerator<'_> {
    fn next_token(&mut self) -> Result<Option<(u32, Array)>> {
        let stream = self.stream;
        mlx_array::with_stream(stream, || self.next_inner())
    }

    fn prompt_tokens(&self) -> usize {
        self.prompt_total
    }

    fn last_from_draft(&self) -> bool {
        self.last_from_draft
    }

    fn speculative_stats(&self) -> Option<SpeculativeStats> {
        Some(self.stats.clone())
    }

    fn dead_end(&self) -> bool {
        self.sampling.dead_end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // "1 2 3 9 | 1 2 3 7 | ... 2 3": the 2-gram [2, 3] last occurs before 7.
        let ctx = [1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3];
        assert_eq!(lookup_draft(&ctx, &ctx, 3, 4), vec![7, 5, 2, 3]);
        // A 3-gram match wins over a later 1-gram one.
        let ctx = [4, 5, 6, 8, 6, 1, 4, 5, 6];
        assert_eq!(lookup_draft(&ctx, &ctx, 3, 2), vec![8, 6]);
        // No match: nothing.
        assert_eq!(
            lookup_draft(&[1, 2, 3], &[1, 2, 3], 2, 4),
            Vec::<u32>::new()
        );
        // The draft length is capped.
        let ctx = [1, 2, 3, 4, 5, 1];
        assert_eq!(lookup_draft(&ctx, &ctx, 1, 2), vec![2, 3]);
    }

    #[test]
    fn lookup_in_a_reference_text() {
        let reference = [10, 11, 12, 13, 14];
        assert_eq!(lookup_draft(&reference, &[7, 11, 12], 2, 3), vec![13, 14]);
        assert_eq!(lookup_draft(&reference, &[7, 8], 2, 3), Vec::<u32>::new());
    }

    #[test]
    fn acceptance_policy_judges_the_last_rounds() {
        // Below the minimum: it steps aside at the window's last round, not before.
        let mut p = AcceptancePolicy::new(0.5);
        for _ in 1..ACCEPTANCE_WINDOW {
            assert_eq!(p.record(3, 1), None);
        }
        let got = p.record(3, 1);
        let w = ACCEPTANCE_WINDOW as u64;
        assert_eq!(
            got,
            Some(StepAside {
                drafted: 3 * w,
                accepted: w
            })
        );
        // The window slides: good rounds, then bad ones until the last 8 fall below
        // half (6 of 8 rounds at 3/4, then 2 at 0: 18 of 32).
        let mut p = AcceptancePolicy::new(0.5);
        for _ in 0..ACCEPTANCE_WINDOW {
            assert_eq!(p.record(4, 3), None);
        }
        assert_eq!(p.record(4, 0), None); // 21 of 32
        assert_eq!(p.record(4, 0), None); // 18 of 32
        assert_eq!(
            p.record(4, 0),
            Some(StepAside {
                drafted: 32,
                accepted: 15
            })
        );
        // Rounds that drafted nothing (a prediction that stopped matching) count as 0.
        let mut p = AcceptancePolicy::new(0.1);
        let got: Vec<_> = (0..ACCEPTANCE_WINDOW).map(|_| p.record(0, 0)).collect();
        assert_eq!(
            got.last().copied().flatten(),
            Some(StepAside {
                drafted: 0,
                accepted: 0
            })
        );
        // A minimum of 0 never steps aside.
        let mut p = AcceptancePolicy::new(0.0);
        assert!((0..100).all(|_| p.record(5, 0).is_none()));
        // The minimum's bounds.
        assert!(check_min_acceptance(-0.1).is_err());
        assert!(check_min_acceptance(1.01).is_err());
        assert!(check_min_acceptance(f64::NAN).is_err());
        assert_eq!(check_min_acceptance(1.0).unwrap(), 1.0);
    }

    #[test]
    fn num_draft_tokens_bounds() {
        assert!(check_num_draft_tokens(0).is_err());
        assert!(check_num_draft_tokens(-3).is_err());
        assert!(check_num_draft_tokens(65).is_err());
        assert_eq!(check_num_draft_tokens(3).unwrap(), 3);
        let msg = check_num_draft_tokens(1000).unwrap_err().to_string();
        assert!(
            msg.contains("between 1 and 64") && msg.contains("1000"),
            "{msg}"
        );
    }
}

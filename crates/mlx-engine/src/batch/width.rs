//! How many drafts a speculating batch verifies in a step: the width whose expected
//! tokens per unit of step time is highest. Drafts from predictions (prompt lookup
//! against OpenAI predicted outputs) cost nothing to make; a draft model's cost its
//! forwards, which its batch's step times include (each row count timed on its own).
//!
//! A batched verification is rectangular: `B` rows of `w + 1` positions, the rows with
//! fewer drafts padded. Its time grows with the `B (w + 1)` positions: on the CPU each
//! position is a row of every product (measured on 2 cores with the default model: a
//! step of `n` positions ~ 30 ms + 9.5 ms n), on a GPU a small batch's step is host-bound
//! and barely grows. A row whose drafts are accepted at rate `alpha` (each draft after
//! its predecessor) emits `1 + alpha + ... + alpha^min(w, d)` tokens on average with `d`
//! drafts available. The step takes the width `w` that maximizes the batch's expected
//! tokens over the step's expected time `T(B (w + 1))`; `w = 0` is a plain decoding step,
//! which a width with drafts must beat by 15%.
//!
//! `T(n)` is the recent time of steps of `n` positions when the batch has run one (each
//! step timed alone, with the cache roll its rejected drafts cause; see
//! [`Width::observe`]), else the nearest size's scaled by a line
//! `a + c n` fitted to the batch's step times (decayed least squares); until those span
//! sizes enough, the backend's prior ratio `a / c` stands in (3 positions on the CPU, 32
//! on a GPU). Times older than 64 steps are not trusted; a batch that would step plainly
//! verifies one draft a row when that width has no fresh time, so a wrong prior or an
//! unlucky time does not keep it from speculating.
//! Each row's `alpha` is its own decayed count of accepted drafts over the drafts it
//! could have had accepted (a rejection ends a round's trials), from a prior of 0.7.
//!
//! A draft model's steps ([`Width::timing_plain`]) cost its forwards and its catch-up on
//! the tokens it lagged behind by, which neither the positions' line nor the prior
//! knows. There the catch-up is timed apart ([`Width::caught_up`]); a drafting size's
//! time, however old, stands for it until it is timed again, and one not timed is a
//! plain step's (the verification) plus a draft forward's for each draft, from the
//! nearest drafting size timed; a plain batch tries one draft a row again only once the
//! plain steps since its last try took ten times what that try and its catch-up took
//! (the try feeds the draft model every token of those steps, so trying every 64 steps
//! cost ~30% of a 32-row batch's time on the H200; with [`Width::try_widest`] the try is
//! the widest step instead, spaced from the last drafting step of any width); and a row
//! count not timed yet starts
//! from a near row count's times (at most 1.5x as many or as few rows). A drafting step
//! whose catch-up would take more than a share of the rows' remaining plain decoding
//! time is not taken ([`Width::expect_catch_up`]): the drafts could not repay it.

/// How many drafts a speculating batch verifies each step
/// ([`crate::batch::EngineOptions::prediction_drafts`] for drafts from predictions,
/// [`crate::batch::EngineOptions::model_drafts`] for the draft model's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DraftWidth {
    /// Each step as many as pay, from the batch's measured step times (`Width`; a
    /// draft model's steps are timed with its drafting). A prediction batch's step that
    /// verifies none is queued before the last step's tokens are read, as a plain
    /// batch's.
    #[default]
    Paying,
    /// Every draft in every step (a request's `num_draft_tokens`, as mlx-lm's
    /// speculative decoding).
    All,
    /// None: the rows decode plainly in their own batch. For measuring what speculation
    /// gains over the same batch without it.
    None,
}

impl DraftWidth {
    /// The environment variable `var` (`all`, `none`; anything else: `default`).
    pub fn from_env(var: &str, default: DraftWidth) -> DraftWidth {
        match std::env::var(var).as_deref() {
            Ok("all") => DraftWidth::All,
            Ok("none") => DraftWidth::None,
            _ => default,
        }
    }
}

/// Weight of older observations after each new one.
const DECAY: f64 = 0.95;
/// Weight of a row's older rounds after each new one.
const ROW_DECAY: f64 = 0.8;
/// The least coefficient of variation of the observed sizes that a slope is fitted to.
const MIN_SPREAD: f64 = 0.25;
/// How much more a step with drafts must be expected to emit per second than a plain
/// step (CPU, 8 streams of the default model: below this, drafting lost 7%-25%).
const MARGIN: f64 = 0.15;
/// Choices after which a size's time is stale (no longer trusted, timed again).
const STALE: u64 = 64;
/// Weight of the newest time of a size in its average.
const SEEN_WEIGHT: f64 = 0.3;
/// Its weight where it is above the average, with [`robust_times`].
const SEEN_WEIGHT_UP: f64 = 0.1;

/// `MLX_WIDTH_ROBUST_TIMES=1`: a size's newest time above its average weighs
/// `SEEN_WEIGHT_UP` in it instead of `SEEN_WEIGHT` (an experiment, off by default). A
/// step's time is its cost plus delays that only lengthen it (a prefill chunk or a
/// compile queued ahead of it), and one such step moved the one-stream server's time of
/// 8 positions a row from 46.8 to 64.1 ms, where drafting looked no better than plain
/// steps and the next try came seconds later (GPU.md session 48); real costs rise slowly
/// (the context's attention), which the lighter weight still follows.
fn robust_times() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_WIDTH_ROBUST_TIMES").as_deref() == Ok("1"))
}

/// The most of a draft-model batch's time that its tries of one draft a row take, over
/// the plain steps between them.
const EXPLORE_SHARE: f64 = 0.1;
/// A draft model's step of over this many seconds and `STALL_RATIO` plain steps is not
/// timed: a stall (on a fresh machine MLX compiles kernels for each new shape of the
/// draft model's first steps, 7-9 s a step on the H200, GPU.md session 32), which as
/// the width's time would keep the batch from drafting for good.
const STALL_SECS: f64 = 1.0;
const STALL_RATIO: f64 = 50.0;
/// A row's prior acceptance, as counts.
const PRIOR_HITS: f64 = 1.4;
const PRIOR_TRIALS: f64 = 2.0;

/// A row's acceptance estimate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acceptance {
    hits: f64,
    trials: f64,
}

impl Default for Acceptance {
    fn default() -> Acceptance {
        Acceptance {
            hits: PRIOR_HITS,
            trials: PRIOR_TRIALS,
        }
    }
}

impl Acceptance {
    /// A round that verified `drafted` drafts and accepted `accepted` of them (a round
    /// without drafts says nothing).
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let a = accepted as f64;
        self.hits = ROW_DECAY * self.hits + a;
        self.trials = ROW_DECAY * self.trials + a + f64::from(u8::from(accepted < drafted));
    }

    /// The chance that a draft is accepted after its predecessor was.
    pub fn rate(&self) -> f64 {
        (self.hits / self.trials).clamp(0.0, 1.0)
    }
}

/// The step-time model and the width choice.
#[derive(Debug, Clone)]
pub(crate) struct Width {
    /// The prior `a / c`, in positions.
    prior: f64,
    // Decayed sums of the observations (n positions, t seconds).
    s0: f64,
    s1: f64,
    s2: f64,
    sy: f64,
    sxy: f64,
    /// The recent step time of each size seen (an average of the last few) and the
    /// choice it was last seen at.
    seen: std::collections::BTreeMap<usize, (f64, u64)>,
    /// Choices made.
    choices: u64,
    /// Whether a plain step is timed when its time is not fresh, and drafting steps cost
    /// a draft model's forwards ([`Width::timing_plain`]).
    time_plain: bool,
    /// The last catch-up of a draft model on the tokens of the plain steps before a
    /// drafting step, in seconds ([`Width::caught_up`]).
    catch_up: f64,
    /// The expected time of the catch-up a drafting step would need now, and how many
    /// plain steps' time it may take ([`Width::expect_catch_up`]).
    next_catch_up: f64,
    catch_up_allowance: f64,
    /// Whether a draft model's try is its widest step ([`Width::try_widest`]).
    widest: bool,
}

impl Width {
    /// A model with the prior ratio `a / c` of `prior` positions.
    pub fn new(prior: f64) -> Width {
        Width {
            prior,
            s0: 0.0,
            s1: 0.0,
            s2: 0.0,
            sy: 0.0,
            sxy: 0.0,
            seen: std::collections::BTreeMap::new(),
            choices: 0,
            time_plain: false,
            catch_up: 0.0,
            next_catch_up: 0.0,
            catch_up_allowance: f64::INFINITY,
            widest: false,
        }
    }

    /// With [`Width::timing_plain`]: a plain batch's try of drafts is its widest step
    /// (every row's drafts) rather than one draft a row, and tries are spaced from its
    /// last drafting step of any width (off by default; `MLX_WIDTH_TRY_WIDEST=1` in the
    /// server). The draft model's catch-up costs a try the same at any width, and a try
    /// of one draft a row times a size that says little of the wider ones (its fixed
    /// cost spread over one draft): at 8 streams of the echo 8B pair on an H100 the batch
    /// stepped plainly behind an unlucky old time of 4 positions a row while each burst
    /// paid a one-draft try with its catch-up. Measured (GPU.md session 48): with it the
    /// 8-row batch drafted, at 62 ms a step of 8 positions a row (mean, its rows'
    /// catch-ups within) against eight plain steps' 57.6: not faster, so it stays off.
    pub fn try_widest(mut self, on: bool) -> Width {
        self.widest = on;
        self
    }

    /// Also times a plain step when a step with drafts is best and a plain one has no
    /// fresh time (off by default). A draft model's step costs its forwards, which the
    /// positions' line and the prior leave out: without a plain step's time its batch
    /// drafts on (the echo 8B bf16 with its own 4-bit copy at one stream on the H200:
    /// every draft accepted, 91 tok/s against 182 plain). Timing plain steps lets the
    /// draft model lag by many tokens, which its next drafting step feeds it (on by
    /// default on a GPU since session 31). Also what a drafting size's time stands for
    /// and how often one draft a row is tried (the module's note).
    pub fn timing_plain(mut self, on: bool) -> Width {
        self.time_plain = on;
        self
    }

    /// The prior of the device this thread runs on: 3 positions on the CPU, 32 on a GPU.
    pub fn for_current_device() -> Width {
        Width::new(if crate::step::on_gpu() { 32.0 } else { 3.0 })
    }

    /// A step of `n` positions took `secs` (timed with nothing else queued).
    pub fn observe(&mut self, n: usize, secs: f64) {
        if !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let x = n as f64;
        self.s0 = DECAY * self.s0 + 1.0;
        self.s1 = DECAY * self.s1 + x;
        self.s2 = DECAY * self.s2 + x * x;
        self.sy = DECAY * self.sy + secs;
        self.sxy = DECAY * self.sxy + x * secs;
        let up = if robust_times() {
            SEEN_WEIGHT_UP
        } else {
            SEEN_WEIGHT
        };
        remember(&mut self.seen, n, secs, self.choices, up);
    }

    /// Whether a draft model's step of `b` rows that took `secs` stalled (see
    /// `STALL_SECS`): then it is not timed.
    pub fn stalled(&self, b: usize, secs: f64) -> bool {
        self.time_plain
            && secs > STALL_SECS
            && self.last_time(b).is_some_and(|p| secs > STALL_RATIO * p)
    }

    /// Whether a draft model's catch-up of `lagged` tokens a row in a batch of `b` rows
    /// that took `secs` stalled: over `STALL_SECS` and longer than the target would take
    /// to decode those tokens one plain step at a time (or with no plain step timed
    /// yet). Then neither its time nor its rate is kept: on a fresh machine the first
    /// catch-ups wait for MLX to compile the draft's kernels (25.4 s for 132 tokens of
    /// one row on an H100, GPU.md session 43), and as the cost of trying drafts again
    /// such a time kept the batch from drafting for good.
    pub fn catch_up_stalled(&self, b: usize, lagged: usize, secs: f64) -> bool {
        self.time_plain
            && secs > STALL_SECS
            && self.last_time(b).is_none_or(|p| secs > lagged as f64 * p)
    }

    /// A draft model lagging behind plain steps took `secs` to catch up before a
    /// drafting step (timed apart from that step, whose own time is steady drafting's):
    /// what trying drafts again costs on top of that step.
    pub fn caught_up(&mut self, secs: f64) {
        if secs.is_finite() && secs >= 0.0 {
            self.catch_up = secs;
        }
    }

    /// A drafting step now would first feed the draft model the tokens it lags by,
    /// expected to take `secs`; it goes ahead only if that is at most the time of
    /// `allowance` plain steps (the caller's share of the rows' remaining tokens): a
    /// catch-up that the drafts cannot repay before the rows finish is not tried (the
    /// tail of a burst on the H200: 16 rows a few tokens from their end fed 257 tokens
    /// each for 354 ms, GPU.md session 32).
    pub fn expect_catch_up(&mut self, secs: f64, allowance: f64) {
        self.next_catch_up = secs;
        self.catch_up_allowance = allowance;
    }

    /// Whether the expected catch-up ([`Width::expect_catch_up`]) fits its allowance at
    /// this row count's plain step time (when there is one).
    fn catch_up_repaid(&self, b: usize) -> bool {
        // An infinite catch-up is one not to start now, timed plain step or not.
        self.next_catch_up.is_finite()
            && self
                .last_time(b)
                .is_none_or(|p| self.next_catch_up <= self.catch_up_allowance * p)
    }

    /// The expected time of a step of `n` positions in a batch of `b` rows: its recent
    /// time when that size was seen (for a draft model's drafting step, its last time,
    /// [`Width::drafting_cost`]), else the nearest size's time scaled by the linear model
    /// (or the linear model alone when none was seen). Step time need not be linear in
    /// the positions (on the CPU a step of 16 positions takes ~2x one of 8, not the
    /// line's 1.7x).
    fn cost(&self, n: usize, b: usize) -> f64 {
        if let Some(t) = self.fresh(n) {
            return t;
        }
        if let Some(t) = self.drafting_cost(n, b) {
            return t;
        }
        let fresh = |(&n, _): (&usize, _)| Some((n, self.fresh(n)?));
        let below = self.seen.range(..n).rev().find_map(fresh);
        let above = self.seen.range(n..).find_map(fresh);
        nearest(n, below, above)
            .and_then(|(n0, t0)| self.scaled(t0, n0, n))
            .unwrap_or_else(|| self.line(n))
    }

    /// The time `t0` of a step of `n0` positions scaled to `n` by the linear model
    /// (`None` where the line is not positive at `n0`).
    fn scaled(&self, t0: f64, n0: usize, n: usize) -> Option<f64> {
        let at = self.line(n0);
        (at > 0.0).then(|| t0 * self.line(n) / at)
    }

    /// The linear model's time of a step of `n` positions ([`Width::model`]'s unit).
    fn line(&self, n: usize) -> f64 {
        let (a, c) = self.model();
        a + c * n as f64
    }

    /// The last time of a step of `n` positions, however old.
    fn last_time(&self, n: usize) -> Option<f64> {
        self.seen.get(&n).map(|&(t, _)| t)
    }

    /// A draft model's drafting step of `n` positions in a batch of `b` rows
    /// ([`Width::timing_plain`]), from the drafting steps timed before however long ago:
    /// this size's last time, else from the nearest drafting size's time `t0` at `w0`
    /// drafts a row: a plain step's time `p` (the verification, host-bound on a GPU)
    /// and `(t0 - p) / w0` for each of the `w` draft forwards; without a plain step's
    /// time, `t0` scaled by the linear model. `None` for other widths, for a plain step
    /// and before any drafting step was timed: a plain step runs no draft forward, so it
    /// says nothing of what drafting costs, nor does the positions' prior.
    fn drafting_cost(&self, n: usize, b: usize) -> Option<f64> {
        if !self.time_plain || n <= b || b == 0 {
            return None;
        }
        if let Some(t) = self.last_time(n) {
            return Some(t);
        }
        let drafting = |(&m, &(t, _)): (&usize, &(f64, u64))| (m > b).then_some((m, t));
        let below = self.seen.range(..n).rev().find_map(drafting);
        let above = self.seen.range(n..).find_map(drafting);
        let (n0, t0) = nearest(n, below, above)?;
        let (w, w0) = (n / b - 1, n0 / b - 1);
        if let (Some(p), true) = (self.last_time(b), w0 > 0) {
            return Some(p + w as f64 * (t0 - p).max(0.0) / w0 as f64);
        }
        Some(self.scaled(t0, n0, n).unwrap_or(t0))
    }

    /// Whether one draft a row (`2 b` positions; with [`Width::try_widest`], a drafting
    /// step of any width) was timed lately: in the last `STALE` choices, or for a draft
    /// model's steps in fewer choices than make the plain steps since take
    /// `1 / EXPLORE_SHARE` times what that step and its catch-up took.
    fn tried_lately(&self, b: usize) -> bool {
        let last = if self.time_plain && self.widest {
            self.seen
                .iter()
                .filter(|(&m, _)| m > b)
                .map(|(_, &seen)| seen)
                .max_by_key(|&(_, at)| at)
        } else {
            self.seen.get(&(2 * b)).copied()
        };
        let Some((t, at)) = last else {
            return false;
        };
        let since = self.choices - at;
        if since <= STALE {
            return true;
        }
        match (self.time_plain, self.last_time(b)) {
            (true, Some(p)) => since as f64 * p < (t + self.catch_up) / EXPLORE_SHARE,
            _ => false,
        }
    }

    /// A copy for a batch of `to` rows of this model of `from` rows' steps: each size's
    /// time at the same width (`n` positions become `n to / from`), fresh as it was; the
    /// line is left to be fitted again. A draft model's row count that was not timed yet
    /// starts from the nearest one's times, so that it neither drafts nor steps plainly
    /// blind.
    pub fn for_rows(&self, from: usize, to: usize) -> Width {
        let mut w = Width::new(self.prior)
            .timing_plain(self.time_plain)
            .try_widest(self.widest);
        w.choices = self.choices;
        w.catch_up = self.catch_up;
        if from > 0 {
            w.seen = self
                .seen
                .iter()
                .map(|(&n, &seen)| (n * to / from, seen))
                .collect();
        }
        w
    }

    /// The time of size `n` if it was seen in the last `STALE` choices.
    fn fresh(&self, n: usize) -> Option<f64> {
        let &(t, at) = self.seen.get(&n)?;
        (self.choices - at <= STALE).then_some(t)
    }

    /// `(a, c)` of the step time `a + c n` in some unit: the fit when the observations
    /// span sizes enough to tell a slope (a coefficient of variation of at least
    /// `MIN_SPREAD`) and give a time growing with them, else the prior's.
    fn model(&self) -> (f64, f64) {
        if self.s0 >= 2.0 {
            let mean = self.s1 / self.s0;
            let var = self.s2 / self.s0 - mean * mean;
            if var >= MIN_SPREAD * MIN_SPREAD * mean * mean {
                let c = (self.s0 * self.sxy - self.s1 * self.sy)
                    / (self.s0 * self.s2 - self.s1 * self.s1);
                let a = (self.sy - c * self.s1) / self.s0;
                if c > 0.0 {
                    return (a.max(0.0), c);
                }
            }
        }
        (self.prior, 1.0)
    }

    /// The width (drafts verified a row, at most the most any row has) for rows of
    /// `(acceptance rate, drafts available)`.
    ///
    /// When that is 0 (a plain step) while some row has a draft and one draft a row was
    /// not timed lately (in the last `STALE` choices; for a draft model's steps see the
    /// module's note), it is 1 (and with [`Width::timing_plain`],
    /// when it is more while a plain step was not timed in those choices, it is 0): the
    /// step times then tell what each costs (the backend's prior may be far off for the
    /// model at hand).
    pub fn choose(&mut self, rows: &[(f64, usize)]) -> usize {
        self.choices += 1;
        self.best(rows)
    }

    /// Whether a step of `rows` rows (at most `(acceptance rate, drafts)` each: the
    /// drafts a row could have once its last token is read) is plain whatever its drafts
    /// turn out to be, with a fresh time for a plain step: then it may be queued before
    /// the last step's tokens are read. Counts as a choice when it is.
    ///
    /// A row's expected tokens at a width grow with its drafts and a plain step's do
    /// not, so a plain best at these bounds is the best at any drafts within them.
    pub fn stays_plain(&mut self, rows: &[(f64, usize)]) -> bool {
        if !self.knows_plain(rows.len()) || self.best(rows) != 0 {
            return false;
        }
        self.choices += 1;
        true
    }

    /// Whether a plain step of `b` rows was timed in the last `STALE` choices.
    pub fn knows_plain(&self, b: usize) -> bool {
        self.fresh(b).is_some()
    }

    /// The times this model holds, for a trace line: each size seen (positions: its
    /// time in ms and how many choices ago), the last catch-up and the expected one
    /// against its allowance.
    pub fn describe(&self) -> String {
        let seen: Vec<String> = self
            .seen
            .iter()
            .map(|(n, &(t, at))| format!("{n}:{:.2}ms@-{}", t * 1e3, self.choices - at))
            .collect();
        format!(
            "[{}] catch-up {:.1} ms, next {:.1} ms (allowance {:.1} plain steps)",
            seen.join(" "),
            self.catch_up * 1e3,
            self.next_catch_up * 1e3,
            self.catch_up_allowance
        )
    }

    /// [`Width::choose`] without counting the choice.
    fn best(&self, rows: &[(f64, usize)]) -> usize {
        let best = self.best_unexplored(rows);
        let b = rows.len();
        if best == 0 && most_drafts(rows) == 0 {
            return 0;
        }
        // Each way of stepping is timed now and then: one draft a row when stepping
        // plainly, and (with `time_plain`) a plain step first when it has no fresh time,
        // so that a draft model's try and its catch-up are weighed against it.
        let best = if best == 0 && !self.tried_lately(b) {
            self.try_width(rows)
        } else {
            best
        };
        if self.time_plain && best != 0 && !self.knows_plain(b) {
            return 0;
        }
        if best != 0 && !self.catch_up_repaid(b) {
            return 0;
        }
        best
    }

    /// The width of a try when no width pays by the times known (some row having a
    /// draft): one draft a row, or with [`Width::try_widest`] the most drafts a row has.
    fn try_width(&self, rows: &[(f64, usize)]) -> usize {
        if self.time_plain && self.widest {
            most_drafts(rows)
        } else {
            1
        }
    }

    /// The width of the most expected tokens a second by the times known.
    fn best_unexplored(&self, rows: &[(f64, usize)]) -> usize {
        let most = most_drafts(rows);
        if most == 0 {
            return 0;
        }
        let b = rows.len();
        let mut best = (0, f64::MIN);
        for w in 0..=most {
            let tokens: f64 = rows
                .iter()
                .map(|&(alpha, d)| {
                    let mut p = 1.0;
                    let mut e = 1.0;
                    for _ in 0..w.min(d) {
                        p *= alpha;
                        e += p;
                    }
                    e
                })
                .sum();
            // Drafting must beat a plain step by `MARGIN`: a wider step also costs what
            // the times leave out (more tokens for the host to record and stream while
            // the device waits, since a verification cannot be pipelined).
            let value =
                tokens / self.cost(b * (w + 1), b) / if w == 0 { 1.0 } else { 1.0 + MARGIN };
            if value > best.1 * (1.0 + 1e-9) {
                best = (w, value);
            }
        }
        best.0
    }
}

/// The most drafts any of `rows` (`(acceptance rate, drafts)`) has; 0 for none.
fn most_drafts(rows: &[(f64, usize)]) -> usize {
    rows.iter().map(|&(_, d)| d).max().unwrap_or(0)
}

/// The nearer to `n` of `below` and `above` (`(size, what it holds)`), the lower on a
/// tie.
pub(crate) fn nearest<T>(
    n: usize,
    below: Option<(usize, T)>,
    above: Option<(usize, T)>,
) -> Option<(usize, T)> {
    match (below, above) {
        (Some(b), Some(a)) => Some(if n - b.0 <= a.0 - n { b } else { a }),
        (b, a) => b.or(a),
    }
}

/// Puts `secs` into the recent time of `key` seen at choice `now` (averaged with a fresh
/// one, at weight `up` where it is above it, replacing a stale one).
fn remember(
    times: &mut std::collections::BTreeMap<usize, (f64, u64)>,
    key: usize,
    secs: f64,
    now: u64,
    up: f64,
) {
    times
        .entry(key)
        .and_modify(|(t, at)| {
            let w = match (now - *at <= STALE, secs > *t) {
                (false, _) => 1.0,
                (true, true) => up,
                (true, false) => SEEN_WEIGHT,
            };
            *t = w * secs + (1.0 - w) * *t;
            *at = now;
        })
        .or_insert((secs, now));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that timed sizes 8, 16 and 32 at the CPU's measured shape: 30 ms + 9.5 ms
    /// a position.
    fn cpu_shaped() -> Width {
        let mut w = Width::new(100.0);
        for n in [8usize, 32, 8, 32, 16] {
            w.observe(n, 0.030 + 0.0095 * n as f64);
        }
        w
    }

    #[test]
    fn nearly_free_width_verifies_every_draft() {
        // Step time that barely grows with the positions (a host-bound GPU step).
        let mut w = Width::new(3.0);
        for n in [4usize, 8, 16, 4, 8, 16] {
            w.observe(n, 0.010 + 1e-6 * n as f64);
        }
        assert_eq!(w.choose(&[(0.9, 5), (0.8, 3)]), 5);
    }

    #[test]
    fn a_draft_model_step_costlier_than_its_positions_is_timed_against_a_plain_one() {
        // One row whose drafts are all accepted, three drafts a step: each draft costs a
        // forward of the draft model, so a step of 4 positions takes 8x a plain one
        // (the 8B bf16 target with its 4-bit copy on the H200), which the line through
        // the GPU's prior cannot tell.
        let mut w = Width::new(32.0).timing_plain(true);
        for _ in 0..4 {
            w.observe(4, 0.044);
        }
        let rows = [(1.0, 3)];
        assert_eq!(w.best_unexplored(&rows), 3, "the line alone");
        // So a plain step is timed first...
        assert_eq!(w.choose(&rows), 0);
        w.observe(1, 0.0055);
        // ...then one draft (never timed) once...
        assert_eq!(w.choose(&rows), 1);
        w.observe(2, 0.018);
        // ...and 4 tokens in 44 ms or 2 in 18 lose to 1 in 5.5 ms.
        assert_eq!(w.choose(&rows), 0);
        assert!(w.stays_plain(&rows));
    }

    #[test]
    fn a_well_matched_draft_pays_at_its_pooled_rate_but_not_from_the_prior() {
        // One row, the echo 8B bf16 with its 4-bit copy on an H100 (session 41): plain
        // steps ~7 ms, a step verifying one draft ~11.5 ms (a draft forward, the
        // two-position verification, which cannot be pipelined).
        let mut w = Width::new(32.0).timing_plain(true);
        w.observe(1, 0.007);
        w.observe(2, 0.0115);
        // A row whose one try had its one draft accepted, from the prior (0.7): plain.
        let mut own = Acceptance::default();
        own.record(1, 1);
        assert_eq!(w.best_unexplored(&[(own.rate(), 3)]), 0);
        // The same row starting from the draft model's acceptance over earlier rows'
        // rounds (every draft accepted): three drafts a step, ~20.5 ms for 4 tokens.
        let mut pooled = Acceptance::default();
        for _ in 0..10 {
            pooled.record(3, 3);
        }
        pooled.record(1, 1);
        assert_eq!(w.best_unexplored(&[(pooled.rate(), 3)]), 3);
        // A draft model that is mostly rejected gives no such start.
        let mut poor = Acceptance::default();
        for _ in 0..10 {
            poor.record(3, 0);
        }
        assert_eq!(w.best_unexplored(&[(poor.rate(), 3)]), 0);
    }

    #[test]
    fn a_catch_up_that_waited_for_compilation_does_not_stop_drafting_for_good() {
        // One row of the echo 8B bf16 with its 4-bit copy on a fresh H100 (session 43's
        // trace): plain 7.22 ms, the draft model's first catch-up (132 tokens) 25.4 s
        // while MLX compiled its kernels, then one draft a row 27.6 ms.
        let mut w = Width::new(32.0).timing_plain(true);
        w.observe(1, 0.00722);
        assert!(w.catch_up_stalled(1, 132, 25.445));
        // A real catch-up (tens of ms), a CPU's (no plain steps timed apart), or one
        // longer than a second that still beats decoding its tokens one at a time, is
        // timed.
        assert!(!w.catch_up_stalled(1, 132, 0.030));
        assert!(!w.catch_up_stalled(1, 1000, 2.0));
        assert!(!Width::new(3.0).catch_up_stalled(1, 132, 25.445));
        w.observe(2, 0.0276);
        let rows = [(0.97, 7)];
        // Untimed, the stall leaves the catch-up at 0: one draft a row is tried again
        // once its time is stale (64 choices; the plain steps since then took more than
        // ten times its 27.6 ms).
        let tried = (0..128).find(|_| {
            let chosen = w.choose(&rows);
            w.observe(1, 0.00722);
            chosen > 0
        });
        assert!(matches!(tried, Some(i) if i >= 60), "{tried:?}");
        // Kept as the cost of trying (the trap), it would not be tried in 3,000 steps.
        let mut trapped = Width::new(32.0).timing_plain(true);
        trapped.observe(1, 0.00722);
        trapped.caught_up(25.445);
        trapped.observe(2, 0.0276);
        assert!((0..3000).all(|_| {
            let chosen = trapped.choose(&rows);
            trapped.observe(1, 0.00722);
            chosen == 0
        }));
    }

    /// A draft model's 32-row batch as the H200 ran it (session 31, echo 8B bf16 with its
    /// 4-bit copy): plain steps ~8.7 ms, a step with drafts 137-341 ms with the draft
    /// model's catch-up on the plain steps' tokens.
    fn draft_model_32_rows() -> Width {
        let mut w = Width::new(32.0).timing_plain(true);
        let rows = [(1.0, 3); 32];
        assert_eq!(w.choose(&rows), 0, "a plain step timed first");
        w.observe(32, 0.0087);
        assert_eq!(w.choose(&rows), 3, "the prior: drafts look nearly free");
        w.observe(128, 0.300);
        assert_eq!(w.choose(&rows), 1, "one draft a row tried");
        w.observe(64, 0.200);
        w
    }

    #[test]
    fn a_draft_models_old_drafting_times_stand_against_the_prior() {
        // Session 31's 32-row batch drafted again once its drafting times were 64 choices
        // old: the prior made 3 drafts a row look like 2.5 plain steps.
        let mut w = draft_model_32_rows();
        let rows = [(1.0, 3); 32];
        for i in 0..200 {
            assert!(w.stays_plain(&rows), "choice {i}");
            w.observe(32, 0.0087);
        }
        // A drafting size never timed: the plain step's time and a draft forward's for
        // each draft, from the nearest drafting size timed (64: 200 ms, so ~191 ms a
        // draft forward).
        let t = w.cost(96, 32);
        assert!((t - (0.0087 + 2.0 * (0.2 - 0.0087))).abs() < 1e-9, "{t}");
    }

    #[test]
    fn a_draft_model_step_that_pays_is_told_from_its_draft_forwards() {
        // 8 rows, every draft accepted: plain 8.5 ms; one draft a row 13 ms (a draft
        // forward ~4.5 ms): three drafts a row ~22 ms for 4 tokens a row, never timed.
        let mut w = Width::new(32.0).timing_plain(true);
        let rows = [(1.0, 3); 8];
        w.observe(8, 0.0085);
        w.observe(16, 0.013);
        assert_eq!(w.best_unexplored(&rows), 3);
        assert!((w.cost(32, 8) - 0.022).abs() < 1e-9);
    }

    #[test]
    fn a_draft_model_tries_one_draft_when_plain_steps_took_ten_times_its_last_try() {
        let mut w = draft_model_32_rows();
        let rows = [(1.0, 3); 32];
        // 0.2 s a try and 0.1 s its catch-up against 8.7 ms a plain step: tried again
        // after ~345 plain steps.
        w.caught_up(0.1);
        let mut plain = 0;
        while w.choose(&rows) == 0 {
            w.observe(32, 0.0087);
            plain += 1;
            assert!(plain < 1000);
        }
        assert!((340..=350).contains(&plain), "{plain}");
        // A try that found drafts cheap again (the rows' lag was short) is trusted.
        w.observe(64, 0.012);
        assert!(w.choose(&rows) >= 1);
        // Without a draft model the try comes every `STALE` choices, as before.
        let mut p = Width::new(32.0);
        p.observe(32, 0.0087);
        p.observe(64, 0.2);
        let mut plain = 0;
        while p.choose(&rows) == 0 {
            p.observe(32, 0.0087);
            plain += 1;
        }
        assert_eq!(plain as u64, STALE);
    }

    #[test]
    fn a_draft_model_step_that_stalled_is_not_its_width_s_time() {
        // The fresh H200 of session 32: an 8-row step with drafts took 7.2 s while MLX
        // compiled its kernels, against ~6 ms plain steps.
        let mut w = Width::new(32.0).timing_plain(true);
        w.observe(8, 0.006);
        assert!(w.stalled(8, 7.2));
        assert!(!w.stalled(8, 0.030), "a slow step is still a time");
        assert!(
            !Width::new(32.0).stalled(8, 7.2),
            "no plain time: nothing to tell by"
        );
        let mut p = Width::new(32.0);
        p.observe(8, 0.006);
        assert!(!p.stalled(8, 7.2), "only a draft model's steps");
    }

    #[test]
    fn a_widest_try_replaces_an_unlucky_old_time() {
        // Session 48's 8 rows of the echo 8B pair on an H100, every draft accepted: plain
        // 8.3 ms, 4 positions a row once 59.2 ms (an unlucky step), one draft a row 19.5
        // ms. Seven drafts a row, never timed, look like 127 ms from the 4-position time,
        // so the batch steps plainly. By default its tries are one draft a row, which
        // keep that estimate; with `try_widest` the try is 7 drafts a row, which took 48
        // ms: it drafts from then on.
        for widest in [false, true] {
            let mut w = Width::new(32.0).timing_plain(true).try_widest(widest);
            w.observe(8, 0.0083);
            w.observe(32, 0.0592);
            w.observe(16, 0.0195);
            w.caught_up(0.09);
            let rows = [(1.0, 7); 8];
            assert_eq!(w.best_unexplored(&rows), 0);
            let mut plain = 0;
            let tried = loop {
                let chosen = w.choose(&rows);
                if chosen > 0 {
                    break chosen;
                }
                w.observe(8, 0.0083);
                plain += 1;
                assert!(plain < 1000);
            };
            if widest {
                assert_eq!(tried, 7);
                w.observe(64, 0.048);
                assert_eq!(w.choose(&rows), 7);
            } else {
                assert_eq!(tried, 1);
                w.observe(16, 0.0195);
                assert_eq!(w.choose(&rows), 0);
            }
        }
    }

    #[test]
    fn a_slow_step_moves_a_robust_time_less() {
        // Session 48's one stream: 8 positions a row at 46.8 ms, then one step of 104.5
        // ms (a delay queued ahead of it). The plain mean moves to 64.1 ms, where 8 tokens
        // are worth less than plain steps of 7.87 ms with the margin; the robust one to
        // 52.6 ms, where they still pay. Faster times weigh the same either way.
        let rows = [(1.0, 7)];
        for (up, drafts) in [(SEEN_WEIGHT, 0), (SEEN_WEIGHT_UP, 7)] {
            let mut w = Width::new(32.0).timing_plain(true);
            w.observe(1, 0.00787);
            remember(&mut w.seen, 8, 0.0468, w.choices, up);
            remember(&mut w.seen, 8, 0.1045, w.choices, up);
            assert_eq!(w.best_unexplored(&rows), drafts, "up weight {up}");
            remember(&mut w.seen, 8, 0.040, w.choices, up);
            let t = w.last_time(8).expect("timed");
            let slow = up * 0.1045 + (1.0 - up) * 0.0468;
            assert!((t - (SEEN_WEIGHT * 0.040 + (1.0 - SEEN_WEIGHT) * slow)).abs() < 1e-12);
        }
    }

    #[test]
    fn a_held_catch_up_keeps_a_paying_width_plain() {
        // One row whose 7 drafts pay (session 48's times: a plain step 7.34 ms, 8
        // positions 40.3 ms, every draft accepted) while 31 prompts wait to join: the
        // catch-up is held (infinite), so the step is plain and may be queued; once they
        // joined (a finite catch-up within its allowance) it drafts again.
        let mut w = Width::new(32.0).timing_plain(true);
        w.observe(1, 0.00734);
        w.observe(8, 0.0403);
        let rows = [(1.0, 7)];
        w.expect_catch_up(0.0138, 32.0);
        assert_eq!(w.choose(&rows), 7);
        w.expect_catch_up(f64::INFINITY, 0.0);
        assert_eq!(w.choose(&rows), 0);
        assert!(w.stays_plain(&rows));
        w.expect_catch_up(0.0138, 32.0);
        assert_eq!(w.choose(&rows), 7);
    }

    #[test]
    fn a_catch_up_the_rows_remaining_tokens_cannot_repay_is_not_tried() {
        // The tail of session 32's burst: 16 rows, plain steps of 8 ms known, drafting
        // never timed at this row count (the prior makes it look nearly free), a lag of
        // 257 tokens a row expected to take 0.34 s to feed.
        let fresh = || {
            let mut w = Width::new(32.0).timing_plain(true);
            w.observe(16, 0.008);
            w
        };
        let rows = [(1.0, 3); 16];
        let mut w = fresh();
        assert!(
            w.choose(&rows) > 0,
            "no catch-up expected: drafts are tried"
        );
        // A few tokens left a row (a quarter of 5 plain steps: 10 ms): plain, queued.
        let mut w = fresh();
        w.expect_catch_up(0.34, 0.25 * 5.0);
        assert_eq!(w.choose(&rows), 0);
        assert!(w.stays_plain(&rows));
        // 200 tokens left a row (a quarter: 0.4 s of plain steps): worth trying.
        let mut w = fresh();
        w.expect_catch_up(0.34, 0.25 * 200.0);
        assert!(w.choose(&rows) > 0);
        // No plain time to weigh it by: a plain step is timed first, also before a try
        // of one draft a row (a row count that met drafting times only: session 33's
        // tail of 15 rows tried drafts at its first step).
        let mut w = Width::new(32.0).timing_plain(true);
        w.observe(30, 0.200);
        w.expect_catch_up(0.34, 0.25 * 5.0);
        assert_eq!(w.choose(&rows), 0, "plain first");
        w.observe(16, 0.008);
        assert_eq!(w.choose(&rows), 0, "then weighed: not repaid");
        w.expect_catch_up(0.0, 0.0);
        assert_eq!(
            w.choose(&rows),
            1,
            "no lag: nothing to repay, one draft tried"
        );
    }

    #[test]
    fn a_new_row_count_starts_from_the_nearest_ones_times() {
        let w = draft_model_32_rows();
        let mut w20 = w.for_rows(32, 20);
        assert_eq!(w20.seen.keys().copied().collect::<Vec<_>>(), [20, 40, 80]);
        // Known plain and costly to draft at 20 rows too: queued plain steps, no try.
        assert!(w20.stays_plain(&[(1.0, 3); 20]));
        assert_eq!(w20.choose(&[(1.0, 3); 20]), 0);
    }

    #[test]
    fn noise_at_one_size_is_not_a_slope() {
        // Sizes 7 and 8 with the smaller one slower (a step that also filtered caches):
        // the prior, not a free width.
        let mut w = Width::new(3.0);
        for _ in 0..20 {
            w.observe(8, 0.100);
        }
        w.observe(7, 0.210);
        assert_eq!(w.model(), (3.0, 1.0));
        // One draft a row was never timed: tried once.
        assert_eq!(w.choose(&[(0.3, 10); 8]), 1);
        w.observe(16, 0.200);
        assert_eq!(w.choose(&[(0.3, 10); 8]), 0);
    }

    #[test]
    fn a_plain_batch_times_one_draft_again_once_its_time_is_stale() {
        let mut w = Width::new(3.0);
        w.observe(8, 0.100);
        w.observe(16, 0.250);
        let rows = [(0.5, 2); 8];
        for _ in 0..STALE {
            assert_eq!(w.choose(&rows), 0);
            w.observe(8, 0.100);
        }
        assert_eq!(w.choose(&rows), 1);
        // Measured cheap this time (another phase of the batch): drafts are verified.
        w.observe(16, 0.110);
        assert!(w.choose(&rows) >= 1);
    }

    #[test]
    fn a_step_plain_at_the_most_drafts_is_known_plain_before_they_are() {
        // Nothing timed: a plain step's time is not known, so it is not queued blind.
        assert!(!Width::new(100.0).stays_plain(&[(0.3, 3); 8]));
        let mut w = cpu_shaped();
        assert!(w.stays_plain(&[(0.3, 3); 8]));
        // Drafts that may pay: read the tokens first and choose.
        assert!(!w.stays_plain(&[(0.95, 3)]));
        // Counted as choices: the plain time goes stale and is timed again.
        for _ in 0..STALE {
            w.stays_plain(&[(0.3, 3); 8]);
        }
        assert!(!w.stays_plain(&[(0.3, 3); 8]));
    }

    #[test]
    fn costly_width_needs_acceptance() {
        let mut w = cpu_shaped();
        // Eight rows that rarely accept: plain steps.
        assert_eq!(w.choose(&[(0.3, 3); 8]), 0);
        // One row that nearly always accepts: its drafts.
        assert_eq!(w.choose(&[(0.95, 3)]), 3);
        // No drafts available: a plain step.
        assert_eq!(w.choose(&[(0.95, 0); 4]), 0);
    }

    #[test]
    fn a_measured_size_overrides_the_line() {
        // The line says 16 positions cost 1.7x 8; measured, they cost 2x: no row can
        // double its tokens with one draft, so plain steps.
        let mut w = Width::new(3.0);
        for _ in 0..4 {
            w.observe(8, 0.100);
            w.observe(32, 0.317);
        }
        let rows = [(0.95, 1); 8];
        assert_eq!(w.choose(&rows), 1, "before 16 positions were timed");
        for _ in 0..4 {
            w.observe(16, 0.200);
        }
        assert_eq!(w.choose(&rows), 0);
    }

    #[test]
    fn the_prior_stands_until_two_sizes_are_seen() {
        let mut w = Width::new(3.0);
        w.observe(8, 0.1);
        w.observe(8, 0.1);
        assert_eq!(w.model(), (3.0, 1.0));
        w.observe(32, 0.3);
        let (a, c) = w.model();
        assert!(c > 0.0 && a >= 0.0, "{a} {c}");
    }

    #[test]
    fn acceptance_learns_from_rounds_with_drafts() {
        let mut a = Acceptance::default();
        assert!((a.rate() - 0.7).abs() < 1e-12);
        a.record(0, 0);
        assert!((a.rate() - 0.7).abs() < 1e-12);
        for _ in 0..20 {
            a.record(3, 0);
        }
        assert!(a.rate() < 0.01, "{}", a.rate());
        for _ in 0..20 {
            a.record(3, 3);
        }
        assert!(a.rate() > 0.99, "{}", a.rate());
    }
}

//! Opt-in per-token timing of the decode loop (`MLX_ENGINE_PROFILE=1`): the single
//! generator's [`DecodeProfile`], the speculative generator's [`RoundProfile`] and the
//! server's batched steps' [`BatchProfile`].
//!
//! Splits each decode step's host time into graph construction (the Rust model
//! forward, processors and sampler: every op handed to MLX), `async_eval` (MLX
//! scheduling and encoding the step's kernels) and waiting for the previous token
//! (reading it back), and prints the means to stderr when the generator is dropped.
//! Off, it costs one cached flag test per token.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Whether `MLX_ENGINE_PROFILE` is set to something other than `0` or empty.
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_ENGINE_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// `MLX_ENGINE_PROFILE=sync`: the speculative generator waits for each draft step
/// (`eval` instead of `async_eval`), so the profile's per-step times are each step's
/// own device time plus its host time (a diagnostic: slower than the default).
pub(crate) fn sync() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_ENGINE_PROFILE").is_ok_and(|v| v == "sync"))
}

/// Accumulated decode-step times.
#[derive(Debug, Default)]
pub(crate) struct DecodeProfile {
    steps: u32,
    build: Duration,
    schedule: Duration,
    wait: Duration,
    total: Duration,
    last: Option<Instant>,
}

impl DecodeProfile {
    /// Records one decode step (the first token's step, which includes the prompt, is
    /// left out by the caller).
    pub(crate) fn add(&mut self, build: Duration, schedule: Duration, wait: Duration) {
        self.steps += 1;
        self.build += build;
        self.schedule += schedule;
        self.wait += wait;
        let now = Instant::now();
        if let Some(prev) = self.last.replace(now) {
            self.total += now - prev;
        }
    }

    /// Marks the start of timed decode steps (the first token has been read).
    pub(crate) fn start(&mut self) {
        self.last = Some(Instant::now());
    }

    /// One line of means in microseconds per token.
    pub(crate) fn summary(&self) -> Option<String> {
        if self.steps == 0 {
            return None;
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(self.steps);
        let between = self.total.as_secs_f64() * 1e6 / f64::from(self.steps.max(1));
        Some(format!(
            "[mlx-engine profile] decode steps {}: build {:.0} us, async_eval {:.0} us, \
             wait+read {:.0} us, token-to-token {:.0} us (host outside next_token {:.0} us)",
            self.steps,
            us(self.build),
            us(self.schedule),
            us(self.wait),
            between,
            between - us(self.build) - us(self.schedule) - us(self.wait),
        ))
    }
}

/// Accumulated times of speculative rounds (`speculative.rs`): the prompt (both
/// models' prefill), the first round alone (where kernels are compiled or loaded), then
/// the means of the later rounds: the draft's steps (graph building and their
/// `async_eval`s, those also apart; the draft model's kernels run meanwhile), building
/// the target's verification and sampling graph, and the wait for the round's tokens
/// (everything queued in the round finishing on the device, read back).
#[derive(Debug, Default)]
pub(crate) struct RoundProfile {
    prompt: Duration,
    first: Option<Duration>,
    /// Every later round's first draft step's `async_eval` (it also feeds the draft
    /// what the last round left it behind by), and the other steps' with their count;
    /// together the rounds' draft `async_eval`s.
    step_first: Duration,
    step_rest: Duration,
    rest_steps: u64,
    /// The current round's first and other steps' `async_eval`s.
    pending_first: Duration,
    pending_rest: (Duration, u64),
    rounds: u32,
    drafted: u64,
    draft: Duration,
    verify: Duration,
    wait: Duration,
    total: Duration,
    last: Option<Instant>,
}

impl RoundProfile {
    /// Records the prompt's prefill and starts the round clock.
    pub(crate) fn prompt(&mut self, d: Duration) {
        self.prompt += d;
        self.last = Some(Instant::now());
    }

    /// Adds the `async_eval` of draft step `i` (from 0) of the current round.
    pub(crate) fn draft_eval(&mut self, i: usize, d: Duration) {
        if i == 0 {
            self.pending_first += d;
        } else {
            self.pending_rest.0 += d;
            self.pending_rest.1 += 1;
        }
    }

    /// Records one round that drafted `drafted` tokens.
    pub(crate) fn round(
        &mut self,
        drafted: usize,
        draft: Duration,
        verify: Duration,
        wait: Duration,
    ) {
        let now = Instant::now();
        let first_step = std::mem::take(&mut self.pending_first);
        let (rest, rest_steps) = std::mem::take(&mut self.pending_rest);
        let since = self.last.replace(now).map(|prev| now - prev);
        if self.first.is_none() {
            self.first = Some(since.unwrap_or(draft + verify + wait));
            return;
        }
        self.rounds += 1;
        self.drafted += drafted as u64;
        self.draft += draft;
        self.step_first += first_step;
        self.step_rest += rest;
        self.rest_steps += rest_steps;
        self.verify += verify;
        self.wait += wait;
        self.total += since.unwrap_or_default();
    }

    /// One line: the prompt and first round in milliseconds, the later rounds' means in
    /// microseconds.
    pub(crate) fn summary(&self) -> Option<String> {
        let first = self.first?;
        let n = f64::from(self.rounds.max(1));
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
        Some(format!(
            "[mlx-engine profile] prompt {:.0} ms, first round {:.0} ms; later rounds {} \
             ({:.2} drafts a round): draft {:.0} us (async_eval {:.0} us: step 1 {:.0} us, \
             later steps {:.0} us each), verify build {:.0} us, wait+read {:.0} us, round \
             to round {:.0} us{}",
            self.prompt.as_secs_f64() * 1e3,
            first.as_secs_f64() * 1e3,
            self.rounds,
            self.drafted as f64 / n,
            us(self.draft),
            us(self.step_first + self.step_rest),
            us(self.step_first),
            self.step_rest.as_secs_f64() * 1e6 / self.rest_steps.max(1) as f64,
            us(self.verify),
            us(self.wait),
            us(self.total),
            if sync() {
                " (draft steps waited for)"
            } else {
                ""
            },
        ))
    }
}

/// Accumulated host times of the server's batched decode steps
/// (`batch::decode::DecodeBatch::step`), printed to stderr every [`BatchProfile::EVERY`]
/// steps: building the forward graph, `async_eval` of the forward, waiting for the
/// previous step's tokens and recording them (the processors' `accept`), the rows'
/// processors and sampler (graph building, constraint masks included), and `async_eval`
/// of the sampling; for constrained rows also the grammar's own time
/// ([`constraint_mask`], [`constraint_accept`]).
#[derive(Debug, Default)]
pub(crate) struct BatchProfile {
    steps: u32,
    rows: u64,
    constrained: u64,
    /// Time per phase, in [`BatchPhase`] order.
    phases: [Duration; BatchPhase::COUNT],
    total: Duration,
    intervals: u32,
    last: Option<Instant>,
}

/// The timed phases of a batched decode step.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BatchPhase {
    /// The model's forward graph.
    Forward,
    /// `async_eval` of the forward (rows whose processors need the accepted token).
    ForwardEval,
    /// Waiting for the previous step's tokens and reading them back.
    Wait,
    /// Recording them (stop checks, the processors' `accept`).
    Record,
    /// Grammar masks computed on the host ahead of the sampling graph.
    Masks,
    /// The processors' and samplers' graph.
    Sample,
    /// `async_eval` of the sampling (of the whole step without a grammar).
    SampleEval,
}

impl BatchPhase {
    const COUNT: usize = 7;
    const NAMES: [&'static str; Self::COUNT] = [
        "forward",
        "forward async_eval",
        "wait",
        "record",
        "masks",
        "sample",
        "sample async_eval",
    ];
}

static MASK_NS: AtomicU64 = AtomicU64::new(0);
static MASKS: AtomicU64 = AtomicU64::new(0);
static ACCEPT_NS: AtomicU64 = AtomicU64::new(0);

/// Adds the time of one grammar mask (llguidance's `compute_mask` and the bitset copy).
pub(crate) fn constraint_mask(d: Duration) {
    MASK_NS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    MASKS.fetch_add(1, Ordering::Relaxed);
}

/// Adds the time of one grammar `consume_token`.
pub(crate) fn constraint_accept(d: Duration) {
    ACCEPT_NS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
}

impl BatchProfile {
    /// Steps between two printed summaries by default.
    pub(crate) const EVERY: u32 = 256;

    /// Steps between two printed summaries: `MLX_ENGINE_PROFILE_EVERY` (a positive
    /// count, read once), else [`Self::EVERY`].
    pub(crate) fn every() -> u32 {
        static EVERY: OnceLock<u32> = OnceLock::new();
        *EVERY.get_or_init(|| {
            std::env::var("MLX_ENGINE_PROFILE_EVERY")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|&n| n > 0)
                .unwrap_or(Self::EVERY)
        })
    }

    /// Adds `d` to `phase` of the current step.
    pub(crate) fn add(&mut self, phase: BatchPhase, d: Duration) {
        self.phases[phase as usize] += d;
    }

    /// Ends a step of `rows` rows, `constrained` of them with a grammar; every
    /// [`Self::every`] steps returns the summary line and starts over.
    pub(crate) fn step(&mut self, rows: usize, constrained: usize) -> Option<String> {
        self.steps += 1;
        self.rows += rows as u64;
        self.constrained += constrained as u64;
        let now = Instant::now();
        if let Some(prev) = self.last.replace(now) {
            self.total += now - prev;
            self.intervals += 1;
        }
        if self.steps < Self::every() {
            return None;
        }
        let line = self.summary();
        *self = BatchProfile {
            last: self.last,
            ..Default::default()
        };
        Some(line)
    }

    fn summary(&self) -> String {
        let n = f64::from(self.steps.max(1));
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
        let masks = MASKS.swap(0, Ordering::Relaxed).max(1) as f64;
        let mask_ns = MASK_NS.swap(0, Ordering::Relaxed) as f64;
        let accept_ns = ACCEPT_NS.swap(0, Ordering::Relaxed) as f64;
        let phases: Vec<String> = BatchPhase::NAMES
            .iter()
            .zip(&self.phases)
            .map(|(name, &d)| format!("{name} {:.0}", us(d)))
            .collect();
        let step_to_step = self.total.as_secs_f64() * 1e6 / f64::from(self.intervals.max(1));
        format!(
            "[mlx-engine profile] batched decode, {} steps, {:.1} rows ({:.1} constrained) \
             per step, us per step: {}; step to step {:.0}; grammar per row: mask {:.0} us, \
             accept {:.0} us; host buffers pooled {}, advised {}",
            self.steps,
            self.rows as f64 / n,
            self.constrained as f64 / n,
            phases.join(", "),
            step_to_step,
            mask_ns / masks / 1e3,
            accept_ns / masks / 1e3,
            mlx_array::memory::host_buffer_pool_reuses(),
            mlx_array::memory::host_buffer_pool_advised(),
        )
    }
}

/// The timed phases of a speculating batch's step (`batch::speculate::SpecBatch::step`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum SpecPhase {
    /// Reading a queued plain step's tokens before a drafting step.
    Flush,
    /// Waiting for what was queued before a timed step (the plain batch's step, a
    /// prefill chunk), choosing the width.
    Before,
    /// The draft model's catch-up on the tokens it lags by (waited for when timed).
    CatchUp,
    /// The draft model's forwards: their graphs and `async_eval`s.
    Draft,
    /// Waiting for the drafts and reading them back.
    DraftRead,
    /// The verification forward's graph (under `MLX_ENGINE_PROFILE=sync` also its
    /// device time).
    VerifyForward,
    /// The rows' processors and samplers over the verified positions.
    VerifySample,
    /// Waiting for the verification's tokens and reading them back.
    VerifyWait,
    /// Trimming and rolling both models' caches, timing the step.
    Keep,
    /// Recording the emitted tokens.
    Emit,
    /// A plain step (queued; its tokens read during the next step).
    Plain,
}

impl SpecPhase {
    const COUNT: usize = 11;
    const NAMES: [&'static str; Self::COUNT] = [
        "flush",
        "before",
        "catch-up",
        "draft",
        "draft read",
        "verify forward",
        "verify sample",
        "verify wait",
        "keep",
        "emit",
        "plain",
    ];
}

/// One shape's (rows, positions) accumulated step times.
#[derive(Debug, Default, Clone)]
struct ShapeTimes {
    steps: u32,
    phases: [Duration; SpecPhase::COUNT],
    total: Duration,
    min: Option<Duration>,
    /// The shape's first step, once it ran.
    first: Option<Duration>,
}

/// Accumulated host times of a speculating batch's steps, by shape (rows and verified
/// positions a row; plain steps are one position), printed to stderr every
/// [`BatchProfile::every`] steps: where a drafting step's time goes (the draft's
/// forwards and their read, the verification's forward, sampling and wait, the caches'
/// trims), each shape's first step (kernel compiles and loads) apart from the mean of
/// the others, and the fastest.
#[derive(Debug, Default)]
pub(crate) struct SpecProfile {
    lap: Option<Instant>,
    current: [Duration; SpecPhase::COUNT],
    shapes: std::collections::BTreeMap<(usize, usize), ShapeTimes>,
    steps: u32,
    /// Step to step (between two steps' starts), and the steps it spans.
    between: Duration,
    intervals: u32,
    started: Option<Instant>,
}

impl SpecProfile {
    /// Starts a step.
    pub(crate) fn begin(&mut self) {
        let now = Instant::now();
        if let Some(prev) = self.started.replace(now) {
            self.between += now - prev;
            self.intervals += 1;
        }
        self.lap = Some(now);
        self.current = Default::default();
    }

    /// Adds the time since the last mark to `phase` of the current step.
    pub(crate) fn mark(&mut self, phase: SpecPhase) {
        if let Some(t) = self.lap.as_mut() {
            let now = Instant::now();
            self.current[phase as usize] += now - *t;
            *t = now;
        }
    }

    /// Ends the current step, of `rows` rows and `positions` positions a row; every
    /// [`BatchProfile::every`] steps returns the summary and starts over.
    pub(crate) fn end(&mut self, rows: usize, positions: usize) -> Option<String> {
        self.lap.take()?;
        let total: Duration = self.current.iter().sum();
        let s = self.shapes.entry((rows, positions)).or_default();
        if s.first.is_none() {
            // A shape's first step stands apart (it may compile kernels).
            s.first = Some(total);
        } else {
            s.steps += 1;
            s.total += total;
            s.min = Some(s.min.map_or(total, |m| m.min(total)));
            for (a, &d) in s.phases.iter_mut().zip(&self.current) {
                *a += d;
            }
        }
        self.steps += 1;
        if self.steps < BatchProfile::every() {
            return None;
        }
        let line = self.summary();
        self.steps = 0;
        self.between = Duration::ZERO;
        self.intervals = 0;
        for s in self.shapes.values_mut() {
            *s = ShapeTimes {
                first: s.first,
                ..Default::default()
            };
        }
        Some(line)
    }

    fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut out = format!(
            "[mlx-engine profile] speculating batch, {} steps, step to step {:.2} ms{}",
            self.steps,
            ms(self.between) / f64::from(self.intervals.max(1)),
            if sync() { " (forwards waited for)" } else { "" },
        );
        for (&(rows, positions), s) in &self.shapes {
            if s.steps == 0 {
                continue;
            }
            let n = f64::from(s.steps);
            let phases: Vec<String> = SpecPhase::NAMES
                .iter()
                .zip(&s.phases)
                .filter(|(_, d)| !d.is_zero())
                .map(|(name, &d)| format!("{name} {:.2}", ms(d) / n))
                .collect();
            out.push_str(&format!(
                "\n[mlx-engine profile]   {rows} row(s) x {positions} position(s): {} steps, \
                 mean {:.2} ms (min {:.2}, first {:.2}): {}",
                s.steps,
                ms(s.total) / n,
                s.min.map_or(0.0, ms),
                s.first.map_or(0.0, ms),
                phases.join(", "),
            ));
        }
        out
    }
}

/// A stopwatch over the phases of a step (does nothing when profiling is off).
pub(crate) struct Lap(Option<Instant>);

impl Lap {
    /// Starts timing when `on`.
    pub(crate) fn new(on: bool) -> Lap {
        Lap(on.then(Instant::now))
    }

    /// Adds the time since the last mark to `phase` of `profile`.
    pub(crate) fn mark(&mut self, profile: &mut Option<Box<BatchProfile>>, phase: BatchPhase) {
        if let (Some(t), Some(p)) = (self.0.as_mut(), profile.as_mut()) {
            let now = Instant::now();
            p.add(phase, now - *t);
            *t = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_profile_prints_means_every_256_steps_and_starts_over() {
        let mut p = BatchProfile::default();
        for i in 0..BatchProfile::EVERY {
            p.add(BatchPhase::Forward, Duration::from_micros(100));
            let masks = if i % 2 == 0 { 10 } else { 30 };
            p.add(BatchPhase::Masks, Duration::from_micros(masks));
            let line = p.step(4, 2);
            assert_eq!(line.is_some(), i + 1 == BatchProfile::EVERY);
            if let Some(l) = line {
                assert!(l.contains("256 steps, 4.0 rows (2.0 constrained)"), "{l}");
                assert!(l.contains(": forward 100, forward async_eval 0,"), "{l}");
                assert!(l.contains(", masks 20, sample 0,"), "{l}");
            }
        }
        assert_eq!((p.steps, p.rows), (0, 0));
        assert!(p.step(1, 0).is_none());
    }

    #[test]
    fn spec_profile_sets_each_shapes_first_step_apart() {
        let mut p = SpecProfile::default();
        let ms = Duration::from_millis;
        // Phases are charged by `mark`; here their sums are set directly.
        for (rows, positions, draft, verify) in
            [(1, 2, 50, 10), (1, 2, 3, 9), (1, 2, 5, 7), (4, 1, 0, 8)]
        {
            p.begin();
            p.current[SpecPhase::Draft as usize] = ms(draft);
            p.current[SpecPhase::VerifyWait as usize] = ms(verify);
            assert!(p.end(rows, positions).is_none());
        }
        let s = p.summary();
        assert!(s.contains("speculating batch, 4 steps"), "{s}");
        assert!(
            s.contains(
                "1 row(s) x 2 position(s): 2 steps, mean 12.00 ms (min 12.00, first 60.00): \
                 draft 4.00, verify wait 8.00"
            ),
            "{s}"
        );
        // A shape seen only once has no later steps to show.
        assert!(!s.contains("4 row(s)"), "{s}");
        // `end` without `begin` records nothing.
        assert!(p.end(1, 2).is_none());
        assert_eq!(p.steps, 4);
    }

    #[test]
    fn round_profile_sets_the_first_round_apart_and_averages_the_rest() {
        let mut p = RoundProfile::default();
        assert_eq!(p.summary(), None);
        let ms = Duration::from_millis;
        p.prompt(ms(12));
        p.round(3, ms(900), ms(50), ms(50));
        p.round(3, ms(1), ms(2), ms(10));
        p.draft_eval(0, ms(1));
        p.draft_eval(1, ms(3));
        p.draft_eval(2, ms(5));
        p.round(1, ms(3), ms(4), ms(20));
        let s = p.summary().unwrap();
        assert!(
            s.starts_with("[mlx-engine profile] prompt 12 ms, first round "),
            "{s}"
        );
        assert!(
            s.contains(
                "later rounds 2 (2.00 drafts a round): draft 2000 us (async_eval 4500 \
                 us: step 1 500 us, later steps 4000 us each), verify build 3000 us, \
                 wait+read 15000 us"
            ),
            "{s}"
        );
    }

    #[test]
    fn summary_is_empty_without_steps_and_averages_per_step() {
        let mut p = DecodeProfile::default();
        assert_eq!(p.summary(), None);
        p.start();
        p.add(
            Duration::from_micros(100),
            Duration::from_micros(300),
            Duration::from_micros(10),
        );
        p.add(
            Duration::from_micros(300),
            Duration::from_micros(500),
            Duration::from_micros(30),
        );
        let s = p.summary().unwrap();
        assert!(
            s.contains("decode steps 2: build 200 us, async_eval 400 us, wait+read 20 us"),
            "{s}"
        );
    }
}

//! What the scheduler counts, as atomics any thread may read (the server renders them
//! for `GET /metrics`; [`crate::batch::BatchGenerator`] turns them into statistics).
use std::sync::atomic::{AtomicU64, Ordering};

/// A cumulative histogram with fixed upper bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_bits: AtomicU64,
}

impl Histogram {
    /// A histogram with these bucket upper bounds (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if v <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut cur = self.sum_bits.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(cur) + v).to_bits();
            match self.sum_bits.compare_exchange_weak(
                cur,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The sum of the observations.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum_bits.load(Ordering::Relaxed))
    }

    /// `(upper bound, cumulative count)` per bucket.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect()
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TPOT_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The scheduler's counters, shared with whoever reads them.
#[derive(Debug)]
pub struct EngineMetrics {
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: Counter,
    /// Prompt tokens found in the prompt cache.
    pub cached_prompt_tokens: Counter,
    /// Generated tokens.
    pub generation_tokens: Counter,
    /// Requests waiting for a slot.
    pub queue_depth: Gauge,
    /// Sequences prefilling or decoding.
    pub active_sequences: Gauge,
    /// Prompt-cache lookups that found a prefix.
    pub cache_hits: Counter,
    /// Prompt-cache lookups that found nothing.
    pub cache_misses: Counter,
    /// Entries in the prompt cache.
    pub cache_entries: Gauge,
    /// Bytes held by the prompt cache.
    pub cache_bytes: Gauge,
    /// Prompt-cache lookups answered from the disk tier.
    pub disk_cache_hits: Counter,
    /// Files in the prompt cache's disk tier.
    pub disk_cache_files: Gauge,
    /// Bytes of those files.
    pub disk_cache_bytes: Gauge,
    /// Prompt tokens of the sequences prefilling now (the total of their uncached
    /// prompts).
    pub prefill_total_tokens: Gauge,
    /// Of those, the tokens already processed.
    pub prefill_processed_tokens: Gauge,
    /// Generations stopped because the client went away.
    pub cancelled: Counter,
    /// Requests refused because the queue was full.
    pub rejected_queue_full: Counter,
    /// Sequences failed by an engine (MLX) error.
    pub engine_errors: Counter,
    /// Decoding forward passes (one per step of the decode batch).
    pub decode_steps: Counter,
    /// Sequences fed through those passes (divided by the steps: the mean batch size).
    pub decode_rows: Counter,
    /// Speculative decoding: draft tokens proposed.
    pub spec_drafted: Counter,
    /// Speculative decoding: draft tokens accepted (emitted).
    pub spec_accepted: Counter,
    /// Constraints (schemas, grammars) compiled for requests.
    pub constraint_compiles: Counter,
    /// Constrained requests that reused a compiled constraint.
    pub constraint_cache_hits: Counter,
    /// Speculative decoding: verification passes (one per step of a speculating batch).
    pub spec_steps: Counter,
    /// Speculative decoding: rows that left a speculating batch for the plain decode
    /// batch, their drafts' acceptance below `draft_min_acceptance`.
    pub spec_stepped_aside: Counter,
    /// Speculative decoding: rows that left a speculating batch for the plain decode
    /// batch because more rows decoded than `draft_max_batch`.
    pub spec_over_batch: Counter,
    /// Microseconds spent in prompt processing (the prefill steps, evaluation
    /// included; mlx-lm's `BatchCounters.prompt_time`).
    pub prefill_micros: Counter,
    /// Seconds from admission to the first token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of one sequence.
    pub tpot: Histogram,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            prompt_tokens: Counter::default(),
            cached_prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            queue_depth: Gauge::default(),
            active_sequences: Gauge::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            cache_entries: Gauge::default(),
            cache_bytes: Gauge::default(),
            disk_cache_hits: Counter::default(),
            disk_cache_files: Gauge::default(),
            disk_cache_bytes: Gauge::default(),
            prefill_total_tokens: Gauge::default(),
            prefill_processed_tokens: Gauge::default(),
            cancelled: Counter::default(),
            rejected_queue_full: Counter::default(),
            engine_errors: Counter::default(),
            decode_steps: Counter::default(),
            decode_rows: Counter::default(),
            spec_drafted: Counter::default(),
            spec_accepted: Counter::default(),
            constraint_compiles: Counter::default(),
            constraint_cache_hits: Counter::default(),
            spec_steps: Counter::default(),
            spec_stepped_aside: Counter::default(),
            spec_over_batch: Counter::default(),
            prefill_micros: Counter::default(),
            ttft: Histogram::new(TTFT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
        }
    }
}

//! Prometheus metrics (`GET /metrics`): requests, tokens, queue depth, time to first
//! token and per-token latency histograms, prompt-cache hits, cancellations.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A cumulative histogram with fixed upper bounds (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_bits: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
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

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let n = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            f64::from_bits(self.sum_bits.load(Ordering::Relaxed))
        );
        let _ = writeln!(out, "{name}_count {n}");
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
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Removes one (never below zero).
    pub fn dec(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// All server metrics; shared by the HTTP side and the engine thread.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
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
    /// Generations stopped because the client went away.
    pub cancelled: Counter,
    /// Requests refused with 429.
    pub rejected_queue_full: Counter,
    /// Engine failures answered with 503.
    pub engine_errors: Counter,
    /// Decoding forward passes (one per step of the decode batch).
    pub decode_steps: Counter,
    /// Sequences fed through those passes (divided by the steps: the mean batch size).
    pub decode_rows: Counter,
    /// Microseconds spent in prompt processing (the prefill steps, evaluation
    /// included; mlx-lm's `BatchCounters.prompt_time`).
    pub prefill_micros: Counter,
    /// Seconds from admission to the first token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of one sequence.
    pub tpot: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: Counter::default(),
            cached_prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            queue_depth: Gauge::default(),
            active_sequences: Gauge::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            cache_entries: Gauge::default(),
            cache_bytes: Gauge::default(),
            cancelled: Counter::default(),
            rejected_queue_full: Counter::default(),
            engine_errors: Counter::default(),
            decode_steps: Counter::default(),
            decode_rows: Counter::default(),
            prefill_micros: Counter::default(),
            ttft: Histogram::new(TTFT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
        }
    }
}

impl Metrics {
    /// Counts one answered request.
    pub fn record_request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    /// Requests answered on `route` with `status` so far.
    pub fn requests(&self, route: &str, status: u16) -> u64 {
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(route.to_string(), status)).copied().unwrap_or(0)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP mlx_server_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE mlx_server_requests_total counter\n");
        {
            let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            for ((route, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "mlx_server_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let counters: [(&str, &str, &Counter); 10] = [
            (
                "mlx_server_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                &self.prompt_tokens,
            ),
            (
                "mlx_server_cached_prompt_tokens_total",
                "Prompt tokens served from the prompt cache.",
                &self.cached_prompt_tokens,
            ),
            (
                "mlx_server_generation_tokens_total",
                "Generated tokens.",
                &self.generation_tokens,
            ),
            (
                "mlx_server_prompt_cache_hits_total",
                "Prompt-cache lookups that reused a prefix.",
                &self.cache_hits,
            ),
            (
                "mlx_server_prompt_cache_misses_total",
                "Prompt-cache lookups that found nothing.",
                &self.cache_misses,
            ),
            (
                "mlx_server_cancelled_total",
                "Generations stopped because the client disconnected.",
                &self.cancelled,
            ),
            (
                "mlx_server_rejected_total",
                "Requests refused because the queue was full.",
                &self.rejected_queue_full,
            ),
            (
                "mlx_server_engine_errors_total",
                "Requests failed by an engine (MLX) error.",
                &self.engine_errors,
            ),
            (
                "mlx_server_decode_steps_total",
                "Decoding forward passes (one per step of the decode batch).",
                &self.decode_steps,
            ),
            (
                "mlx_server_decode_rows_total",
                "Sequences fed through decoding passes (rows / steps: mean batch size).",
                &self.decode_rows,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.get()
            );
        }
        let _ = writeln!(
            out,
            "# HELP mlx_server_prefill_seconds_total Seconds spent processing prompts.\n\
             # TYPE mlx_server_prefill_seconds_total counter\n\
             mlx_server_prefill_seconds_total {}",
            self.prefill_micros.get() as f64 / 1e6
        );
        let gauges: [(&str, &str, &Gauge); 4] = [
            (
                "mlx_server_queue_depth",
                "Requests waiting for a decode slot.",
                &self.queue_depth,
            ),
            (
                "mlx_server_active_sequences",
                "Sequences prefilling or decoding.",
                &self.active_sequences,
            ),
            (
                "mlx_server_prompt_cache_entries",
                "Entries in the prompt cache.",
                &self.cache_entries,
            ),
            (
                "mlx_server_prompt_cache_bytes",
                "Bytes held by the prompt cache.",
                &self.cache_bytes,
            ),
        ];
        for (name, help, g) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                g.get()
            );
        }
        self.ttft.render(
            &mut out,
            "mlx_server_time_to_first_token_seconds",
            "Seconds from admission to the first generated token.",
        );
        self.tpot.render(
            &mut out,
            "mlx_server_time_per_output_token_seconds",
            "Seconds between consecutive generated tokens of one sequence.",
        );
        out
    }
}

//! Prometheus metrics (`GET /metrics`): requests, tokens, queue depth, time to first
//! token and per-token latency histograms, prompt-cache hits, cancellations.
use mlx_engine::batch::{Counter, EngineMetrics, Gauge, Histogram};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

fn render_histogram(h: &Histogram, out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (b, c) in h.buckets() {
        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
    }
    let n = h.count();
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
    let _ = writeln!(out, "{name}_sum {}", h.sum());
    let _ = writeln!(out, "{name}_count {n}");
}

/// All server metrics: requests by route and status here, the engine's counters
/// (tokens, queue, prompt cache, latencies) in [`EngineMetrics`].
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    engine: Arc<EngineMetrics>,
}

impl std::ops::Deref for Metrics {
    type Target = EngineMetrics;

    fn deref(&self) -> &EngineMetrics {
        &self.engine
    }
}

impl Metrics {
    /// The engine's counters (shared with the engine thread).
    pub fn engine(&self) -> &Arc<EngineMetrics> {
        &self.engine
    }

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
        let counters: [(&str, &str, &Counter); 18] = [
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
                "mlx_server_prompt_cache_disk_hits_total",
                "Prompt-cache lookups answered from the disk tier (--prompt-cache-dir).",
                &self.disk_cache_hits,
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
            (
                "mlx_server_speculative_steps_total",
                "Verification passes of speculating batches (draft model or predicted outputs).",
                &self.spec_steps,
            ),
            (
                "mlx_server_speculative_drafted_tokens_total",
                "Draft tokens proposed by speculative decoding.",
                &self.spec_drafted,
            ),
            (
                "mlx_server_speculative_accepted_tokens_total",
                "Draft tokens accepted (emitted) by speculative decoding.",
                &self.spec_accepted,
            ),
            (
                "mlx_server_speculation_rows_stepped_aside_total",
                "Speculating requests that went on without drafts, their drafts' acceptance below --draft-min-acceptance.",
                &self.spec_stepped_aside,
            ),
            (
                "mlx_server_speculation_rows_over_batch_total",
                "Speculating requests that went on without drafts, more rows decoding than --draft-max-batch.",
                &self.spec_over_batch,
            ),
            (
                "mlx_server_constraint_compiles_total",
                "Output constraints (JSON schemas, grammars) compiled.",
                &self.constraint_compiles,
            ),
            (
                "mlx_server_constraint_cache_hits_total",
                "Constrained requests that reused a compiled constraint.",
                &self.constraint_cache_hits,
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
        let gauges: [(&str, &str, &Gauge); 8] = [
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
            (
                "mlx_server_prompt_cache_disk_files",
                "Files in the prompt cache's disk tier.",
                &self.disk_cache_files,
            ),
            (
                "mlx_server_prompt_cache_disk_bytes",
                "Bytes of the files in the prompt cache's disk tier.",
                &self.disk_cache_bytes,
            ),
            (
                "mlx_server_prefill_tokens",
                "Uncached prompt tokens of the sequences prefilling now.",
                &self.prefill_total_tokens,
            ),
            (
                "mlx_server_prefill_processed_tokens",
                "Of those, the tokens already processed.",
                &self.prefill_processed_tokens,
            ),
        ];
        for (name, help, g) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                g.get()
            );
        }
        render_histogram(
            &self.ttft,
            &mut out,
            "mlx_server_time_to_first_token_seconds",
            "Seconds from admission to the first generated token.",
        );
        render_histogram(
            &self.tpot,
            &mut out,
            "mlx_server_time_per_output_token_seconds",
            "Seconds between consecutive generated tokens of one sequence.",
        );
        out
    }
}

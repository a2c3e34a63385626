//! Opt-in per-token timing of the decode loop (`MLX_ENGINE_PROFILE=1`).
//!
//! Splits each decode step's host time into graph construction (the Rust model
//! forward, processors and sampler: every op handed to MLX), `async_eval` (MLX
//! scheduling and encoding the step's kernels) and waiting for the previous token
//! (reading it back), and prints the means to stderr when the generator is dropped.
//! Off, it costs one cached flag test per token.
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Whether `MLX_ENGINE_PROFILE` is set to something other than `0` or empty.
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_ENGINE_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0"))
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

#[cfg(test)]
mod tests {
    use super::*;

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

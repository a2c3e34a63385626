//! How wide a speculating batch's steps are: its width models ([`Width`]) and which
//! steps may be queued plainly.
use super::SpecBatch;
use crate::batch::width::{nearest, DraftWidth, Width};
use crate::error::Result;
use mlx_array::{transforms, Array};

/// The fewest row-tokens a timed catch-up must feed for its rate to count (a few
/// tokens' catch-up is bound by its forwards' fixed cost, not by its tokens).
const RATE_MIN_TOKENS: usize = 256;

impl SpecBatch {
    /// This step's width (drafts verified a row at most) for rows with `avail` drafts
    /// each at most, by the batch's [`DraftWidth`]; with a draft model (`model`) from
    /// this row count's step times.
    pub(super) fn choose_width(&mut self, model: bool, avail: &[usize]) -> usize {
        match self.drafts {
            DraftWidth::All => usize::MAX,
            DraftWidth::None => 0,
            DraftWidth::Paying => {
                let rates: Vec<(f64, usize)> = self
                    .rows
                    .iter()
                    .zip(avail)
                    .map(|(r, &d)| (r.acceptance.rate(), d))
                    .collect();
                let width = if model {
                    self.model_width(rates.len())
                } else {
                    self.width.get_or_insert_with(Width::for_current_device)
                };
                let chosen = width.choose(&rates);
                if tracing::enabled!(tracing::Level::TRACE) {
                    tracing::trace!(
                        "speculative: width {chosen} for {} row(s) (rate, drafts) {}; times {}",
                        rates.len(),
                        rows_line(&rates),
                        width.describe()
                    );
                }
                chosen
            }
        }
    }

    /// Whether a plain step may be queued before the last one's tokens are read: in a
    /// batch that does not verify every draft, with no row whose processors need each
    /// token first; with a draft model (`model`) only under `plain_model_steps` (the
    /// draft lags by the plain steps' tokens and is fed them when a step drafts again).
    pub(super) fn may_pipeline(&self, model: bool) -> bool {
        (!model || self.plain_model_steps)
            && self.drafts != DraftWidth::All
            && self.rows.iter().all(|r| !r.seq.has_processors())
    }

    /// The width model of `b` rows' steps: the draft model's of that row count, or the
    /// prediction batch's.
    pub(super) fn width_of(&mut self, model: bool, b: usize) -> Option<&mut Width> {
        if model {
            Some(self.model_width(b))
        } else {
            self.width.as_mut()
        }
    }

    /// The draft model's width model for `b` rows. A row count not seen yet starts, where
    /// plain steps are timed, from the nearest row count's times ([`Width::for_rows`])
    /// when it has at most 1.5x as many or as few rows, else from the device's prior.
    fn model_width(&mut self, b: usize) -> &mut Width {
        let timed = self.plain_model_steps;
        let (catch_up, allowance) = self.catch_up_expected();
        let seed = if timed && !self.model_widths.contains_key(&b) {
            let below = self.model_widths.range(..b).next_back();
            let above = self.model_widths.range(b..).next();
            // Times of a near row count only: one row's steps tell little of eight's.
            nearest(b, below.map(|(&n, w)| (n, w)), above.map(|(&n, w)| (n, w)))
                .filter(|&(from, _)| 2 * from.max(b) <= 3 * from.min(b))
                .map(|(from, w)| w.for_rows(from, b))
        } else {
            None
        };
        let w = self.model_widths.entry(b).or_insert_with(|| {
            seed.unwrap_or_else(|| {
                Width::for_current_device()
                    .timing_plain(timed)
                    .try_widest(self.widest_tries)
            })
        });
        w.expect_catch_up(catch_up, allowance);
        w
    }

    /// The expected time of the draft model's catch-up before a drafting step now (0
    /// with a lag of at most the one token a drafting round leaves, or no catch-up
    /// timed yet; infinite while as many prompts as rows are about to join:
    /// [`SpecBatch::expect_joining`]), and how many plain steps' time it may take: the
    /// batch's share of the rows' mean remaining tokens ([`SpecBatch::catch_up_share`]).
    fn catch_up_expected(&self) -> (f64, f64) {
        let b = self.rows.len();
        let lag = self.lag.iter().map(Vec::len).max().unwrap_or(0);
        if self.hold_for_joining && lag > 1 && self.joining >= b.max(1) {
            // Held while the batch is about to grow ([`SpecBatch::expect_joining`]).
            return (f64::INFINITY, 0.0);
        }
        let secs = match self.catch_up_rate {
            Some(rate) if lag > 1 && rate > 0.0 => (lag * b) as f64 / rate,
            _ => 0.0,
        };
        let remaining: usize = self.rows.iter().map(|r| r.seq.remaining()).sum();
        (
            secs,
            self.catch_up_share * remaining as f64 / b.max(1) as f64,
        )
    }

    /// A catch-up of `lagged` tokens (its longest row's) of `b` rows took `secs`: the
    /// fastest such rate stands for the next ones' ([`SpecBatch::catch_up_expected`]).
    pub(super) fn time_catch_up(&mut self, lagged: usize, b: usize, secs: f64) {
        let tokens = lagged * b;
        if tokens >= RATE_MIN_TOKENS && secs > 0.0 {
            let rate = tokens as f64 / secs;
            self.catch_up_rate = Some(self.catch_up_rate.map_or(rate, |r| r.max(rate)));
        }
    }

    /// With the last step's tokens unread: whether this step is plain whatever drafts
    /// they make (each row at its most, one token fewer remaining; [`Width::stays_plain`]).
    pub(super) fn stays_plain(&mut self, model: bool) -> bool {
        if self.drafts == DraftWidth::None {
            return true;
        }
        let rows: Vec<(f64, usize)> = self
            .rows
            .iter()
            .map(|r| {
                let cap = r.k.min(r.seq.remaining().saturating_sub(2));
                (r.acceptance.rate(), cap)
            })
            .collect();
        let b = rows.len();
        self.width_of(model, b).is_some_and(|w| {
            let plain = w.stays_plain(&rows);
            if plain && tracing::enabled!(tracing::Level::TRACE) {
                tracing::trace!(
                    "speculative: plain ahead for {b} row(s) (rate, drafts) {}; times {}",
                    rows_line(&rows),
                    w.describe()
                );
            }
            plain
        })
    }

    /// Times a verification of `positions` positions that started at `started` (after
    /// what was queued before it finished), `rolled` when rejected drafts rolled the
    /// caches; with a draft model (`model`) for its row count's width model.
    pub(super) fn time_verification(
        &mut self,
        model: bool,
        positions: usize,
        rolled: bool,
        started: std::time::Instant,
    ) -> Result<()> {
        let b = self.rows.len();
        // The rows' rejected drafts rolled every layer's cache: evaluated here, so the
        // width model charges them to the step that caused them.
        if rolled {
            let state: Vec<Array> = self.cache.layers().iter().flat_map(|c| c.state()).collect();
            let refs: Vec<&Array> = state.iter().collect();
            transforms::eval(&refs)?;
        }
        // Not the first step after the number of rows changed (it also evaluates the
        // caches' joins and filters).
        let same_rows = std::mem::replace(&mut self.last_rows, b) == b;
        // A shape's first step may compile its kernels ([`SpecBatch::first_shapes_untimed`]).
        let first = self.first_shapes_untimed && self.shapes_run.insert((model, b, positions));
        if first && same_rows {
            tracing::debug!(
                "speculative: the first step of {b} row(s) and {positions} position(s) took {:.1} ms, not timed",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        if let (true, false, Some(w)) = (same_rows, first, self.width_of(model, b)) {
            let secs = started.elapsed().as_secs_f64();
            if w.stalled(b, secs) {
                tracing::debug!(
                    "speculative: a step of {b} row(s) took {:.1} ms, not timed (a stall)",
                    secs * 1e3
                );
            } else {
                w.observe(positions, secs);
            }
        }
        Ok(())
    }
}

/// The rows' `(acceptance rate, drafts)` for a trace line.
fn rows_line(rows: &[(f64, usize)]) -> String {
    let parts: Vec<String> = rows
        .iter()
        .map(|&(a, d)| format!("({a:.2}, {d})"))
        .collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catch_up_is_held_while_as_many_prompts_as_rows_join() {
        // A batch whose draft model lags by a deferred prompt (no rows stepping yet, as
        // the first row of a burst before its step): held while a prompt joins, with
        // the hold on; not held with it off, nor once nothing joins, nor with a lag of
        // the one token a drafting round leaves.
        let mut b = SpecBatch::new(0.0, 0).hold_for_joining(true);
        b.catch_up_rate = Some(10_000.0);
        b.lag = vec![vec![1, 2, 3, 4]];
        b.expect_joining(1);
        assert_eq!(b.catch_up_expected(), (f64::INFINITY, 0.0));
        b.expect_joining(0);
        assert!(b.catch_up_expected().0.is_finite());
        b.expect_joining(3);
        b.lag = vec![vec![1]];
        assert_eq!(b.catch_up_expected().0, 0.0);
        b.lag = vec![vec![1, 2, 3, 4]];
        let mut off = SpecBatch::new(0.0, 0);
        off.catch_up_rate = Some(10_000.0);
        off.lag = vec![vec![1, 2, 3, 4]];
        off.expect_joining(3);
        assert!(off.catch_up_expected().0.is_finite());
        assert_eq!(b.catch_up_expected(), (f64::INFINITY, 0.0));
    }
}

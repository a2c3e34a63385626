//! Rows leaving a speculating batch for the plain decode batch: their drafts' acceptance
//! fell below the minimum, more rows decode than `draft_max_batch`, or they are plain rows
//! that stepped with the prediction batch.
use super::{Aside, Row, SpecBatch, SteppedAside};
use crate::batch::decode::cache_err;
use crate::error::{EngineError, Result};

impl SpecBatch {
    /// With `running` rows decoding (speculating and plain), whether they are more than
    /// `draft_max_batch`: then every row is marked to step aside (before this step:
    /// [`SpecBatch::step_aside`] takes them out with no round drafted).
    pub fn over_batch(&mut self, running: usize) -> bool {
        if self.max_batch == 0 || running <= self.max_batch || self.rows.is_empty() {
            return false;
        }
        self.running = running;
        for r in &mut self.rows {
            r.aside.get_or_insert(Aside::BatchSize);
        }
        true
    }

    /// Takes out the rows whose acceptance fell below the minimum (after the step's
    /// outcomes were routed: finished rows are gone), with their target caches and
    /// next inputs; their draft caches are dropped. `None` when no row steps aside. An
    /// `Err` means the batch's caches are broken: the caller drains it.
    pub fn step_aside(&mut self) -> Result<Option<SteppedAside>> {
        let idx: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].aside.is_some())
            .collect();
        if idx.is_empty() {
            return Ok(None);
        }
        if self.pending.is_some() {
            return Err(EngineError::Internal(
                "rows stepped aside before their last tokens were read".into(),
            ));
        }
        // The speculating batch processed every position with an explicit history;
        // the plain batch grows a row's stored history (the prompt but its last token)
        // by each input: it gets what came in between, the last prompt token and the
        // generated tokens before `y` (nothing when `y` is that prompt token: a row
        // that steps aside before its first round). (First, while a failure still
        // leaves the batch whole for the caller to drain.)
        for &i in &idx {
            let row = &mut self.rows[i];
            let prompt = &row.seq.job().req.prompt;
            let mut between: Vec<u32> = prompt[prompt.len().saturating_sub(1)..].to_vec();
            between.extend_from_slice(&row.generated);
            between.pop();
            row.seq.sampling_mut().prompt(&between)?;
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|i| !idx.contains(i)).collect();
        let cache = self.cache.split(&idx).map_err(cache_err)?;
        let mut rows = self.keep_rows(&keep)?;
        let mut seqs = Vec::with_capacity(idx.len());
        let mut inputs = Vec::with_capacity(idx.len());
        let (mut over_batch, mut plain) = (0, 0);
        for row in idx.iter().filter_map(|&i| rows[i].take()) {
            let Row {
                mut seq,
                y,
                y_unfed,
                k,
                drafted,
                accepted,
                aside,
                ..
            } = row;
            // The plain batch feeds `y` next: it counts as fed when the row joins, as
            // a prefilled sequence's last prompt token does.
            if y_unfed {
                seq.push_fed(y);
            }
            if k == 0 {
                // A plain row that stepped with the prediction batch goes back.
                plain += 1;
            } else if aside == Some(Aside::BatchSize) {
                over_batch += 1;
                tracing::info!(
                    "speculative: {accepted} of {drafted} drafted tokens accepted over {} \
                     tokens; {} rows decoding, over the draft max batch {}: the request \
                     goes on without drafts",
                    seq.generated(),
                    self.running,
                    self.max_batch
                );
            } else {
                tracing::info!(
                    "speculative: {accepted} of {drafted} drafted tokens accepted over {} \
                     tokens, below the minimum acceptance {} over the last {} rounds: the \
                     request goes on without drafts",
                    seq.generated(),
                    self.min_acceptance,
                    crate::speculative::ACCEPTANCE_WINDOW
                );
            }
            seqs.push(seq);
            inputs.push(y);
        }
        Ok(Some(SteppedAside {
            seqs,
            cache,
            inputs,
            over_batch,
            plain,
        }))
    }
}

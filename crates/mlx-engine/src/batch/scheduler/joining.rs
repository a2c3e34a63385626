//! Where a prefilled sequence goes (the plain decode batch or a speculating one: its
//! lane) and the speculating batches' steps, with the rows they hand to the plain batch.
use super::*;

impl Shared {
    /// Which decoding stage a prefilled sequence joins: a speculating batch when it asks
    /// for speculation and can have it (else plain decoding, saying why). With more
    /// than `draft_max_batch` rows `running` once it joins, it would step aside at once
    /// (counted so): it joins plain decoding without a draft prefill.
    pub(super) fn lane(&self, s: &Sequence, has_draft: bool, running: usize) -> Lane {
        let Some(spec) = &s.job().req.speculate else {
            return Lane::Plain;
        };
        let why = if !self.speculates {
            "the model's caches cannot be trimmed (sliding-window or recurrent layers)"
        } else if spec.from == DraftFrom::DraftModel && !has_draft {
            "no draft model is loaded"
        } else if s.job().req.adapter != 0 {
            "the speculating batch does not pick resident LoRA adapters per row"
        } else {
            let max = self.opts.draft_max_batch;
            if max > 0 && running > max {
                self.metrics.spec_over_batch.add(1);
                tracing::info!(
                    "speculative: {running} rows decoding, over the draft max batch \
                     {max}: the request goes on without drafts"
                );
                return Lane::Plain;
            }
            return match spec.from {
                DraftFrom::DraftModel => Lane::Drafting,
                DraftFrom::Prediction(_) => Lane::Predicting,
            };
        };
        tracing::info!("engine: speculative decoding off for a request, plain decoding: {why}");
        Lane::Plain
    }

    /// The lanes of sequences joining together: each one's [`Scheduler::lane`]; then,
    /// while the prediction batch has rows (or some of these join it), plain rows it can
    /// step with no drafts (no processors, no resident adapter, no seed; its plain steps are
    /// pipelined as the plain batch's) join it too: one forward a step for both kinds
    /// instead of two.
    pub(super) fn lanes(&self, seqs: &[Sequence], j: &Joining<'_>) -> Vec<Lane> {
        let running = j.running() + seqs.len();
        let mut lanes: Vec<Lane> = seqs
            .iter()
            .map(|s| self.lane(s, j.draft.is_some(), running))
            .collect();
        let max = self.opts.draft_max_batch;
        let predicting = j.predicting.len() > 0 || lanes.contains(&Lane::Predicting);
        if predicting && (max == 0 || running <= max) {
            for (lane, s) in lanes.iter_mut().zip(seqs) {
                let req = &s.job().req;
                // A seeded row keeps the plain batch's draws: a verification step samples
                // all its positions with one key.
                if *lane == Lane::Plain
                    && req.speculate.is_none()
                    && req.adapter == 0
                    && req.sampling.seed.is_none()
                    && !s.has_processors()
                {
                    *lane = Lane::Predicting;
                }
            }
        }
        lanes
    }

    /// Sequences that need no prefill join their decoding stage.
    pub(super) fn join_hits(&mut self, hits: Vec<Sequence>, j: &mut Joining<'_>) {
        let lanes = self.lanes(&hits, j);
        let (mut plain, mut drafting, mut predicting) = (Vec::new(), Vec::new(), Vec::new());
        for (s, lane) in hits.into_iter().zip(lanes) {
            match lane {
                Lane::Plain => plain.push(s),
                Lane::Drafting => drafting.push(s),
                Lane::Predicting => predicting.push(s),
            }
        }
        if let Err((seqs, e)) = j.decoding.join(plain) {
            self.fail_seqs(seqs, e);
        }
        let step = self.opts.prefill_step_size;
        if let Err((seqs, e)) = j.drafting.join(drafting, None, j.draft, step) {
            self.fail_seqs(seqs, e);
        }
        if let Err((seqs, e)) = j.predicting.join(predicting, None, None, step) {
            self.fail_seqs(seqs, e);
        }
    }

    /// Sequences prefilled together join their decoding stages with their rows of
    /// `cache`.
    pub(super) fn join_prefilled(
        &mut self,
        seqs: Vec<Sequence>,
        mut cache: BatchPromptCache,
        j: &mut Joining<'_>,
    ) {
        let lanes = self.lanes(&seqs, j);
        if lanes.iter().all(|l| *l == Lane::Plain) {
            if let Err((seqs, e)) = j.decoding.join_prefilled(seqs, cache) {
                self.fail_seqs(seqs, e);
            }
            return;
        }
        let mut slots: Vec<Option<Sequence>> = seqs.into_iter().map(Some).collect();
        let step = self.opts.prefill_step_size;
        for lane in [Lane::Drafting, Lane::Predicting, Lane::Plain] {
            let idx: Vec<usize> = (0..lanes.len()).filter(|&i| lanes[i] == lane).collect();
            if idx.is_empty() {
                continue;
            }
            let part: Vec<Sequence> = idx.iter().filter_map(|&i| slots[i].take()).collect();
            // Row indices of what is left in `cache` after the lanes split off before.
            let left: Vec<usize> = (0..lanes.len())
                .filter(|&i| slots[i].is_some() || idx.contains(&i))
                .collect();
            let rows: Vec<usize> = idx
                .iter()
                .filter_map(|i| left.iter().position(|j| j == i))
                .collect();
            let rows_cache = if lane == Lane::Plain {
                Ok(std::mem::take(&mut cache))
            } else {
                cache.split(&rows).map_err(crate::batch::decode::cache_err)
            };
            let rows_cache = match rows_cache {
                Ok(c) => c,
                Err(e) => {
                    self.fail_seqs(part, e);
                    continue;
                }
            };
            let joined = match lane {
                Lane::Plain => j.decoding.join_prefilled(part, rows_cache),
                Lane::Drafting => j.drafting.join(part, Some(rows_cache), j.draft, step),
                Lane::Predicting => j.predicting.join(part, Some(rows_cache), None, step),
            };
            if let Err((seqs, e)) = joined {
                self.fail_seqs(seqs, e);
            }
        }
    }

    /// Batched mode, speculative decoding: one draft-verify-accept step of the batch;
    /// rows whose drafts' acceptance fell below `draft_min_acceptance` then leave it for
    /// the plain `decoding` batch. With more than `draft_max_batch` rows `running`
    /// (speculating and plain), every row leaves it for `decoding` before its step.
    pub(super) fn decode_speculative(
        &mut self,
        model: &dyn LanguageModel,
        draft: Option<&dyn LanguageModel>,
        batch: &mut SpecBatch,
        decoding: &mut DecodeBatch,
        running: usize,
    ) {
        if batch.over_batch(running) {
            // Their last plain step's tokens first (the rows leave with their next inputs).
            match batch.flush() {
                Ok(outcomes) => self.route(batch, outcomes),
                Err(e) => return self.fail_seqs(batch.drain(), e),
            }
            self.step_aside(batch, decoding);
        }
        if batch.len() == 0 {
            return;
        }
        guard::watch(self.opts.memory_limit);
        let (outcomes, round) = match batch.step(model, draft) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("engine: speculative decoding failed: {e}");
                return self.fail_seqs(batch.drain(), e);
            }
        };
        if round.rows > 0 {
            self.metrics.decode_steps.add(1);
            self.metrics.spec_steps.add(1);
        }
        self.metrics.decode_rows.add(round.rows);
        self.metrics.spec_drafted.add(round.drafted);
        self.metrics.spec_accepted.add(round.accepted);
        tracing::debug!(
            "engine: speculative step of {} row(s): {} of {} drafts accepted",
            round.rows,
            round.accepted,
            round.drafted
        );
        let rows = batch.stepping();
        self.enforce_memory_limit(batch, &rows);
        self.route(batch, outcomes);
        self.step_aside(batch, decoding);
    }

    /// The rows of `batch` marked to step aside join the plain `decoding` batch.
    pub(super) fn step_aside(&mut self, batch: &mut SpecBatch, decoding: &mut DecodeBatch) {
        match batch.step_aside() {
            Ok(None) => {}
            Ok(Some(aside)) => {
                let n = (aside.seqs.len() - aside.plain) as u64;
                let over = aside.over_batch as u64;
                self.metrics.spec_stepped_aside.add(n - over);
                self.metrics.spec_over_batch.add(over);
                if let Err((seqs, e)) =
                    decoding.join_with_inputs(aside.seqs, aside.cache, aside.inputs)
                {
                    self.fail_seqs(seqs, e);
                }
            }
            Err(e) => {
                tracing::warn!("engine: a row stepping aside from speculation failed: {e}");
                self.fail_seqs(batch.drain(), e);
            }
        }
    }
}

/// The decoding stages a prefilled sequence may join.
pub(super) struct Joining<'a> {
    pub(super) decoding: &'a mut DecodeBatch,
    pub(super) drafting: &'a mut SpecBatch,
    pub(super) predicting: &'a mut SpecBatch,
    pub(super) draft: Option<&'a dyn LanguageModel>,
}

impl Joining<'_> {
    /// The rows decoding (plain and speculating).
    pub(super) fn running(&self) -> usize {
        self.decoding.len() + self.drafting.len() + self.predicting.len()
    }
}

/// Which of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    Plain,
    Drafting,
    Predicting,
}

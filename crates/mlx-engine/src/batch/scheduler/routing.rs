//! Where each step's outcomes go: events to their requests, finished sequences' caches
//! to the prompt cache, failures and the memory limit's stops, cancellations.
use super::*;

impl Shared {
    /// Sequences that need no prefill (a one-token prompt, or a prompt-cache hit):
    /// those that want their prompt reported get it now; those with nothing to
    /// generate (`max_tokens` 0) end here, their caches kept. Returns the others.
    pub(super) fn report_prompts(&mut self, seqs: Vec<Sequence>) -> Vec<Sequence> {
        let mut going_on = Vec::with_capacity(seqs.len());
        for mut s in seqs {
            let Some(Outcome::Prompt { logprobs, finish }) = s.prompt_outcome() else {
                going_on.push(s);
                continue;
            };
            let delivered = s.job().send(EngineEvent::Prompt {
                choice: s.job().choice,
                logprobs,
                finish,
            });
            match (finish, delivered) {
                (None, true) => going_on.push(s),
                (Some(_), true) => {
                    let adapter = s.job().req.adapter;
                    let (fed, caches) = s.into_fed_and_caches();
                    if !caches.is_empty() {
                        self.store_caches(adapter, fed, caches);
                    }
                }
                (_, false) => log_stopped(&self.metrics, &s),
            }
        }
        going_on
    }

    /// After a step of `stage` run by `stepping` (watched with [`guard::watch`]): over
    /// the enforced memory limit, the prompt cache gives the excess back when it holds
    /// that much, else the largest of them fails (its caches freed, the prompt cache
    /// halved at the end of the loop).
    pub(super) fn enforce_memory_limit(&mut self, stage: &mut dyn Stage, stepping: &[SeqId]) {
        let Some(limit) = self.opts.memory_limit else {
            return;
        };
        let peak = guard::peak();
        match guard::judge(limit, peak, self.cache.nbytes()) {
            Over::No => {}
            Over::Reclaim(bytes) => {
                tracing::warn!(
                    "engine: a step took MLX's memory {bytes} bytes over the limit; the prompt cache gives them back"
                );
                let keep = self.cache.nbytes().saturating_sub(bytes);
                self.cache.trim_to(usize::MAX, keep);
                self.update_cache_metrics();
                mlx_array::memory::clear_cache();
            }
            Over::Fail(msg) => {
                let Some(id) = guard::largest(stage, stepping) else {
                    return;
                };
                self.mlx_failed.set(true);
                let failed = Outcome::Failed(EngineError::Unavailable(msg));
                self.route(stage, vec![(id, failed)]);
            }
        }
    }

    /// Takes the stage's cancelled sequences out.
    pub(super) fn drop_cancelled(&mut self, stage: &mut dyn Stage) {
        let gone: Vec<(SeqId, Leave)> = stage
            .cancelled()
            .into_iter()
            .map(|id| (id, Leave::Dropped))
            .collect();
        if gone.is_empty() {
            return;
        }
        match stage.remove(&gone) {
            Ok(left) => {
                for l in left {
                    log_stopped(&self.metrics, &l.seq);
                }
            }
            Err(e) => self.fail_seqs(stage.drain(), e),
        }
    }

    /// The one place results go: events out by id, metrics counted; finished, failed
    /// and abandoned sequences leave `stage` (finished ones give their caches to the
    /// prompt cache).
    pub(super) fn route(&mut self, stage: &mut dyn Stage, outcomes: Vec<(SeqId, Outcome)>) {
        let now = Instant::now();
        let mut leaving: Vec<(SeqId, Leave)> = Vec::new();
        let mut errors: Vec<(SeqId, EngineError)> = Vec::new();
        for (id, outcome) in outcomes {
            if leaving.iter().any(|(j, _)| *j == id) {
                continue;
            }
            let Some(s) = stage.get_mut(id) else {
                continue;
            };
            match outcome {
                Outcome::Progress { processed, total } => {
                    tracing::debug!("prompt processing progress: {processed}/{total}");
                    self.progress.insert(id, (processed, total));
                    s.job().send(EngineEvent::Progress {
                        choice: s.job().choice,
                        processed,
                        total,
                    });
                }
                Outcome::Failed(e) => {
                    leaving.push((id, Leave::Dropped));
                    errors.push((id, e));
                }
                Outcome::Checkpoint {
                    tokens,
                    caches,
                    kind,
                } => {
                    let adapter = s.job().req.adapter;
                    self.store_checkpoint(adapter, tokens, caches, kind)
                }
                Outcome::Prompt { logprobs, finish } => {
                    let delivered = s.job().send(EngineEvent::Prompt {
                        choice: s.job().choice,
                        logprobs,
                        finish,
                    });
                    if finish.is_some() || !delivered {
                        let how = if delivered {
                            Leave::Finished
                        } else {
                            Leave::Dropped
                        };
                        leaving.push((id, how));
                    }
                }
                Outcome::Token(out) => {
                    count_token(&self.metrics, s.last_token_at(), s.job().submitted, now);
                    s.set_last_token_at(now);
                    let done = out.finish.is_some();
                    let delivered = s.job().send(EngineEvent::Token {
                        choice: s.job().choice,
                        out,
                    });
                    if done || !delivered {
                        let how = if done && delivered {
                            Leave::Finished
                        } else {
                            Leave::Dropped
                        };
                        leaving.push((id, how));
                    }
                }
            }
        }
        if leaving.is_empty() {
            return;
        }
        let left = match stage.remove(&leaving) {
            Ok(left) => left,
            Err(e) => {
                tracing::warn!("engine: removing finished sequences failed: {e}");
                return self.fail_seqs(stage.drain(), e);
            }
        };
        for l in left {
            let id = l.seq.id();
            if let Some(p) = errors.iter().position(|(j, _)| *j == id) {
                let (_, e) = errors.swap_remove(p);
                self.fail_seq(l.seq, e);
                continue;
            }
            let finished = leaving
                .iter()
                .any(|(j, how)| *j == id && *how == Leave::Finished);
            if finished {
                let adapter = l.seq.job().req.adapter;
                let (fed, own) = l.seq.into_fed_and_caches();
                // A batch row's caches were extracted (none if that failed); a sequence
                // alone kept its own.
                if let Some(caches) = l.caches.or((!own.is_empty()).then_some(own)) {
                    self.store_caches(adapter, fed, caches);
                }
            } else if l.seq.job().client_gone() {
                self.metrics.cancelled.add(1);
            }
        }
    }

    pub(super) fn fail_seq(&self, s: Sequence, error: EngineError) {
        if matches!(error, EngineError::Mlx(_)) {
            self.mlx_failed.set(true);
        }
        if !error.is_invalid_request() {
            self.metrics.engine_errors.add(1);
            tracing::warn!("engine: request failed: {error}");
        }
        s.job().fail(error);
    }

    pub(super) fn fail_seqs(&self, seqs: Vec<Sequence>, e: EngineError) {
        if matches!(e, EngineError::Mlx(_)) {
            self.mlx_failed.set(true);
        }
        for s in seqs {
            self.fail_seq(s, e.clone());
        }
    }

    /// Keeps the caches at the end of a prompt segment (mlx-lm's `insert_cache` of the
    /// segment's type). On disk only when they cannot be trimmed: a trimmable entry is
    /// served by the finished sequence's longer one.
    pub(super) fn store_checkpoint(
        &mut self,
        adapter: u32,
        tokens: Vec<u32>,
        caches: LayerCaches,
        kind: CacheKind,
    ) {
        tracing::debug!(
            "engine: prompt-cache checkpoint of {} tokens ({kind:?})",
            tokens.len()
        );
        if let Some(disk) = self.disk.as_mut().filter(|_| adapter == 0) {
            if !mlx_cache::can_trim_prompt_cache(&caches) {
                disk.store(&tokens, &caches, kind);
            }
        }
        self.cache.insert_for(adapter, tokens, caches, kind);
        self.update_cache_metrics();
    }

    /// Keeps a finished sequence's caches for later prompts sharing its prefix.
    pub(super) fn store_caches(&mut self, adapter: u32, fed: Vec<u32>, caches: LayerCaches) {
        if self.opts.prompt_cache_size == 0 {
            return;
        }
        let consistent = caches
            .first()
            .is_none_or(|c| c.offset() as usize == fed.len());
        if consistent {
            if let Some(disk) = self.disk.as_mut().filter(|_| adapter == 0) {
                disk.store(&fed, &caches, CacheKind::Assistant);
            }
            self.cache
                .insert_for(adapter, fed, caches, CacheKind::Assistant);
            self.update_cache_metrics();
        }
    }

    pub(super) fn update_cache_metrics(&self) {
        self.metrics.cache_entries.set(self.cache.len() as u64);
        self.metrics.cache_bytes.set(self.cache.nbytes());
        if let Some(d) = &self.disk {
            self.metrics.disk_cache_files.set(d.len() as u64);
            self.metrics.disk_cache_bytes.set(d.nbytes());
        }
    }
}

/// Metrics of one emitted token: time to first token, else time since the previous one.
pub(super) fn count_token(
    metrics: &EngineMetrics,
    last: Option<Instant>,
    submitted: Instant,
    now: Instant,
) {
    metrics.generation_tokens.add(1);
    match last {
        None => {
            let ttft = (now - submitted).as_secs_f64();
            tracing::debug!("engine: first token {:.1} ms after submission", ttft * 1e3);
            metrics.ttft.observe(ttft)
        }
        Some(t) => metrics.tpot.observe((now - t).as_secs_f64()),
    }
}

/// Logs (and counts, for a client that went away) a sequence dropped mid-generation.
pub(super) fn log_stopped(metrics: &EngineMetrics, s: &Sequence) {
    if s.job().client_gone() {
        metrics.cancelled.add(1);
        tracing::info!(
            "engine: client disconnected; generation stopped after {} tokens",
            s.generated()
        );
    } else {
        tracing::debug!(
            "engine: choice {} stopped after {} tokens",
            s.job().choice,
            s.generated()
        );
    }
}

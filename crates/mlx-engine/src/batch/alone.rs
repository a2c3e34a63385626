//! Sequences that prefill and decode alone (batch size 1, their own caches): with
//! KV-cache quantization (which mlx-lm does not batch either) or caches that cannot be
//! batched. Each step queues every sequence's next decoding step before any token is
//! read, so the device always has work.
use super::metrics::EngineMetrics;
use super::request::SeqId;
use super::sequence::{Prefill, Sequence};
use super::stage::{Leave, Left, Outcome, Stage};
use crate::error::Result;
use crate::step::KvQuantization;
use mlx_array::{transforms, Array};
use mlx_models::LanguageModel;
use std::time::Instant;

/// The sequences generating alone.
#[derive(Default)]
pub(crate) struct Alone {
    seqs: Vec<Sequence>,
}

impl Alone {
    /// Adds an admitted sequence.
    pub fn push(&mut self, seq: Sequence) {
        self.seqs.push(seq);
    }

    /// The sequences [`Alone::prefill`] with `budget` steps.
    pub fn prefilling(&self, budget: usize) -> Vec<SeqId> {
        let prefilling = self.seqs.iter().filter(|s| !s.decoding());
        prefilling.take(budget).map(|s| s.id()).collect()
    }

    /// The sequences [`Alone::decode`] steps.
    pub fn decoding(&self) -> Vec<SeqId> {
        let decoding = self.seqs.iter().filter(|s| s.decoding());
        decoding.map(|s| s.id()).collect()
    }

    /// One prefill chunk (or the first decoding step) of up to `budget` sequences still
    /// prefilling, in order.
    pub fn prefill(
        &mut self,
        model: &dyn LanguageModel,
        budget: usize,
        step_size: usize,
        kv: Option<KvQuantization>,
        metrics: &EngineMetrics,
    ) -> Vec<(SeqId, Outcome)> {
        let mut out = Vec::new();
        for s in self.seqs.iter_mut().filter(|s| !s.decoding()).take(budget) {
            let tic = Instant::now();
            let adapter = [s.job().req.adapter];
            let r =
                mlx_nn::lora::with_row_adapters(&adapter, || s.prefill_alone(model, step_size, kv));
            metrics.prefill_micros.add(tic.elapsed().as_micros() as u64);
            match r {
                Ok(Prefill::Chunk(processed, total)) => {
                    out.push((s.id(), Outcome::Progress { processed, total }))
                }
                Ok(Prefill::Started) => {}
                Ok(Prefill::Prompt(o)) => out.push((s.id(), o)),
                Err(e) => out.push((s.id(), Outcome::Failed(e))),
            }
        }
        out
    }

    /// Queues the next step of every decoding sequence, then reads each one's token.
    pub fn decode(
        &mut self,
        model: &dyn LanguageModel,
        kv: Option<KvQuantization>,
        metrics: &EngineMetrics,
    ) -> Vec<(SeqId, Outcome)> {
        let mut out: Vec<(SeqId, Outcome)> = Vec::new();
        let mut nexts: Vec<Option<(Array, Array)>> = Vec::with_capacity(self.seqs.len());
        let mut failed: Vec<usize> = Vec::new();
        for (i, s) in self.seqs.iter_mut().enumerate() {
            if !s.decoding() {
                nexts.push(None);
                continue;
            }
            let adapter = [s.job().req.adapter];
            match mlx_nn::lora::with_row_adapters(&adapter, || s.queue_next(model, kv)) {
                Ok(n) => {
                    if n.is_some() {
                        metrics.decode_steps.add(1);
                        metrics.decode_rows.add(1);
                    }
                    nexts.push(n)
                }
                Err(e) => {
                    nexts.push(None);
                    failed.push(i);
                    out.push((s.id(), Outcome::Failed(e)));
                }
            }
        }
        let pending: Vec<&Array> = nexts.iter().flatten().flat_map(|(y, lp)| [y, lp]).collect();
        if !pending.is_empty() {
            if let Err(e) = transforms::async_eval(&pending) {
                tracing::warn!("engine: batched evaluation failed ({e}); evaluating per sequence");
                for (i, n) in nexts.iter().enumerate() {
                    if let Some((y, lp)) = n {
                        if let Err(e) = transforms::eval(&[y, lp]) {
                            failed.push(i);
                            out.push((self.seqs[i].id(), Outcome::Failed(e.into())));
                        }
                    }
                }
            }
        }
        for (i, next) in nexts.into_iter().enumerate() {
            let s = &mut self.seqs[i];
            if failed.contains(&i) || !s.decoding() {
                continue;
            }
            let adapter = [s.job().req.adapter];
            match mlx_nn::lora::with_row_adapters(&adapter, || s.emit(model, kv, next)) {
                Ok(t) => out.push((s.id(), Outcome::Token(t))),
                Err(e) => out.push((s.id(), Outcome::Failed(e))),
            }
        }
        out
    }
}

impl Stage for Alone {
    fn len(&self) -> usize {
        self.seqs.len()
    }

    fn nbytes(&self) -> usize {
        self.seqs.iter().map(|s| s.nbytes()).sum()
    }

    fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.seqs.iter_mut().find(|s| s.id() == id)
    }

    fn stepping(&self) -> Vec<SeqId> {
        self.seqs.iter().map(|s| s.id()).collect()
    }

    fn cancelled(&self) -> Vec<SeqId> {
        self.seqs
            .iter()
            .filter(|s| s.job().cancelled())
            .map(|s| s.id())
            .collect()
    }

    /// Sequences keep their own caches: [`Left::caches`] stays `None`.
    fn remove(&mut self, leaving: &[(SeqId, Leave)]) -> Result<Vec<Left>> {
        let (gone, kept): (Vec<Sequence>, Vec<Sequence>) = std::mem::take(&mut self.seqs)
            .into_iter()
            .partition(|s| leaving.iter().any(|(id, _)| *id == s.id()));
        self.seqs = kept;
        Ok(gone
            .into_iter()
            .map(|seq| Left { seq, caches: None })
            .collect())
    }

    fn drain(&mut self) -> Vec<Sequence> {
        std::mem::take(&mut self.seqs)
    }
}

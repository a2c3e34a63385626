//! Prompts prefilled together (mlx-lm's `PromptProcessingBatch`): admitted sequences
//! queue here; up to `--prompt-concurrency` of them share one batch cache, and each
//! step feeds every one its next chunk (at most `--prefill-step-size` tokens, never the
//! last prompt token) in one forward pass, right-padded to the longest chunk
//! (`prepare`), the padding then rolled in front of each row (`finalize`). A sequence
//! whose prompt is in the cache but for its last token is split off, with its rows of
//! the cache, to the decode batch.
use super::decode::{cache_err, merge_caches};
use super::request::SeqId;
use super::sequence::Sequence;
use super::stage::{Leave, Left, Outcome, Stage};
use crate::error::{EngineError, Result};
use crate::step;
use mlx_array::Array;
use mlx_cache::BatchPromptCache;
use mlx_models::LanguageModel;
use std::collections::VecDeque;

/// Admitted sequences waiting to prefill, and those prefilling together with their
/// batch caches.
#[derive(Default)]
pub(crate) struct PrefillBatch {
    queue: VecDeque<Sequence>,
    rows: Vec<Sequence>,
    cache: BatchPromptCache,
}

impl PrefillBatch {
    /// Queues an admitted sequence.
    pub fn push(&mut self, seq: Sequence) {
        self.queue.push_back(seq);
    }

    /// Rows prefilling now.
    pub fn prefilling(&self) -> usize {
        self.rows.len()
    }

    /// Queued sequences that need no prefill (a prompt-cache hit left only the last
    /// prompt token), in order.
    pub fn take_cache_hits(&mut self) -> Vec<Sequence> {
        let (hits, rest): (Vec<Sequence>, Vec<Sequence>) = self
            .queue
            .drain(..)
            .partition(|s| s.last_prompt_token().is_some());
        self.queue = rest.into();
        hits
    }

    /// Moves queued sequences into the batch up to `concurrency` rows; their caches
    /// (empty, or a prompt-cache prefix) are merged in. On failure they come back.
    pub fn fill(&mut self, concurrency: usize) -> Result<(), (Vec<Sequence>, EngineError)> {
        let room = concurrency
            .saturating_sub(self.rows.len())
            .min(self.queue.len());
        if room == 0 {
            return Ok(());
        }
        let mut seqs: Vec<Sequence> = self.queue.drain(..room).collect();
        if let Err(e) = merge_caches(&mut self.cache, &mut seqs) {
            return Err((seqs, e));
        }
        self.rows.extend(seqs);
        Ok(())
    }

    /// One chunk of every row in one forward pass: each row's progress. An `Err` fails
    /// the whole batch.
    /// With `checkpoints`, a row whose chunk ended a prompt segment also gives a copy
    /// of its caches ([`Outcome::Checkpoint`]).
    pub fn step(
        &mut self,
        model: &dyn LanguageModel,
        step_size: usize,
        checkpoints: bool,
    ) -> Result<Vec<(SeqId, Outcome)>> {
        let chunks: Vec<&[u32]> = self
            .rows
            .iter()
            .map(|r| r.next_chunk(step_size, true))
            .collect();
        let lengths: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        if lengths.iter().all(|&n| n == 0) {
            return Ok(Vec::new());
        }
        let adapters: Vec<u32> = self.rows.iter().map(|r| r.job().req.adapter).collect();
        let logits = mlx_nn::lora::with_row_adapters(&adapters, || {
            padded_forward(model, &mut self.cache, &chunks)
        })?;
        // Rows that asked for their prompt's log-probabilities read their positions of
        // the chunk's logits (right-padded: a row's tokens come first); for the others
        // the logits are never evaluated.
        let vocab = logits.dim(-1)?;
        for (row, (r, &n)) in self.rows.iter_mut().zip(&lengths).enumerate() {
            if n > 0 && r.wants_prompt_logprobs() {
                let i = row as i32;
                let mine = logits
                    .slice(&[i, 0, 0], &[i + 1, n as i32, vocab], None)?
                    .squeeze(Some(&[0]))?;
                r.score_prefill_chunk(&mine, n)?;
            }
        }
        drop(logits);
        mlx_array::memory::clear_cache();
        let mut progress = Vec::with_capacity(self.rows.len());
        for (i, (r, &n)) in self.rows.iter_mut().zip(&lengths).enumerate() {
            let (processed, total) = r.advance_prefill(n)?;
            progress.push((r.id(), Outcome::Progress { processed, total }));
            if let Some(kind) = r.checkpoint().filter(|_| checkpoints && n > 0) {
                // mlx-lm's `extract_cache` of the rows that ended a segment; evaluated
                // now so the copy does not keep the batch's buffers alive.
                let caches = self
                    .cache
                    .extract(i)
                    .map_err(cache_err)
                    .and_then(|c| step::eval_state(&c).map(|()| c));
                match caches {
                    Ok(caches) => progress.push((
                        r.id(),
                        Outcome::Checkpoint {
                            tokens: r.prompt_done().to_vec(),
                            caches,
                            kind,
                        },
                    )),
                    Err(e) => tracing::warn!("engine: no prompt-cache checkpoint: {e}"),
                }
            }
            if let Some(o) = r.prompt_outcome() {
                progress.push((r.id(), o));
            }
        }
        Ok(progress)
    }

    /// Splits off the rows whose prompt is prefilled but for the last token, with their
    /// caches.
    pub fn take_ready(&mut self) -> Result<Option<(Vec<Sequence>, BatchPromptCache)>> {
        let ready: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].last_prompt_token().is_some())
            .collect();
        if ready.is_empty() {
            return Ok(None);
        }
        let cache = self.cache.split(&ready).map_err(cache_err)?;
        Ok(Some((self.take_rows(&ready), cache)))
    }

    /// Empties the batch after a failed step, handing its rows back (queued sequences
    /// stay).
    pub fn drain_rows(&mut self) -> Vec<Sequence> {
        self.cache = BatchPromptCache::new();
        std::mem::take(&mut self.rows)
    }

    /// Moves rows `idx` out (the cache already follows the remaining rows).
    fn take_rows(&mut self, idx: &[usize]) -> Vec<Sequence> {
        let mut all: Vec<Option<Sequence>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        let taken = idx.iter().filter_map(|&i| all[i].take()).collect();
        self.rows = all.into_iter().flatten().collect();
        taken
    }
}

/// One forward pass of `chunks` (each row's next prompt tokens, some maybe none) into
/// `cache`, right-padded to the longest chunk, the padding then rolled in front of each
/// row (mlx-lm's `prepare` / `finalize`). Returns the logits `[rows, longest, vocab]`,
/// a row's positions first; the caches are evaluated.
pub(crate) fn padded_forward(
    model: &dyn LanguageModel,
    cache: &mut BatchPromptCache,
    chunks: &[&[u32]],
) -> Result<Array> {
    let longest = chunks.iter().map(|c| c.len()).max().unwrap_or(0);
    let mut tokens = Vec::with_capacity(chunks.len() * longest);
    for c in chunks {
        tokens.extend_from_slice(c);
        tokens.extend(std::iter::repeat_n(0u32, longest - c.len()));
    }
    let x = Array::from_slice(&tokens, &[chunks.len() as i32, longest as i32])?;
    let padding: Vec<i32> = chunks.iter().map(|c| (longest - c.len()) as i32).collect();
    let padded = padding.iter().any(|&p| p > 0);
    if padded {
        let lens: Vec<i32> = chunks.iter().map(|c| c.len() as i32).collect();
        cache
            .prepare_right_padding(&lens, &padding)
            .map_err(cache_err)?;
    }
    let logits = step::prefill(model, &x, cache.layers_mut(), None)?;
    if padded {
        cache.finalize().map_err(cache_err)?;
        step::eval_state(cache.layers())?;
    }
    Ok(logits)
}

impl Stage for PrefillBatch {
    fn len(&self) -> usize {
        self.queue.len() + self.rows.len()
    }

    fn nbytes(&self) -> usize {
        self.cache.nbytes() + self.queue.iter().map(|s| s.nbytes()).sum::<usize>()
    }

    fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.rows
            .iter_mut()
            .chain(self.queue.iter_mut())
            .find(|r| r.id() == id)
    }

    fn stepping(&self) -> Vec<SeqId> {
        self.rows.iter().map(|r| r.id()).collect()
    }

    fn cancelled(&self) -> Vec<SeqId> {
        self.rows
            .iter()
            .chain(self.queue.iter())
            .filter(|r| r.job().cancelled())
            .map(|r| r.id())
            .collect()
    }

    /// Sequences leave without their caches (they have not generated yet).
    fn remove(&mut self, leaving: &[(SeqId, Leave)]) -> Result<Vec<Left>> {
        let leaves = |s: &Sequence| leaving.iter().any(|(id, _)| *id == s.id());
        let mut left: Vec<Left> = Vec::new();
        let (gone, kept): (Vec<Sequence>, Vec<Sequence>) = self.queue.drain(..).partition(leaves);
        self.queue = kept.into();
        left.extend(gone.into_iter().map(|seq| Left { seq, caches: None }));
        let idx: Vec<usize> = (0..self.rows.len())
            .filter(|&i| leaves(&self.rows[i]))
            .collect();
        if !idx.is_empty() {
            let keep: Vec<usize> = (0..self.rows.len()).filter(|i| !idx.contains(i)).collect();
            self.cache.filter(&keep).map_err(cache_err)?;
            left.extend(
                self.take_rows(&idx)
                    .into_iter()
                    .map(|seq| Left { seq, caches: None }),
            );
        }
        Ok(left)
    }

    fn drain(&mut self) -> Vec<Sequence> {
        self.cache = BatchPromptCache::new();
        let mut all: Vec<Sequence> = std::mem::take(&mut self.rows);
        all.extend(self.queue.drain(..));
        all
    }
}

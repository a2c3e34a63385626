//! Prompts prefilled together (mlx-lm's `PromptProcessingBatch`): up to
//! `--prompt-concurrency` sequences share one batch cache, and each loop feeds every one
//! its next chunk (at most `--prefill-step-size` tokens, never the last prompt token)
//! in one forward pass, right-padded to the longest chunk (`prepare`), the padding then
//! rolled in front of each row (`finalize`). A sequence whose prompt is in the cache but
//! for its last token is split off, with its rows of the cache, to the decode batch.
use crate::error::ApiError;
use crate::sequence::{mlx_err, Sequence};
use mlx_array::{transforms, Array};
use mlx_cache::{BatchPromptCache, KvCache, PromptCache};
use mlx_models::LanguageModel;

/// The sequences prefilling together and their batch caches.
#[derive(Default)]
pub struct PrefillBatch {
    rows: Vec<Sequence>,
    cache: BatchPromptCache,
}

/// Progress of one row after a chunk: `(row, processed, total)` of its uncached prompt.
pub type Progress = (usize, usize, usize);

impl PrefillBatch {
    /// An empty batch.
    pub fn new() -> PrefillBatch {
        PrefillBatch::default()
    }

    /// Rows prefilling.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row prefills.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows.
    pub fn rows(&self) -> &[Sequence] {
        &self.rows
    }

    /// Bytes held by the batch caches.
    pub fn nbytes(&self) -> usize {
        self.cache.nbytes()
    }

    /// Adds sequences with at least two prompt tokens left; their caches (empty, or a
    /// prompt-cache prefix) are merged into the batch. On failure they come back.
    pub fn add(&mut self, mut seqs: Vec<Sequence>) -> Result<(), (Vec<Sequence>, ApiError)> {
        if seqs.is_empty() {
            return Ok(());
        }
        let caches: Vec<PromptCache> = seqs
            .iter_mut()
            .map(|s| std::mem::take(&mut s.caches))
            .collect();
        let merged = {
            let refs: Vec<&[Box<dyn KvCache>]> = caches.iter().map(|c| c.as_slice()).collect();
            BatchPromptCache::merge(&refs)
        };
        if let Err(e) = merged.and_then(|m| self.cache.extend(m)) {
            for (s, c) in seqs.iter_mut().zip(caches) {
                s.caches = c;
            }
            return Err((seqs, cache_err(e)));
        }
        self.rows.extend(seqs);
        Ok(())
    }

    /// One chunk of every row in one forward pass. An `Err` fails the whole batch.
    pub fn step(
        &mut self,
        model: &dyn LanguageModel,
        step_size: usize,
    ) -> Result<Vec<Progress>, ApiError> {
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        let lengths: Vec<usize> = self
            .rows
            .iter()
            .map(|r| r.next_chunk(step_size).len())
            .collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Ok(Vec::new());
        }
        let mut tokens = Vec::with_capacity(self.rows.len() * longest);
        for r in &self.rows {
            let part = r.next_chunk(step_size);
            tokens.extend_from_slice(part);
            tokens.extend(std::iter::repeat_n(0u32, longest - part.len()));
        }
        let x = Array::from_slice(&tokens, &[self.rows.len() as i32, longest as i32])
            .map_err(mlx_err)?;
        let padding: Vec<i32> = lengths.iter().map(|&n| (longest - n) as i32).collect();
        let padded = padding.iter().any(|&p| p > 0);
        if padded {
            let lens: Vec<i32> = lengths.iter().map(|&n| n as i32).collect();
            self.cache
                .prepare_right_padding(&lens, &padding)
                .map_err(cache_err)?;
        }
        {
            let _pipelined = mlx_nn::pipeline::PipelinedPrefill::from_env();
            model
                .forward(&x, self.cache.layers_mut())
                .map_err(mlx_err)?;
        }
        self.eval_state()?;
        if padded {
            self.cache.finalize().map_err(cache_err)?;
            self.eval_state()?;
        }
        mlx_array::memory::clear_cache();
        let mut progress = Vec::with_capacity(self.rows.len());
        for (i, (r, &n)) in self.rows.iter_mut().zip(&lengths).enumerate() {
            let (done, total) = r.advance_prefill(n)?;
            progress.push((i, done, total));
        }
        Ok(progress)
    }

    fn eval_state(&self) -> Result<(), ApiError> {
        let state: Vec<Array> = self.cache.layers().iter().flat_map(|c| c.state()).collect();
        transforms::eval(&state.iter().collect::<Vec<_>>()).map_err(mlx_err)
    }

    /// Splits off the rows whose prompt is prefilled but for the last token, with their
    /// caches.
    pub fn take_ready(&mut self) -> Result<Option<(Vec<Sequence>, BatchPromptCache)>, ApiError> {
        let ready: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].last_prompt_token().is_some())
            .collect();
        if ready.is_empty() {
            return Ok(None);
        }
        let cache = self.cache.split(&ready).map_err(cache_err)?;
        Ok(Some((self.take_rows(&ready), cache)))
    }

    /// Drops rows (cancelled ones) and hands them back.
    pub fn remove(&mut self, gone: &[usize]) -> Result<Vec<Sequence>, ApiError> {
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|i| !gone.contains(i)).collect();
        self.cache.filter(&keep).map_err(cache_err)?;
        Ok(self.take_rows(gone))
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

    /// Empties the batch, handing every row back (after a failure).
    pub fn drain(&mut self) -> Vec<Sequence> {
        self.cache = BatchPromptCache::new();
        std::mem::take(&mut self.rows)
    }
}

fn cache_err(e: mlx_cache::CacheError) -> ApiError {
    ApiError::unavailable(format!("batching the KV caches failed: {e}"))
}

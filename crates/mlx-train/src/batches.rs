//! mlx-lm's training batches (`tuner.trainer.iterate_batches` over a `CacheDataset`):
//! rows tokenized on first use and kept, row indices sorted by the row's length (for
//! a JSON row, as `len(dict)`: its number of keys, so a stable no-op for uniform rows),
//! cut into batches, the batches visited in the order of NumPy's global
//! `np.random.permutation` (one [`RandomState`] shared by training, validation and
//! test, as mlx-lm shares NumPy's global state), each padded with zeros to one plus a
//! multiple of 32 tokens, at most `max_seq_length`, longer rows truncated with mlx-lm's
//! warning.
use crate::error::{Result, TrainError};
use mlx_array::Array;
use mlx_eval::{Dataset, RandomState};
use mlx_tokenizer::Tokenizer;

/// A dataset whose rows are tokenized on first use (mlx-lm's `CacheDataset`).
pub struct TokenDataset<'a> {
    data: &'a Dataset,
    tokenizer: &'a Tokenizer,
    cache: Vec<Option<(Vec<u32>, usize)>>,
}

impl<'a> TokenDataset<'a> {
    /// Wraps `data`, tokenized with `tokenizer`.
    pub fn new(data: &'a Dataset, tokenizer: &'a Tokenizer) -> TokenDataset<'a> {
        TokenDataset {
            data,
            tokenizer,
            cache: vec![None; data.len()],
        }
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// `itemlen`: `len()` of the raw row (a JSON object's number of keys).
    fn itemlen(&self, idx: usize) -> usize {
        self.data
            .row(idx)
            .and_then(|r| r.as_object())
            .map_or(0, |o| o.len())
    }

    /// The row's tokens and the offset where its loss starts.
    pub fn get(&mut self, idx: usize) -> Result<&(Vec<u32>, usize)> {
        if self.cache.get(idx).is_none() {
            return Err(TrainError::Invalid(format!(
                "row {idx} of a dataset of {} rows",
                self.cache.len()
            )));
        }
        if self.cache[idx].is_none() {
            let (ids, offset) = self.data.process(idx, self.tokenizer)?;
            if ids.is_empty() {
                return Err(TrainError::Data(format!("row {} has no tokens", idx + 1)));
            }
            self.cache[idx] = Some((ids, offset));
        }
        self.cache[idx]
            .as_ref()
            .ok_or_else(|| TrainError::Invalid("a cached row vanished".into()))
    }
}

/// One batch: tokens `[batch, length]` (int32, zero-padded) and per row
/// `(loss offset, length)` `[batch, 2]` (int32).
pub struct Batch {
    /// The tokens.
    pub tokens: Array,
    /// The offsets and lengths.
    pub lengths: Array,
}

/// mlx-lm's `iterate_batches` generator, advanced with [`BatchIter::next`].
pub struct BatchIter {
    batch_idx: Vec<Vec<usize>>,
    batch_size: usize,
    max_seq_length: usize,
    repeat: bool,
    order: Vec<usize>,
    pos: usize,
    started: bool,
    done: bool,
}

impl BatchIter {
    /// The generator for `data` (nothing is drawn until the first [`BatchIter::next`]).
    /// Fewer rows than `batch_size` is mlx-lm's error.
    pub fn new(
        data: &TokenDataset<'_>,
        batch_size: usize,
        max_seq_length: usize,
        repeat: bool,
    ) -> Result<BatchIter> {
        if batch_size == 0 {
            return Err(TrainError::Invalid(
                "--batch-size must be at least 1".into(),
            ));
        }
        let mut idx: Vec<usize> = (0..data.len()).collect();
        idx.sort_by_key(|&i| data.itemlen(i));
        if data.len() < batch_size {
            return Err(TrainError::Data(format!(
                "Dataset must have at least batch_size={batch_size} examples but only has {}.",
                data.len()
            )));
        }
        let batch_idx = (0..=idx.len() - batch_size)
            .step_by(batch_size)
            .map(|i| idx[i..i + batch_size].to_vec())
            .collect();
        Ok(BatchIter {
            batch_idx,
            batch_size,
            max_seq_length,
            repeat,
            order: Vec::new(),
            pos: 0,
            started: false,
            done: false,
        })
    }

    /// Number of batches in one pass.
    pub fn batches_per_pass(&self) -> usize {
        self.batch_idx.len()
    }

    /// The next batch (`None` after one pass unless repeating). A permutation of the
    /// batches is drawn from `rng` when a pass starts. `warn` gets mlx-lm's warning
    /// about truncated rows.
    pub fn next(
        &mut self,
        data: &mut TokenDataset<'_>,
        rng: &mut RandomState,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        if !self.started || self.pos == self.order.len() {
            if self.started && !self.repeat {
                self.done = true;
                return Ok(None);
            }
            self.started = true;
            self.order = rng.permutation(self.batch_idx.len());
            self.pos = 0;
        }
        let rows = &self.batch_idx[self.order[self.pos]];
        self.pos += 1;
        let mut seqs: Vec<(Vec<u32>, usize)> = Vec::with_capacity(rows.len());
        for &j in rows {
            seqs.push(data.get(j)?.clone());
        }
        let longest = seqs.iter().map(|(t, _)| t.len()).max().unwrap_or(0);
        let max = self.max_seq_length;
        if longest > max {
            warn(&format!(
                "[WARNING] Some sequences are longer than {max} tokens. The longest sentence \
                 {longest} will be truncated to {max}. Consider pre-splitting your data to \
                 save memory."
            ));
        }
        let pad_to = 32;
        let width = (1 + pad_to * longest.div_ceil(pad_to)).min(max);
        let mut tokens = vec![0i32; self.batch_size * width];
        let mut lengths = Vec::with_capacity(self.batch_size * 2);
        for (j, (t, offset)) in seqs.iter().enumerate() {
            let n = t.len().min(max);
            for (k, &id) in t[..n].iter().enumerate() {
                tokens[j * width + k] = id as i32;
            }
            lengths.push(*offset as i32);
            lengths.push(n as i32);
        }
        Ok(Some(Batch {
            tokens: Array::from_slice(&tokens, &[self.batch_size as i32, width as i32])?,
            lengths: Array::from_slice(&lengths, &[self.batch_size as i32, 2])?,
        }))
    }
}

//! mlx-lm's `ArraysCache`: the recurrent state of linear-attention and state-space
//! layers (a convolution window and an SSM / delta-net state), held as a fixed number
//! of array slots instead of keys and values.
//!
//! It cannot be trimmed (a recurrent state cannot forget its last tokens: mlx-lm's
//! `is_trimmable` is false, so prompt caches holding one are never trimmed and
//! speculative decoding over them is refused), and it has no `offset` (it reports 0,
//! as mlx-lm's `size()` does).
use crate::error::{CacheError, Result};
use mlx_array::{ops, Array, Dtype};
use mlx_nn::cache::{ArraysState, AttnMask, KvCache, KvFetch};
use std::any::Any;

/// mlx-lm's `ArraysCache(size, left_padding)`.
#[derive(Debug, Clone)]
pub struct ArraysCache {
    pub(crate) state: ArraysState,
}

impl ArraysCache {
    /// `size` empty slots (mlx-lm's `ArraysCache(size)`).
    pub fn new(size: usize) -> ArraysCache {
        ArraysCache {
            state: ArraysState::new(size),
        }
    }

    /// Empty slots for a batch whose rows are left-padded by `left_padding` positions.
    pub fn with_left_padding(size: usize, left_padding: &[i32]) -> Result<ArraysCache> {
        let mut c = ArraysCache::new(size);
        if !left_padding.is_empty() {
            c.state.left_padding = Some(Array::from_slice(
                left_padding,
                &[left_padding.len() as i32],
            )?);
        }
        Ok(c)
    }

    /// Rebuilds a cache from its saved state (mlx-lm's `from_state`).
    pub fn from_parts(
        cache: Vec<Option<Array>>,
        left_padding: Option<Array>,
        lengths: Option<Array>,
    ) -> ArraysCache {
        ArraysCache {
            state: ArraysState {
                cache,
                left_padding,
                lengths,
            },
        }
    }

    /// The slots, padding and lengths.
    pub fn slots(&self) -> &ArraysState {
        &self.state
    }

    /// Rows held (mlx-lm's `batch_size`): the first set slot's leading dimension, else
    /// the padding's or lengths' size, else 1.
    pub fn batch_size(&self) -> Result<i32> {
        if let Some(c) = self.state.cache.iter().flatten().next() {
            return Ok(c.dim(0)?);
        }
        if let Some(p) = &self.state.left_padding {
            return Ok(p.size() as i32);
        }
        if let Some(l) = &self.state.lengths {
            return Ok(l.size() as i32);
        }
        Ok(1)
    }

    /// mlx-lm's `prepare(lengths=...)`: the rows' token counts for a batched prefill.
    pub fn prepare(&mut self, lengths: &[i32]) -> Result<()> {
        self.state.lengths = Some(Array::from_slice(lengths, &[lengths.len() as i32])?);
        Ok(())
    }

    /// mlx-lm's `finalize()`: forgets lengths and padding once a batch is prefilled.
    pub fn finalize(&mut self) {
        self.state.lengths = None;
        self.state.left_padding = None;
    }

    /// mlx-lm's `ArraysCache.merge(caches)`: one batch of the given single-row caches,
    /// each slot a zero array of the batch filled row by row (all empty: empty slots and
    /// a zero left padding).
    pub fn merge(caches: &[&ArraysCache]) -> Result<ArraysCache> {
        let Some(first) = caches.first() else {
            return Err(CacheError::InvalidArgument(
                "ArraysCache.merge of no caches".into(),
            ));
        };
        let n_state = first.state.cache.len();
        if let Some(bad) = caches.iter().position(|c| c.state.cache.len() != n_state) {
            return Err(CacheError::InvalidArgument(format!(
                "ArraysCache.merge: cache {bad} has {} slots, cache 0 has {n_state}",
                caches[bad].state.cache.len()
            )));
        }
        let b = caches.len() as i32;
        let mut out = ArraysCache::new(n_state);
        if caches.iter().all(|c| c.is_empty()) {
            out.state.left_padding = Some(ops::zeros(&[b], Dtype::Int32)?);
            return Ok(out);
        }
        for e in 0..n_state {
            let Some(init) = caches.iter().find_map(|c| c.state.get(e)) else {
                continue;
            };
            let mut shape = init.shape();
            shape[0] = b;
            let mut merged = ops::zeros(&shape, init.dtype())?;
            for (i, c) in caches.iter().enumerate() {
                let Some(a) = c.state.get(e) else { continue };
                let mut start = vec![0; shape.len()];
                let mut stop = shape.clone();
                start[0] = i as i32;
                stop[0] = i as i32 + 1;
                merged = merged.slice_update(a, &start, &stop, None)?;
            }
            out.state.cache[e] = Some(merged);
        }
        Ok(out)
    }

    /// mlx-lm's `filter(batch_indices)`: keeps the given rows (int32 indices).
    pub fn filter(&mut self, batch_indices: &Array) -> Result<()> {
        for c in self.state.cache.iter_mut().flatten() {
            *c = c.take(batch_indices, Some(0))?;
        }
        if let Some(p) = &self.state.left_padding {
            self.state.left_padding = Some(p.take(batch_indices, Some(0))?);
        }
        if let Some(l) = &self.state.lengths {
            self.state.lengths = Some(l.take(batch_indices, Some(0))?);
        }
        Ok(())
    }

    /// mlx-lm's `extend(other)`: appends `other`'s rows; a slot set on one side only is
    /// zeros on the other.
    pub fn extend(&mut self, other: &ArraysCache) -> Result<()> {
        if other.state.cache.len() != self.state.cache.len() {
            return Err(CacheError::InvalidArgument(format!(
                "ArraysCache.extend: {} slots onto {}",
                other.state.cache.len(),
                self.state.cache.len()
            )));
        }
        let (a_batch, b_batch) = (self.batch_size()?, other.batch_size()?);
        let cat = |a: Option<&Array>, b: Option<&Array>| -> Result<Option<Array>> {
            let Some(like) = b.or(a) else {
                return Ok(None);
            };
            let (shape, dtype) = (like.shape(), like.dtype());
            let fill = |n: i32| -> Result<Array> {
                let mut s = shape.clone();
                s[0] = n;
                Ok(ops::zeros(&s, dtype)?)
            };
            let a = match a {
                Some(a) => a.clone(),
                None => fill(a_batch)?,
            };
            let b = match b {
                Some(b) => b.clone(),
                None => fill(b_batch)?,
            };
            Ok(Some(ops::concatenate(&[&a, &b], 0)?))
        };
        let cache = self
            .state
            .cache
            .iter()
            .zip(&other.state.cache)
            .map(|(a, b)| cat(a.as_ref(), b.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        self.state.left_padding = cat(
            self.state.left_padding.as_ref(),
            other.state.left_padding.as_ref(),
        )?;
        self.state.lengths = cat(self.state.lengths.as_ref(), other.state.lengths.as_ref())?;
        self.state.cache = cache;
        Ok(())
    }

    /// mlx-lm's `extract(idx)`: row `idx` as a single-sequence cache (slots only).
    pub fn extract(&self, idx: i32) -> Result<ArraysCache> {
        let mut out = ArraysCache::new(self.state.cache.len());
        for (slot, c) in out.state.cache.iter_mut().zip(&self.state.cache) {
            *slot = match c {
                Some(c) => Some(c.slice_axis(0, idx, idx + 1)?),
                None => {
                    return Err(CacheError::InvalidArgument(
                        "ArraysCache.extract: a state slot is empty".into(),
                    ))
                }
            };
        }
        Ok(out)
    }
}

impl KvCache for ArraysCache {
    /// 0: a recurrent state does not count positions (mlx-lm's `ArraysCache` has no
    /// `offset`, and its `size()` is 0).
    fn offset(&self) -> i32 {
        0
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> mlx_array::Result<KvFetch> {
        Err(mlx_array::Error::InvalidArgument(
            "ArraysCache holds a recurrent state, not keys and values (an attention layer \
             was given a linear-attention layer's cache)"
                .into(),
        ))
    }

    /// mlx-lm's `ArraysCache.make_mask(N)` (the arguments of attention masks do not
    /// apply).
    fn make_mask(
        &self,
        n: i32,
        _return_array: bool,
        _window_size: Option<i32>,
    ) -> mlx_array::Result<AttnMask> {
        Ok(match self.state.make_mask(n)? {
            Some(m) => AttnMask::Array(m),
            None => AttnMask::None,
        })
    }

    fn size(&self) -> i32 {
        0
    }

    fn nbytes(&self) -> usize {
        self.state.cache.iter().flatten().map(|a| a.nbytes()).sum()
    }

    /// mlx-lm's `empty()`: the first slot is unset.
    fn is_empty(&self) -> bool {
        self.state.get(0).is_none()
    }

    fn state(&self) -> Vec<Array> {
        let s = &self.state;
        s.cache
            .iter()
            .flatten()
            .chain(s.left_padding.iter())
            .chain(s.lengths.iter())
            .cloned()
            .collect()
    }

    fn class_name(&self) -> &'static str {
        "ArraysCache"
    }

    fn arrays(&self) -> Option<&ArraysState> {
        Some(&self.state)
    }

    fn arrays_mut(&mut self) -> Option<&mut ArraysState> {
        Some(&mut self.state)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

//! mlx-lm's `BatchRotatingKVCache`: sliding-window caches of several sequences in one
//! left-padded buffer (the batch counterpart of [`RotatingKVCache`] with `keep = 0`).
//!
//! The buffer holds at most `max_size` positions; once full, single-token updates
//! overwrite the oldest column and the mask is rolled to match. Rows join with
//! [`BatchRotatingKVCache::merge`] and [`BatchRotatingKVCache::extend`]; prompts
//! prefilled together in right-padded chunks go through
//! [`BatchRotatingKVCache::prepare`] (with `right_padding`) and
//! [`BatchRotatingKVCache::finalize`], which rolls each row's padding in front, as in
//! mlx-lm.
use crate::batch::{
    advance_offsets, batch_kv_methods, int_array, per_row_offsets, row, ExtendTo, MergeBuffers,
    Roller, Rows,
};
use crate::error::CacheError;
use crate::kv::STEP;
use crate::rotating::RotatingKVCache;
use crate::util::{cat2, dims4, first_positions, kv_pair_methods, seq, seq_update};
use mlx_array::{ops::arange, ops::zeros, Array, Dtype, Result};
use mlx_nn::cache::{AttnMask, KvCache, KvFetch, RopePosition};

/// mlx-lm's `BatchRotatingKVCache(max_size, left_padding)`.
#[derive(Debug, Clone)]
pub struct BatchRotatingKVCache {
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) left_padding: Vec<i32>,
    pub(crate) offsets: Vec<i32>,
    /// `offsets` as an int32 array, advanced with `+ S` on every update like mlx-lm's
    /// `offset` (rebuilt from the host values after any other change).
    pub(crate) offset_array: Option<Array>,
    pub(crate) max_size: i32,
    /// Write position in the buffer (mlx-lm's `_idx`).
    pub(crate) idx: i32,
    /// Positions written in total, padding included (mlx-lm's `_offset`).
    pub(crate) written: i32,
    pub(crate) rotated: bool,
    /// Real end of each row during a right-padded prefill (mlx-lm's `_lengths`).
    pub(crate) lengths: Option<Vec<i32>>,
}

fn bad(msg: String) -> mlx_array::Error {
    mlx_array::Error::InvalidArgument(msg)
}

impl BatchRotatingKVCache {
    /// An empty cache of window `max_size` for rows left-padded by `left_padding`.
    pub fn new(max_size: i32, left_padding: &[i32]) -> BatchRotatingKVCache {
        BatchRotatingKVCache {
            keys: None,
            values: None,
            left_padding: left_padding.to_vec(),
            offsets: left_padding.iter().map(|l| -l).collect(),
            offset_array: None,
            max_size,
            idx: 0,
            written: 0,
            rotated: false,
            lengths: None,
        }
    }

    fn rows(&mut self) -> Rows<'_> {
        Rows {
            what: "BatchRotatingKVCache",
            keys: &mut self.keys,
            values: &mut self.values,
            left_padding: &mut self.left_padding,
            offsets: &mut self.offsets,
            offset_array: &mut self.offset_array,
        }
    }

    /// mlx-lm's `prepare`: more left padding (only while empty), or the real `lengths`
    /// of a right-padded prefill chunk (with its `right_padding`), so padding never
    /// evicts real positions and [`BatchRotatingKVCache::finalize`] can roll it away.
    #[track_caller]
    pub fn prepare(
        &mut self,
        left_padding: Option<&[i32]>,
        lengths: Option<&[i32]>,
        right_padding: Option<&[i32]>,
    ) -> Result<()> {
        self.rows().prepare(left_padding, lengths, right_padding)?;
        if right_padding.is_some_and(|rp| rp.iter().any(|&p| p > 0)) {
            let lengths = lengths.ok_or_else(|| {
                bad("BatchRotatingKVCache::prepare: right padding needs the lengths".into())
            })?;
            self.lengths = Some(
                lengths
                    .iter()
                    .zip(&self.offsets)
                    .map(|(l, o)| l + o)
                    .collect(),
            );
        }
        Ok(())
    }

    /// Rolls each row right by how far it ran past its real length, turning the chunk's
    /// right padding into left padding (mlx-lm's roll in `finalize` / `_update_concat`).
    fn roll_padding(&mut self, roller: &mut Roller) -> Result<()> {
        let Some(lengths) = &self.lengths else {
            return Ok(());
        };
        self.offset_array = None;
        let roll: Vec<i32> = self
            .offsets
            .iter()
            .zip(lengths)
            .map(|(o, l)| (o - l).max(0))
            .collect();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(roller.roll(k, &roll)?);
            self.values = Some(roller.roll(v, &roll)?);
        }
        for ((l, o), r) in self
            .left_padding
            .iter_mut()
            .zip(&mut self.offsets)
            .zip(&roll)
        {
            *l += r;
            *o -= r;
        }
        Ok(())
    }

    /// mlx-lm's `finalize`: after a right-padded prefill, the padding is rolled to the
    /// front of each row.
    #[track_caller]
    pub fn finalize(&mut self) -> Result<()> {
        self.finalize_with(&mut Roller::default())
    }

    /// [`BatchRotatingKVCache::finalize`] rolling through `roller` (shared by a
    /// finalize's layers).
    #[track_caller]
    pub(crate) fn finalize_with(&mut self, roller: &mut Roller) -> Result<()> {
        if self.lengths.is_some() {
            self.roll_padding(roller)?;
            self.lengths = None;
        }
        Ok(())
    }

    /// Rows in the batch.
    pub fn batch_size(&self) -> usize {
        self.offsets.len()
    }

    /// The window size.
    pub fn max_size(&self) -> i32 {
        self.max_size
    }

    /// Padding positions before each row's first real one (negative once the window
    /// has slid past the padding).
    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// Real positions of each row (its RoPE offset).
    pub fn offsets(&self) -> &[i32] {
        &self.offsets
    }

    /// The write position in the buffer (mlx-lm's `_idx`).
    pub fn idx(&self) -> i32 {
        self.idx
    }

    /// Whether the buffer has wrapped around.
    pub fn rotated(&self) -> bool {
        self.rotated
    }

    /// The raw key buffer, if any.
    pub fn keys(&self) -> Option<&Array> {
        self.keys.as_ref()
    }

    /// The raw value buffer, if any.
    pub fn values(&self) -> Option<&Array> {
        self.values.as_ref()
    }

    /// mlx-lm's `_trim`: drops the first `trim_size` positions, then appends.
    fn trim_buf(trim_size: i32, v: &Array, append: Option<&Array>) -> Result<Array> {
        let v = if trim_size > 0 {
            seq(v, Some(trim_size), None)?
        } else {
            v.clone()
        };
        match append {
            Some(a) => cat2(&[&v, a]),
            None => Ok(v),
        }
    }

    /// mlx-lm's `_temporal_order`: unrolls a wrapped buffer (oldest column first).
    fn temporal_order(&mut self) -> Result<()> {
        if self.rotated {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let (k, v) = (k.roll(-self.idx, Some(2))?, v.roll(-self.idx, Some(2))?);
                self.idx = k.dim(2)?;
                self.keys = Some(k);
                self.values = Some(v);
            }
            self.rotated = false;
        }
        Ok(())
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let s = keys.dim(2)?;
        match (self.keys.clone(), self.values.clone()) {
            (Some(_), Some(_)) => {
                self.temporal_order()?;
                let (mut k, mut v) = match (&self.keys, &self.values) {
                    (Some(k), Some(v)) => (k.clone(), v.clone()),
                    _ => return Err(bad("BatchRotatingKVCache: lost its buffers".into())),
                };
                if k.dim(2)? > self.idx {
                    k = seq(&k, None, Some(self.idx))?;
                    v = seq(&v, None, Some(self.idx))?;
                }
                if self.lengths.is_some() {
                    self.keys = Some(k);
                    self.values = Some(v);
                    self.roll_padding(&mut Roller::default())?;
                    (k, v) = match (&self.keys, &self.values) {
                        (Some(k), Some(v)) => (k.clone(), v.clone()),
                        _ => return Err(bad("BatchRotatingKVCache: lost its buffers".into())),
                    };
                }
                let trim_size = self.idx - self.max_size + 1;
                if trim_size > 0 {
                    for l in &mut self.left_padding {
                        *l -= trim_size;
                    }
                }
                self.keys = Some(Self::trim_buf(trim_size, &k, Some(keys))?);
                self.values = Some(Self::trim_buf(trim_size, &v, Some(values))?);
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        advance_offsets(&mut self.offsets, &mut self.offset_array, s)?;
        self.written += s;
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => return Err(bad("BatchRotatingKVCache: lost its buffers".into())),
        };
        self.idx = k.dim(2)?;
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if self.lengths.is_some() {
            return Err(bad(
                "finalize() should be called before decoding with BatchRotatingKVCache".into(),
            ));
        }
        let [b, h, s, kd] = dims4(keys, "keys")?;
        let [_, _, _, vd] = dims4(values, "values")?;
        let prev = self.written;
        let grow = match &self.keys {
            None => true,
            Some(k) => {
                let len = k.dim(2)?;
                prev >= len && len < self.max_size
            }
        };
        let (mut kbuf, mut vbuf) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) if !grow => (k.clone(), v.clone()),
            (old_k, old_v) => {
                let new_size = STEP.min(self.max_size - prev);
                let new_k = zeros(&[b, h, new_size, kd], keys.dtype())?;
                let new_v = zeros(&[b, h, new_size, vd], values.dtype())?;
                self.idx = prev;
                match (old_k, old_v) {
                    (Some(k), Some(v)) => (cat2(&[k, &new_k])?, cat2(&[v, &new_v])?),
                    _ => (new_k, new_v),
                }
            }
        };
        let trim_size = kbuf.dim(2)? - self.max_size;
        if trim_size > 0 {
            kbuf = Self::trim_buf(trim_size, &kbuf, None)?;
            vbuf = Self::trim_buf(trim_size, &vbuf, None)?;
            self.idx = self.max_size;
            for l in &mut self.left_padding {
                *l -= trim_size;
            }
        }
        if self.idx == self.max_size {
            self.rotated = true;
            self.idx = 0;
        }
        if self.rotated {
            for l in &mut self.left_padding {
                *l -= s;
            }
        }
        kbuf = seq_update(&kbuf, keys, self.idx, self.idx + s)?;
        vbuf = seq_update(&vbuf, values, self.idx, self.idx + s)?;
        self.written += s;
        advance_offsets(&mut self.offsets, &mut self.offset_array, s)?;
        self.idx += s;
        self.keys = Some(kbuf);
        self.values = Some(vbuf);
        self.keys_and_values()
    }

    /// Appends `keys`/`values` (in place for one token, by concatenation otherwise) and
    /// returns what attention should see, as mlx-lm's `update_and_fetch`.
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if dims4(keys, "keys")?[2] == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    /// The first `written` positions while the buffer is larger, else the whole buffer.
    #[track_caller]
    pub fn keys_and_values(&self) -> Result<(Array, Array)> {
        first_positions(
            &self.keys,
            &self.values,
            self.written,
            "BatchRotatingKVCache",
        )
    }

    /// mlx-lm's `make_mask`: causal, windowed, padding hidden, rolled like the buffer
    /// for single-token steps after a wrap. Always a boolean `[B, 1, N, T]` array.
    #[track_caller]
    pub fn mask(&self, n: i32, window_size: Option<i32>) -> Result<Array> {
        let window = window_size.unwrap_or(self.max_size);
        let offset = (self.max_size - 1).min(self.written);
        let rinds = arange(0.0, (offset + n) as f64, 1.0, Dtype::Int32)?;
        let linds = if offset != 0 {
            arange(offset as f64, (offset + n) as f64, 1.0, Dtype::Int32)?
        } else {
            rinds.clone()
        };
        let linds = linds.expand_dims(&[1])?;
        let rinds = rinds.expand_dims(&[0])?;
        let mut mask = linds.greater_equal(&rinds)?;
        mask = mask.logical_and(&linds.less(&rinds.add(window)?)?)?;
        let mut left: Vec<i32> = self.left_padding.clone();
        let trim_size = self.idx - self.max_size + i32::from(n > 1);
        if trim_size > 0 {
            left.iter_mut().for_each(|l| *l -= trim_size);
        }
        let rotated = n == 1 && (self.rotated || self.idx >= self.max_size);
        if rotated {
            left.iter_mut().for_each(|l| *l -= 1);
        }
        let lp = int_array(&left)?.expand_dims(&[1, 2, 3])?;
        mask = mask.logical_and(&rinds.greater_equal(&lp)?)?;
        if rotated {
            let idx = if self.idx >= self.max_size {
                0
            } else {
                self.idx
            };
            mask = mask.roll(idx + 1, Some(-1))?;
        }
        Ok(mask)
    }

    /// Keeps only the rows `batch_indices`, in that order (mlx-lm's `filter`).
    #[track_caller]
    pub fn filter(&mut self, batch_indices: &[usize]) -> Result<()> {
        self.rows().filter(batch_indices)
    }

    /// Appends the rows of `other` (mlx-lm's `extend`); both are put in temporal order
    /// first when their write positions differ. `other` is rearranged too.
    #[track_caller]
    pub fn extend(&mut self, other: &mut BatchRotatingKVCache) -> Result<()> {
        if self.keys.is_none() && other.keys.is_none() {
            self.left_padding.extend_from_slice(&other.left_padding);
            self.offsets.extend_from_slice(&other.offsets);
            self.offset_array = None;
            return Ok(());
        }
        if self.rotated != other.rotated || self.idx != other.idx {
            self.temporal_order()?;
            other.temporal_order()?;
        }
        let max_idx = self.idx.max(other.idx);
        let template = match (&self.keys, &self.values, &other.keys, &other.values) {
            (_, _, Some(k), Some(v)) | (Some(k), Some(v), _, _) => (k.clone(), v.clone()),
            _ => {
                return Err(bad(
                    "BatchRotatingKVCache::extend: keys without values".into()
                ))
            }
        };
        let kv = (&template.0, &template.1);
        let to = ExtendTo::new(self.keys.as_ref(), other.keys.as_ref(), kv, max_idx)?;
        let pad = |c: &BatchRotatingKVCache| {
            let kv = (c.keys.as_ref(), c.values.as_ref());
            to.pad(kv, c.offsets.len(), c.idx, &c.left_padding)
        };
        let (k1, v1, lp1) = pad(self)?;
        let (k2, v2, lp2) = pad(other)?;
        self.keys = Some(mlx_array::concatenate(&[&k1, &k2], 0)?);
        self.values = Some(mlx_array::concatenate(&[&v1, &v2], 0)?);
        self.offsets.extend_from_slice(&other.offsets);
        self.offset_array = None;
        self.left_padding = lp1.into_iter().chain(lp2).collect();
        self.idx = max_idx;
        self.written = self.written.max(other.written);
        Ok(())
    }

    /// Row `i` as a single-sequence [`RotatingKVCache`] (`keep = 0`) in temporal order
    /// (mlx-lm's `extract`).
    #[track_caller]
    pub fn extract(&self, i: usize) -> Result<RotatingKVCache> {
        let (Some(&padding), Some(&offset)) = (self.left_padding.get(i), self.offsets.get(i))
        else {
            return Err(bad(format!(
                "BatchRotatingKVCache::extract: row {i} of {}",
                self.offsets.len()
            )));
        };
        let padding = padding.max(0);
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(RotatingKVCache::new(self.max_size, 0));
        };
        let (mut k, mut v) = (row(k, i as i32)?, row(v, i as i32)?);
        let mut idx = self.idx;
        if self.rotated {
            k = k.roll(-self.idx, Some(2))?;
            v = v.roll(-self.idx, Some(2))?;
            idx = self.max_size;
        }
        let k = seq(&k, Some(padding), Some(idx))?.contiguous()?;
        let v = seq(&v, Some(padding), Some(idx))?.contiguous()?;
        let idx = k.dim(2)?;
        Ok(RotatingKVCache::from_parts(
            Some(k),
            Some(v),
            offset,
            0,
            self.max_size,
            idx,
        ))
    }

    /// One batch from single-sequence rotating caches of the same window (mlx-lm's
    /// `BatchRotatingKVCache.merge`). Caches that keep leading positions (`keep > 0`)
    /// cannot be batched (mlx-lm would silently drop that property).
    #[track_caller]
    pub fn merge(caches: &[&RotatingKVCache]) -> Result<BatchRotatingKVCache, CacheError> {
        let Some(first) = caches.first() else {
            return Err(CacheError::InvalidArgument(
                "BatchRotatingKVCache::merge needs at least one cache".into(),
            ));
        };
        let max_size = first.max_size;
        if caches.iter().any(|c| c.max_size != max_size) {
            return Err(CacheError::InvalidArgument(
                "BatchRotatingKVCache can only merge caches with the same maximum size".into(),
            ));
        }
        if caches.iter().any(|c| c.keep != 0) {
            return Err(CacheError::Unsupported {
                class: "RotatingKVCache",
                op: "batching with keep > 0",
            });
        }
        let offsets: Vec<i32> = caches.iter().map(|c| c.offset).collect();
        let lengths: Vec<i32> = caches.iter().map(|c| c.size()).collect();
        let max_length = lengths.iter().copied().max().unwrap_or(0);
        if max_length == 0 {
            return Ok(BatchRotatingKVCache::new(max_size, &vec![0; caches.len()]));
        }
        let padding: Vec<i32> = lengths.iter().map(|l| max_length - l).collect();
        let kv = caches.iter().map(|c| (c.keys.as_ref(), c.values.as_ref()));
        let mut buf = MergeBuffers::new(kv, max_length)?;
        for (i, ((p, l), c)) in padding.iter().zip(&lengths).zip(caches).enumerate() {
            let (Some(ck), Some(cv)) = (&c.keys, &c.values) else {
                continue;
            };
            let ck = seq(&c.temporal_order(ck)?, Some(-l), None)?;
            let cv = seq(&c.temporal_order(cv)?, Some(-l), None)?;
            buf.put(i as i32, *p, p + l, &ck, &cv)?;
        }
        let mut cache = BatchRotatingKVCache::new(max_size, &padding);
        cache.keys = Some(buf.keys);
        cache.values = Some(buf.values);
        cache.offsets = offsets;
        cache.idx = max_length;
        cache.written = max_length;
        Ok(cache)
    }
}

impl KvCache for BatchRotatingKVCache {
    /// Positions written to the buffer, padding included (mlx-lm's `_offset`); the
    /// per-row offsets are [`KvCache::rope_offset`].
    fn offset(&self) -> i32 {
        self.written
    }

    batch_kv_methods!();

    fn make_mask(&self, n: i32, _return_array: bool, window_size: Option<i32>) -> Result<AttnMask> {
        Ok(AttnMask::Array(self.mask(n, window_size)?))
    }

    fn is_trimmable(&self) -> bool {
        self.written < self.max_size
    }

    fn trim(&mut self, n: i32) -> i32 {
        let n = self.written.min(n);
        self.written -= n;
        self.idx -= n;
        for o in &mut self.offsets {
            *o -= n;
        }
        self.offset_array = None;
        n
    }

    fn size(&self) -> i32 {
        self.written.min(self.max_size)
    }

    kv_pair_methods!("BatchRotatingKVCache");
}

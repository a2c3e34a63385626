//! mlx-lm's `RotatingKVCache(max_size, keep)`: a sliding window that keeps the first
//! `keep` positions forever.
use crate::error::CacheError;
use crate::kv::STEP;
use crate::util::{cat2, dims4, first_positions, kv_pair_methods, seq, seq_update};
use mlx_array::{ops::arange, ops::zeros, Array, Dtype, Result};
use mlx_nn::cache::{create_causal_mask, AttnMask, KvCache, KvFetch};

/// mlx-lm's `RotatingKVCache`.
///
/// Multi-token updates put the buffer in temporal order and concatenate (the buffer may
/// then hold up to `max_size + S - 1` positions); single-token updates write in place,
/// wrapping around after `max_size` and never overwriting the first `keep` positions.
#[derive(Debug, Clone)]
pub struct RotatingKVCache {
    pub(crate) keep: i32,
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) offset: i32,
    pub(crate) max_size: i32,
    pub(crate) idx: i32,
    step: i32,
}

impl RotatingKVCache {
    /// An empty cache holding at most `max_size` positions, the first `keep` of which are
    /// never evicted.
    pub fn new(max_size: i32, keep: i32) -> RotatingKVCache {
        RotatingKVCache {
            keep,
            keys: None,
            values: None,
            offset: 0,
            max_size,
            idx: 0,
            step: STEP,
        }
    }

    /// Rebuilds a cache from its saved state (mlx-lm's `from_state`).
    pub fn from_parts(
        keys: Option<Array>,
        values: Option<Array>,
        offset: i32,
        keep: i32,
        max_size: i32,
        idx: i32,
    ) -> RotatingKVCache {
        RotatingKVCache {
            keep,
            keys,
            values,
            offset,
            max_size,
            idx,
            step: STEP,
        }
    }

    /// The window size.
    pub fn max_size(&self) -> i32 {
        self.max_size
    }

    /// Leading positions never evicted.
    pub fn keep(&self) -> i32 {
        self.keep
    }

    /// The write position in the buffer (mlx-lm's `_idx`).
    pub fn idx(&self) -> i32 {
        self.idx
    }

    /// The raw key buffer (not in temporal order once it has wrapped).
    pub fn keys(&self) -> Option<&Array> {
        self.keys.as_ref()
    }

    /// The raw value buffer (not in temporal order once it has wrapped).
    pub fn values(&self) -> Option<&Array> {
        self.values.as_ref()
    }

    /// mlx-lm's `_trim`: drops `trim_size` positions after the first `keep`, then appends.
    fn trim_buf(&self, trim_size: i32, v: &Array, append: Option<&Array>) -> Result<Array> {
        let mut parts: Vec<Array> = if trim_size > 0 {
            vec![
                seq(v, None, Some(self.keep))?,
                seq(v, Some(trim_size + self.keep), None)?,
            ]
        } else {
            vec![v.clone()]
        };
        if let Some(a) = append {
            parts.push(a.clone());
        }
        let refs: Vec<&Array> = parts.iter().collect();
        cat2(&refs)
    }

    /// mlx-lm's `_temporal_order`: the buffer rearranged oldest-first, unused end cut off.
    #[track_caller]
    pub fn temporal_order(&self, v: &Array) -> Result<Array> {
        let len = v.dim(2)?;
        if self.idx == len {
            Ok(v.clone())
        } else if self.idx < self.offset {
            cat2(&[
                &seq(v, None, Some(self.keep))?,
                &seq(v, Some(self.idx), None)?,
                &seq(v, Some(self.keep), Some(self.idx))?,
            ])
        } else {
            seq(v, None, Some(self.idx))
        }
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k0), Some(v0)) => {
                let k0 = self.temporal_order(k0)?;
                let v0 = self.temporal_order(v0)?;
                self.idx = k0.dim(2)?;
                let trim_size = self.idx - self.max_size + 1;
                (
                    self.trim_buf(trim_size, &k0, Some(keys))?,
                    self.trim_buf(trim_size, &v0, Some(values))?,
                )
            }
            _ => (keys.clone(), values.clone()),
        };
        self.offset += keys.dim(2)?;
        self.idx = k.dim(2)?;
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let [b, h, s, kd] = dims4(keys, "keys")?;
        let [_, _, _, vd] = dims4(values, "values")?;
        let prev = self.offset;
        let grow = match &self.keys {
            None => true,
            Some(k) => {
                let len = k.dim(2)?;
                prev >= len && len < self.max_size
            }
        };
        // Work on copies so that a failure leaves the cache as it was.
        let mut idx = self.idx;
        let (mut kbuf, mut vbuf) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) if !grow => (k.clone(), v.clone()),
            (old_k, old_v) => {
                let new_size = self.step.min(self.max_size - prev);
                let new_k = zeros(&[b, h, new_size, kd], keys.dtype())?;
                let new_v = zeros(&[b, h, new_size, vd], values.dtype())?;
                idx = prev;
                match (old_k, old_v) {
                    (Some(k), Some(v)) => (cat2(&[k, &new_k])?, cat2(&[v, &new_v])?),
                    _ => (new_k, new_v),
                }
            }
        };
        let trim_size = kbuf.dim(2)? - self.max_size;
        if trim_size > 0 {
            kbuf = self.trim_buf(trim_size, &kbuf, None)?;
            vbuf = self.trim_buf(trim_size, &vbuf, None)?;
            idx = self.max_size;
        }
        if idx == self.max_size {
            idx = self.keep;
        }
        kbuf = seq_update(&kbuf, keys, idx, idx + s)?;
        vbuf = seq_update(&vbuf, values, idx, idx + s)?;
        self.offset += s;
        self.idx = idx + s;
        self.keys = Some(kbuf);
        self.values = Some(vbuf);
        self.keys_and_values()
    }

    /// Appends `keys`/`values` (in place for one token, by concatenation otherwise) and
    /// returns what attention should see, exactly like mlx-lm's `update_and_fetch`.
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if dims4(keys, "keys")?[2] == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    /// mlx-lm's `keys_and_values`: the first `offset` positions while the buffer is
    /// larger than what was written, else the whole buffer.
    #[track_caller]
    pub fn keys_and_values(&self) -> Result<(Array, Array)> {
        first_positions(&self.keys, &self.values, self.offset, "RotatingKVCache")
    }

    /// mlx-lm raises `NotImplementedError` ("RotatingKVCache Quantization NYI").
    pub fn to_quantized(&self, _group_size: i32, _bits: i32) -> Result<(), CacheError> {
        Err(CacheError::Unsupported {
            class: "RotatingKVCache",
            op: "quantization",
        })
    }
}

impl KvCache for RotatingKVCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch> {
        let (keys, values) = self.update(keys, values)?;
        Ok(KvFetch::Plain { keys, values })
    }

    /// mlx-lm's `RotatingKVCache.make_mask(N, window_size, return_array)`.
    fn make_mask(&self, n: i32, return_array: bool, window_size: Option<i32>) -> Result<AttnMask> {
        if n > 1 {
            // Python's `window_size or self.max_size`: 0 counts as absent.
            let window = window_size.filter(|&w| w != 0).unwrap_or(self.max_size);
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window || return_array {
                return Ok(AttnMask::Array(create_causal_mask(
                    n,
                    offset,
                    Some(window),
                )?));
            }
            return Ok(AttnMask::Causal);
        }
        let Some(window) = window_size else {
            return Ok(AttnMask::None);
        };
        if self.offset >= window && self.max_size > window {
            let idx = if self.idx >= self.max_size {
                0
            } else {
                self.idx
            };
            let mask_size = if self.offset < self.max_size {
                self.offset + 1
            } else {
                self.max_size
            };
            let mask = arange(0.0, mask_size as f64, 1.0, Dtype::Int32)?
                .greater_equal(mask_size - window)?
                .roll(idx + 1, None)?;
            return Ok(AttnMask::Array(mask));
        }
        Ok(AttnMask::None)
    }

    fn is_trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    fn trim(&mut self, n: i32) -> i32 {
        let n = self.offset.min(n);
        self.offset -= n;
        self.idx -= n;
        n
    }

    fn size(&self) -> i32 {
        self.offset.min(self.max_size)
    }

    fn meta_state(&self) -> Vec<String> {
        [self.offset, self.keep, self.max_size, self.idx]
            .iter()
            .map(i32::to_string)
            .collect()
    }

    kv_pair_methods!("RotatingKVCache");
}

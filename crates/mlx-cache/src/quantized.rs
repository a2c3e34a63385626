//! mlx-lm's `QuantizedKVCache`: keys and values stored affine-quantized.
use crate::kv::{quantize3, STEP};
use crate::util::{cat2, dims4, seq, seq_update};
use mlx_array::{ops::zeros, Array, Dtype, Result};
use mlx_nn::cache::{standard_cache_mask, AttnMask, KvCache, KvFetch};
use std::any::Any;

/// A `(packed, scales, biases)` triple as `mx.quantize` returns it.
pub type QuantTriple = [Array; 3];

/// mlx-lm's `QuantizedKVCache(group_size, bits)`: like [`crate::KVCache`] but every
/// buffer is a quantized triple; fetches return [`KvFetch::Quantized`].
#[derive(Debug, Clone)]
pub struct QuantizedKVCache {
    pub(crate) keys: Option<QuantTriple>,
    pub(crate) values: Option<QuantTriple>,
    pub(crate) offset: i32,
    group_size: i32,
    bits: i32,
    step: i32,
}

impl Default for QuantizedKVCache {
    /// mlx-lm's defaults: `group_size=64, bits=8`.
    fn default() -> Self {
        QuantizedKVCache::new(64, 8)
    }
}

impl QuantizedKVCache {
    /// An empty cache quantizing with `group_size` and `bits`.
    pub fn new(group_size: i32, bits: i32) -> QuantizedKVCache {
        QuantizedKVCache {
            keys: None,
            values: None,
            offset: 0,
            group_size,
            bits,
            step: STEP,
        }
    }

    /// Rebuilds a cache from its saved state (mlx-lm's `from_state`).
    pub fn from_parts(
        keys: Option<QuantTriple>,
        values: Option<QuantTriple>,
        offset: i32,
        group_size: i32,
        bits: i32,
    ) -> QuantizedKVCache {
        QuantizedKVCache {
            keys,
            values,
            offset,
            group_size,
            bits,
            step: STEP,
        }
    }

    /// Quantization group size.
    pub fn group_size(&self) -> i32 {
        self.group_size
    }

    /// Bits per element.
    pub fn bits(&self) -> i32 {
        self.bits
    }

    /// The whole key buffers (including unused capacity), if any.
    pub fn keys(&self) -> Option<&QuantTriple> {
        self.keys.as_ref()
    }

    /// The whole value buffers (including unused capacity), if any.
    pub fn values(&self) -> Option<&QuantTriple> {
        self.values.as_ref()
    }

    /// Quantizes and appends `keys`/`values`, returning the first `offset` positions of
    /// every buffer (mlx-lm's `update_and_fetch`).
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(QuantTriple, QuantTriple)> {
        let [b, h, s, kd] = dims4(keys, "keys")?;
        let [_, _, _, vd] = dims4(values, "values")?;
        if self.bits <= 0 || self.group_size <= 0 {
            return Err(mlx_array::Error::InvalidArgument(format!(
                "QuantizedKVCache: bits ({}) and group_size ({}) must be positive",
                self.bits, self.group_size
            )));
        }
        let prev = self.offset;
        let step = self.step;
        // Work on copies so that a failure leaves the cache as it was.
        let (mut kb, mut vb) = match (&self.keys, &self.values) {
            (Some(k), Some(v)) if prev + s <= k[0].dim(-2)? => (k.clone(), v.clone()),
            (old_k, old_v) => {
                let new_steps = (step + s - 1) / step * step;
                match (old_k, old_v) {
                    (Some(k), Some(v)) => {
                        let grow = |t: &QuantTriple| -> Result<QuantTriple> {
                            map3(t, |x| {
                                let x = if prev % step != 0 {
                                    seq(x, None, Some(prev))?
                                } else {
                                    x.clone()
                                };
                                let z = zeros(&[b, h, new_steps, x.dim(-1)?], x.dtype())?;
                                cat2(&[&x, &z])
                            })
                        };
                        (grow(k)?, grow(v)?)
                    }
                    _ => {
                        let el_per_int = 8 * Dtype::Uint32.size() as i32 / self.bits;
                        let init = |dim: i32| -> Result<QuantTriple> {
                            let g = dim / self.group_size;
                            Ok([
                                zeros(&[b, h, new_steps, dim / el_per_int], Dtype::Uint32)?,
                                zeros(&[b, h, new_steps, g], keys.dtype())?,
                                zeros(&[b, h, new_steps, g], keys.dtype())?,
                            ])
                        };
                        (init(kd)?, init(vd)?)
                    }
                }
            }
        };
        let end = prev + s;
        let qk = quantize3(keys, self.group_size, self.bits)?;
        let qv = quantize3(values, self.group_size, self.bits)?;
        for i in 0..3 {
            kb[i] = seq_update(&kb[i], &qk[i], prev, end)?;
            vb[i] = seq_update(&vb[i], &qv[i], prev, end)?;
        }
        self.offset = end;
        self.keys = Some(kb);
        self.values = Some(vb);
        self.keys_and_values()
    }

    /// The first `offset` positions of every buffer (mlx-lm's `keys_and_values`).
    #[track_caller]
    pub fn keys_and_values(&self) -> Result<(QuantTriple, QuantTriple)> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Err(mlx_array::Error::InvalidArgument(
                "QuantizedKVCache: keys_and_values called on an empty cache".into(),
            ));
        };
        if self.offset == k[0].dim(2)? {
            Ok((k.clone(), v.clone()))
        } else {
            let off = self.offset;
            Ok((
                map3(k, |x| seq(x, None, Some(off)))?,
                map3(v, |x| seq(x, None, Some(off)))?,
            ))
        }
    }
}

fn map3(t: &QuantTriple, f: impl Fn(&Array) -> Result<Array>) -> Result<QuantTriple> {
    Ok([f(&t[0])?, f(&t[1])?, f(&t[2])?])
}

impl KvCache for QuantizedKVCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch> {
        let ([k0, k1, k2], [v0, v1, v2]) = self.update(keys, values)?;
        Ok(KvFetch::Quantized {
            keys: (k0, k1, k2),
            values: (v0, v1, v2),
            group_size: self.group_size,
            bits: self.bits,
        })
    }

    fn make_mask(&self, n: i32, return_array: bool, window_size: Option<i32>) -> Result<AttnMask> {
        standard_cache_mask(n, self.offset, return_array, window_size)
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: i32) -> i32 {
        let n = self.offset.min(n);
        self.offset -= n;
        n
    }

    /// mlx-lm's `QuantizedKVCache` has no `size()`, so the base class's 0 applies.
    fn size(&self) -> i32 {
        0
    }

    fn nbytes(&self) -> usize {
        self.keys
            .iter()
            .chain(self.values.iter())
            .flatten()
            .map(Array::nbytes)
            .sum()
    }

    fn is_empty(&self) -> bool {
        self.keys.is_none()
    }

    fn state(&self) -> Vec<Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .flatten()
            .cloned()
            .collect()
    }

    fn meta_state(&self) -> Vec<String> {
        vec![
            self.offset.to_string(),
            self.group_size.to_string(),
            self.bits.to_string(),
        ]
    }

    fn class_name(&self) -> &'static str {
        "QuantizedKVCache"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

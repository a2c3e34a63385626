//! mlx-lm's `KVCache` (a buffer grown in steps of 256) and `ConcatenateKVCache`.
use crate::quantized::QuantizedKVCache;
use crate::util::{cat2, dims4, first_positions, grown_buffers, kv_pair_methods, seq_update};
use mlx_array::{quant, Array, Result};
use mlx_nn::cache::{standard_cache_mask, AttnMask, KvCache, KvFetch};

/// The growth step of mlx-lm's caches.
pub const STEP: i32 = 256;

/// mlx-lm's `KVCache`: keys and values live in a buffer that grows by [`STEP`]
/// positions; new entries are written with `slice_update` and the first `offset`
/// positions are handed back.
#[derive(Debug, Clone)]
pub struct KVCache {
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) offset: i32,
    step: i32,
}

impl Default for KVCache {
    fn default() -> Self {
        KVCache::new()
    }
}

impl KVCache {
    /// An empty cache.
    pub fn new() -> KVCache {
        KVCache {
            keys: None,
            values: None,
            offset: 0,
            step: STEP,
        }
    }

    /// An empty cache growing by `step` positions (mlx-lm's `cache.step = n`).
    pub fn with_step(step: i32) -> KVCache {
        KVCache {
            step: step.max(1),
            ..KVCache::new()
        }
    }

    /// Rebuilds a cache from its saved state (mlx-lm's `from_state`).
    pub fn from_parts(keys: Option<Array>, values: Option<Array>, offset: i32) -> KVCache {
        KVCache {
            keys,
            values,
            offset,
            step: STEP,
        }
    }

    /// The whole key buffer (including unused capacity), if any.
    pub fn keys(&self) -> Option<&Array> {
        self.keys.as_ref()
    }

    /// The whole value buffer (including unused capacity), if any.
    pub fn values(&self) -> Option<&Array> {
        self.values.as_ref()
    }

    /// Appends `keys`/`values` and returns the first `offset` positions, exactly like
    /// mlx-lm's `update_and_fetch`.
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let s = dims4(keys, "keys")?[2];
        let prev = self.offset;
        let old = (&self.keys, &self.values);
        let (mut kbuf, mut vbuf) = grown_buffers(old, keys, values, prev, self.step)?;
        let end = prev + s;
        kbuf = seq_update(&kbuf, keys, prev, end)?;
        vbuf = seq_update(&vbuf, values, prev, end)?;
        self.offset = end;
        self.keys = Some(kbuf);
        self.values = Some(vbuf);
        self.keys_and_values()
    }

    /// The first `offset` positions of the buffers (mlx-lm's `keys_and_values`).
    #[track_caller]
    pub fn keys_and_values(&self) -> Result<(Array, Array)> {
        first_positions(&self.keys, &self.values, self.offset, "KVCache")
    }

    /// A quantized copy (mlx-lm's `KVCache.to_quantized`): the whole buffers are
    /// quantized with `mx.quantize(..., group_size, bits)` and the offset is kept.
    #[track_caller]
    pub fn to_quantized(&self, group_size: i32, bits: i32) -> Result<QuantizedKVCache> {
        let mut q = QuantizedKVCache::new(group_size, bits);
        q.offset = self.offset;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            q.keys = Some(quantize3(k, group_size, bits)?);
            q.values = Some(quantize3(v, group_size, bits)?);
        }
        Ok(q)
    }
}

/// `mx.quantize(x, group_size, bits)` as the `(packed, scales, biases)` triple.
#[track_caller]
pub(crate) fn quantize3(x: &Array, group_size: i32, bits: i32) -> Result<[Array; 3]> {
    let q = quant::quantize(x, Some(group_size), Some(bits), quant::QuantMode::Affine)?;
    let Some(biases) = q.biases else {
        return Err(mlx_array::Error::InvalidArgument(
            "affine quantization returned no biases".into(),
        ));
    };
    Ok([q.weight, q.scales, biases])
}

impl KvCache for KVCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch> {
        let (keys, values) = self.update(keys, values)?;
        Ok(KvFetch::Plain { keys, values })
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

    fn size(&self) -> i32 {
        self.offset
    }

    fn meta_state(&self) -> Vec<String> {
        vec![self.offset.to_string()]
    }

    kv_pair_methods!("KVCache");
}

/// mlx-lm's `ConcatenateKVCache`: every update is concatenated onto the previous keys
/// and values (no preallocation).
#[derive(Debug, Clone, Default)]
pub struct ConcatenateKVCache {
    pub(crate) keys: Option<Array>,
    pub(crate) values: Option<Array>,
    pub(crate) offset: i32,
}

impl ConcatenateKVCache {
    /// An empty cache.
    pub fn new() -> ConcatenateKVCache {
        ConcatenateKVCache::default()
    }

    /// Rebuilds a cache from its saved state; the offset is the keys' length, as in
    /// mlx-lm's state setter.
    #[track_caller]
    pub fn from_parts(keys: Option<Array>, values: Option<Array>) -> Result<ConcatenateKVCache> {
        let offset = match &keys {
            Some(k) => k.dim(-2)?,
            None => 0,
        };
        Ok(ConcatenateKVCache {
            keys,
            values,
            offset,
        })
    }

    /// The stored keys, if any.
    pub fn keys(&self) -> Option<&Array> {
        self.keys.as_ref()
    }

    /// The stored values, if any.
    pub fn values(&self) -> Option<&Array> {
        self.values.as_ref()
    }

    /// Concatenates `keys`/`values` along the sequence axis and returns everything.
    #[track_caller]
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = match (&self.keys, &self.values) {
            (Some(k0), Some(v0)) => (cat2(&[k0, keys])?, cat2(&[v0, values])?),
            _ => (keys.clone(), values.clone()),
        };
        self.offset = k.dim(-2)?;
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }
}

impl KvCache for ConcatenateKVCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch> {
        let (keys, values) = self.update(keys, values)?;
        Ok(KvFetch::Plain { keys, values })
    }

    fn make_mask(&self, n: i32, return_array: bool, window_size: Option<i32>) -> Result<AttnMask> {
        standard_cache_mask(n, self.offset, return_array, window_size)
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    /// Like mlx-lm, only the offset moves: the stored arrays keep their length.
    fn trim(&mut self, n: i32) -> i32 {
        let n = self.offset.min(n);
        self.offset -= n;
        n
    }

    /// mlx-lm's `ConcatenateKVCache` has no `size()`, so the base class's 0 applies.
    fn size(&self) -> i32 {
        0
    }

    kv_pair_methods!("ConcatenateKVCache");
}

//! The KV-cache interface models call during their forward pass.
//!
//! Models never store a cache: the caller passes one per layer into `forward`, exactly
//! like mlx-lm (`cache.update_and_fetch(keys, values)`, `cache.offset`,
//! `cache.make_mask(...)`). Implementations (KVCache, RotatingKVCache, QuantizedKVCache,
//! ...) live in the `mlx-cache` crate, one layer up; this module only fixes the contract.
use mlx_array::{Array, Result};

/// An attention mask as mlx-lm passes it to `scaled_dot_product_attention`.
#[derive(Debug, Clone)]
pub enum AttnMask {
    /// No mask (single-token decode).
    None,
    /// The "causal" string mask, handled inside the fused kernel.
    Causal,
    /// An explicit boolean or additive mask.
    Array(Array),
    /// Rows left-padded by `left_padding` (`[B]`, int32): `mask` is mlx-lm's boolean
    /// `[B, 1, N, L]` mask (query `i` sees keys `left_padding[b] ..= L - N + i`; one query
    /// a row while decoding, a few in a verification), and the padding lets a kernel skip
    /// each row's padded keys instead (`mlx_array::fast::sdpa_padded`, on a GPU). Code that
    /// reads, reshapes or gathers the mask treats `mask` as an [`AttnMask::Array`]
    /// (`AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. }`) and hands on an
    /// `Array` of what it made.
    LeftPadded {
        /// The boolean mask.
        mask: Array,
        /// Each row's padded positions at the start of the keys.
        left_padding: Array,
    },
}

/// Keys and values handed back by a cache for attention.
#[derive(Debug, Clone)]
pub enum KvFetch {
    /// Plain keys and values, `[B, n_kv_heads, T, head_dim]`.
    Plain {
        /// Keys.
        keys: Array,
        /// Values.
        values: Array,
    },
    /// Affine-quantized keys and values as `(packed, scales, biases)` triples
    /// (mlx-lm's QuantizedKVCache).
    Quantized {
        /// Keys.
        keys: (Array, Array, Array),
        /// Values.
        values: (Array, Array, Array),
        /// Quantization group size.
        group_size: i32,
        /// Bits per element.
        bits: i32,
    },
}

/// Where the rotary embedding of the next positions starts: mlx-lm's `cache.offset`,
/// an `int` for single-sequence caches, an `mx.array` of one offset per row for batch
/// caches (`BatchKVCache`, `BatchRotatingKVCache`).
#[derive(Debug, Clone)]
pub enum RopePosition {
    /// One offset for the whole (batch-1) input.
    Scalar(i32),
    /// One offset per batch row (int32 `[B]`).
    PerRow(Array),
}

impl RopePosition {
    /// The offset in the form [`mlx_array::fast::rope`] takes.
    pub fn as_rope_offset(&self) -> mlx_array::fast::RopeOffset<'_> {
        match self {
            RopePosition::Scalar(o) => mlx_array::fast::RopeOffset::Int(*o),
            RopePosition::PerRow(a) => mlx_array::fast::RopeOffset::Array(a),
        }
    }
}

/// What a model asks of a per-layer KV cache.
pub trait KvCache: Send {
    /// Number of positions processed so far (the RoPE offset of the next token). Batch
    /// caches return the length of their (left-padded) buffer; their per-row offsets come
    /// from [`KvCache::rope_offset`].
    fn offset(&self) -> i32;

    /// What models pass to RoPE (mlx-lm's `cache.offset`): [`RopePosition::Scalar`] of
    /// [`KvCache::offset`] unless the cache holds several sequences.
    fn rope_offset(&self) -> Result<RopePosition> {
        Ok(RopePosition::Scalar(self.offset()))
    }

    /// Appends `keys`/`values` (`[B, n_kv_heads, S, head_dim]`) and returns everything
    /// attention should see.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvFetch>;

    /// The mask for `n` new positions, like mlx-lm's `cache.make_mask`.
    fn make_mask(&self, n: i32, return_array: bool, window_size: Option<i32>) -> Result<AttnMask>;

    /// mlx-lm's `ChunkedKVCache.maybe_trim_front()`: a cache that keeps only its last
    /// chunk drops the positions before it; every other cache keeps what it holds.
    fn maybe_trim_front(&mut self) -> Result<()> {
        Ok(())
    }

    /// mlx-lm's `ChunkedKVCache.start_position`: the absolute position of the first
    /// key held (0 for caches that never drop their front this way).
    fn start_position(&self) -> i32 {
        0
    }

    /// Whether [`KvCache::trim`] can remove positions from the end.
    fn is_trimmable(&self) -> bool {
        false
    }

    /// Removes up to `n` positions from the end; returns how many were removed.
    fn trim(&mut self, _n: i32) -> i32 {
        0
    }

    /// Positions actually held (`min(offset, max_size)` for rotating caches).
    fn size(&self) -> i32 {
        self.offset()
    }

    /// Bytes held by the cache's arrays.
    fn nbytes(&self) -> usize {
        0
    }

    /// Whether nothing has been stored yet.
    fn is_empty(&self) -> bool {
        self.offset() == 0
    }

    /// The cache's arrays, in mlx-lm's `state` order (for prompt-cache files).
    fn state(&self) -> Vec<Array>;

    /// mlx-lm's `meta_state` strings (for prompt-cache files).
    fn meta_state(&self) -> Vec<String> {
        Vec::new()
    }

    /// mlx-lm's class name of this cache (`KVCache`, `RotatingKVCache`, ...).
    fn class_name(&self) -> &'static str;

    /// The slots of a recurrent-state cache (mlx-lm's `ArraysCache`: convolution and
    /// SSM / delta-net states), which linear-attention layers read and write instead of
    /// keys and values; `None` for key/value caches.
    fn arrays(&self) -> Option<&ArraysState> {
        None
    }

    /// The slots of a recurrent-state cache, mutably (see [`KvCache::arrays`]).
    fn arrays_mut(&mut self) -> Option<&mut ArraysState> {
        None
    }

    /// The sub-caches of a cache list (mlx-lm's `CacheList`, indexed as `cache[i]` by
    /// layers that keep several caches, e.g. attention plus an indexer, or a recurrent
    /// state plus keys and values); `None` for every other cache.
    fn sub_caches(&self) -> Option<&[Box<dyn KvCache>]> {
        None
    }

    /// The sub-caches of a cache list, mutably (see [`KvCache::sub_caches`]).
    fn sub_caches_mut(&mut self) -> Option<&mut [Box<dyn KvCache>]> {
        None
    }

    /// Lets callers reach the concrete type.
    fn as_any(&self) -> &dyn std::any::Any;

    /// Lets callers reach the concrete type mutably.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// What a recurrent-state cache holds (mlx-lm's `ArraysCache` fields): `size` array
/// slots (`cache[i]`, `None` until a layer writes it), and for batches the rows' left
/// padding and, while a batch is prefilled, their remaining lengths.
#[derive(Debug, Clone, Default)]
pub struct ArraysState {
    /// The state arrays (`cache[0]`, `cache[1]`, ...).
    pub cache: Vec<Option<Array>>,
    /// Per-row left padding (int32 `[B]`), for batches.
    pub left_padding: Option<Array>,
    /// Per-row tokens still to process (int32 `[B]`), while a batch is prefilled.
    pub lengths: Option<Array>,
}

impl ArraysState {
    /// `size` empty slots.
    pub fn new(size: usize) -> ArraysState {
        ArraysState {
            cache: vec![None; size],
            left_padding: None,
            lengths: None,
        }
    }

    /// `cache[i]` (`None` when unset or out of range).
    pub fn get(&self, i: usize) -> Option<&Array> {
        self.cache.get(i).and_then(Option::as_ref)
    }

    /// `cache[i] = value`; an index past the slots is an error.
    #[track_caller]
    pub fn set(&mut self, i: usize, value: Array) -> Result<()> {
        let n = self.cache.len();
        match self.cache.get_mut(i) {
            Some(slot) => {
                *slot = Some(value);
                Ok(())
            }
            None => Err(mlx_array::Error::InvalidArgument(format!(
                "state slot {i} of a cache with {n} slots"
            ))),
        }
    }

    /// mlx-lm's `advance(N)`: `lengths -= N`, `left_padding -= N`.
    #[track_caller]
    pub fn advance(&mut self, n: i32) -> Result<()> {
        if let Some(l) = &self.lengths {
            self.lengths = Some(l.subtract(n)?);
        }
        if let Some(p) = &self.left_padding {
            self.left_padding = Some(p.subtract(n)?);
        }
        Ok(())
    }

    /// mlx-lm's `ArraysCache.make_mask(N)`: `[B, N]` booleans, true at positions past the
    /// row's left padding and within its remaining length; `None` for a single sequence.
    #[track_caller]
    pub fn make_mask(&self, n: i32) -> Result<Option<Array>> {
        let pos = mlx_array::ops::arange(0.0, n as f64, 1.0, mlx_array::Dtype::Int32)?;
        let mut mask = None;
        if let Some(p) = &self.left_padding {
            mask = Some(pos.greater_equal(&p.expand_dims(&[1])?)?);
        }
        if let Some(l) = &self.lengths {
            let in_length = pos.less(&l.expand_dims(&[1])?)?;
            mask = Some(match mask {
                None => in_length,
                Some(m) => m.logical_and(&in_length)?,
            });
        }
        Ok(mask)
    }
}

/// mlx-lm's `create_causal_mask(N, offset, window_size)`: a boolean `[N, offset+N]` mask.
#[track_caller]
pub fn create_causal_mask(n: i32, offset: i32, window_size: Option<i32>) -> Result<Array> {
    use mlx_array::{ops::arange, Dtype};
    let rinds = arange(0.0, (offset + n) as f64, 1.0, Dtype::Int32)?;
    let linds = if offset != 0 {
        arange(offset as f64, (offset + n) as f64, 1.0, Dtype::Int32)?
    } else {
        rinds.clone()
    };
    let linds = linds.expand_dims(&[1])?;
    let rinds = rinds.expand_dims(&[0])?;
    let mut mask = linds.greater_equal(&rinds)?;
    if let Some(w) = window_size {
        mask = mask.logical_and(&linds.less(&rinds.add(w)?)?)?;
    }
    Ok(mask)
}

/// mlx-lm's `models.base.create_attention_mask(h, cache, window_size, return_array)`,
/// with `n = h.shape[1]` and the first layer's cache.
#[track_caller]
pub fn create_attention_mask(
    n: i32,
    cache: Option<&dyn KvCache>,
    window_size: Option<i32>,
    return_array: bool,
) -> Result<AttnMask> {
    if let Some(c) = cache {
        return c.make_mask(n, return_array, window_size);
    }
    if n == 1 {
        return Ok(AttnMask::None);
    }
    if return_array || window_size.is_some_and(|w| n > w) {
        return Ok(AttnMask::Array(create_causal_mask(n, 0, window_size)?));
    }
    Ok(AttnMask::Causal)
}

/// The mask a standard (non-rotating) cache returns from `make_mask`, mlx-lm's
/// `cache.create_attention_mask(N, offset, return_array, window_size)`.
#[track_caller]
pub fn standard_cache_mask(
    n: i32,
    offset: i32,
    return_array: bool,
    window_size: Option<i32>,
) -> Result<AttnMask> {
    if window_size.is_some() || (n > 1 && return_array) {
        Ok(AttnMask::Array(create_causal_mask(n, offset, window_size)?))
    } else if n == 1 {
        Ok(AttnMask::None)
    } else {
        Ok(AttnMask::Causal)
    }
}

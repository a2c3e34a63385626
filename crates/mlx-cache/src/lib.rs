//! KV caches with mlx-lm's exact semantics (`mlx_lm/models/cache.py`).
//!
//! Every cache implements [`mlx_nn::KvCache`], the interface models call during their
//! forward pass. The op sequence of each update is mlx-lm's, so keys, values and masks
//! are bit-identical to Python's.
//!
//! Linear-attention and state-space layers keep their recurrent state in an
//! [`ArraysCache`] (mlx-lm's class of that name: array slots, not trimmable).
//!
//! A layer that keeps several caches gets a [`CacheList`] (mlx-lm's class of that
//! name), whose caches it reads as `cache[0]`, `cache[1]`, ...
//!
//! For continuous batching, [`BatchKVCache`] and [`BatchRotatingKVCache`] (mlx-lm's
//! left-padded batch caches, with per-row RoPE offsets) hold several sequences;
//! [`BatchPromptCache`] merges single-sequence caches into a batch, drops finished rows,
//! appends new ones and extracts one row's caches again. Quantized caches are not
//! batched (mlx-lm's `QuantizedKVCache` has no `merge` either).
//!
//! ```
//! use mlx_cache::{KVCache, KvCache};
//! use mlx_array::{ops::ones, Dtype};
//! let mut c = KVCache::new();
//! let k = ones(&[1, 2, 3, 4], Dtype::Float32)?;
//! let (keys, _values) = c.update(&k, &k)?;
//! assert_eq!(keys.shape(), vec![1, 2, 3, 4]);
//! assert_eq!(c.offset(), 3);
//! assert_eq!(c.keys().map(|b| b.shape()), Some(vec![1, 2, 256, 4])); // grows by 256
//! # Ok::<(), mlx_array::Error>(())
//! ```
#![warn(missing_docs)]

mod arrays;
mod batch;
mod batch_prompt;
mod batch_rotating;
mod chunked;
mod error;
mod file;
mod kv;
mod list;
mod quantized;
mod rotating;
mod util;

pub use arrays::ArraysCache;
pub use batch::{batch_causal_mask, BatchKVCache};
pub use batch_prompt::{is_batchable, BatchPromptCache};
pub use batch_rotating::BatchRotatingKVCache;
pub use chunked::ChunkedKVCache;
pub use error::{CacheError, Result};
pub use file::{
    decode_tokens, encode_tokens, load_prompt_cache, read_prompt_cache_header, save_prompt_cache,
    CacheTensors, FileHeader, TOKENS_KEY,
};
pub use kv::{ConcatenateKVCache, KVCache, STEP};
pub use list::CacheList;
pub use mlx_models::CacheSpec;
pub use mlx_nn::cache::{AttnMask, KvCache, KvFetch, RopePosition};
pub use quantized::{QuantTriple, QuantizedKVCache};
pub use rotating::RotatingKVCache;

/// A list of per-layer caches, as models take them.
pub type PromptCache = Vec<Box<dyn KvCache>>;

/// A private copy of one layer's cache (mlx-lm: `copy.deepcopy(cache)`): MLX arrays are
/// immutable and cache updates build new arrays, so cloning the handles copies the
/// cache. `None` for a cache kind that has no copy here.
pub fn copy_cache(cache: &dyn KvCache) -> Option<Box<dyn KvCache>> {
    let any = cache.as_any();
    if let Some(k) = any.downcast_ref::<KVCache>() {
        Some(Box::new(k.clone()))
    } else if let Some(r) = any.downcast_ref::<RotatingKVCache>() {
        Some(Box::new(r.clone()))
    } else if let Some(q) = any.downcast_ref::<QuantizedKVCache>() {
        Some(Box::new(q.clone()))
    } else if let Some(c) = any.downcast_ref::<ChunkedKVCache>() {
        Some(Box::new(c.clone()))
    } else if let Some(a) = any.downcast_ref::<ArraysCache>() {
        Some(Box::new(a.clone()))
    } else if let Some(l) = any.downcast_ref::<CacheList>() {
        let caches: Option<Vec<_>> = l.caches().iter().map(|c| copy_cache(c.as_ref())).collect();
        Some(Box::new(CacheList::new(caches?)))
    } else {
        any.downcast_ref::<ConcatenateKVCache>()
            .map(|c| Box::new(c.clone()) as Box<dyn KvCache>)
    }
}

/// The first tokens a `max_kv_size` rotating cache always keeps (mlx-lm's
/// `make_prompt_cache`: `RotatingKVCache(max_size=max_kv_size, keep=4)`).
pub const MAX_KV_SIZE_KEEP: i32 = 4;

/// Builds one cache per layer, like mlx-lm's `make_prompt_cache(model, max_kv_size)`.
///
/// `specs` is the model's `cache_specs()`. Without `max_kv_size` each layer gets the
/// cache its spec names. With it, a model whose layers are all [`CacheSpec::Standard`]
/// (mlx-lm: a model without its own `make_cache`) gets
/// `RotatingKVCache(max_size=max_kv_size, keep=4)` for every layer; a model with
/// sliding-window layers (one that defines `make_cache` in mlx-lm) keeps its own
/// layout, since mlx-lm ignores `max_kv_size` for those.
pub fn make_prompt_cache(specs: &[CacheSpec], max_kv_size: Option<i32>) -> Result<PromptCache> {
    let all_standard = specs.iter().all(|s| *s == CacheSpec::Standard);
    if let Some(m) = max_kv_size {
        if m <= 0 {
            return Err(CacheError::InvalidArgument(format!(
                "max_kv_size must be positive, got {m}"
            )));
        }
        if all_standard {
            return Ok(specs
                .iter()
                .map(|_| Box::new(RotatingKVCache::new(m, MAX_KV_SIZE_KEEP)) as Box<dyn KvCache>)
                .collect());
        }
    }
    specs.iter().map(make_cache).collect()
}

/// The cache one spec names.
fn make_cache(spec: &CacheSpec) -> Result<Box<dyn KvCache>> {
    match *spec {
        CacheSpec::Standard => Ok(Box::new(KVCache::new())),
        CacheSpec::Rotating { max_size, keep } if max_size > 0 => {
            Ok(Box::new(RotatingKVCache::new(max_size, keep)))
        }
        CacheSpec::Rotating { max_size, .. } => Err(CacheError::InvalidArgument(format!(
            "a rotating cache needs a positive max_size, got {max_size}"
        ))),
        CacheSpec::Arrays { size } => Ok(Box::new(ArraysCache::new(size))),
        CacheSpec::Chunked { chunk_size } if chunk_size > 0 => {
            Ok(Box::new(ChunkedKVCache::new(chunk_size)))
        }
        CacheSpec::Chunked { chunk_size } => Err(CacheError::InvalidArgument(format!(
            "a chunked cache needs a positive chunk_size, got {chunk_size}"
        ))),
        CacheSpec::List(subs) => Ok(Box::new(CacheList::new(
            subs.iter().map(make_cache).collect::<Result<_>>()?,
        ))),
    }
}

/// mlx-lm's `can_trim_prompt_cache`: whether every cache can be trimmed.
pub fn can_trim_prompt_cache(caches: &[Box<dyn KvCache>]) -> bool {
    caches.iter().all(|c| c.is_trimmable())
}

/// mlx-lm's `trim_prompt_cache`: trims `n` positions from every cache (if all can be
/// trimmed) and returns how many the first one removed; 0 when nothing was trimmed.
pub fn trim_prompt_cache(caches: &mut [Box<dyn KvCache>], n: i32) -> i32 {
    if !can_trim_prompt_cache(caches) || caches.is_empty() {
        return 0;
    }
    let trimmed: Vec<i32> = caches.iter_mut().map(|c| c.trim(n)).collect();
    trimmed[0]
}

/// mlx-lm's `maybe_quantize_kv_cache(prompt_cache, quantized_kv_start, kv_group_size,
/// kv_bits)`: with `bits` set, every [`KVCache`] whose offset reached
/// `quantized_kv_start` is replaced by its [`QuantizedKVCache`]. A
/// [`RotatingKVCache`] that qualifies is an error, as in mlx-lm.
pub fn maybe_quantize_kv_cache(
    caches: &mut [Box<dyn KvCache>],
    quantized_kv_start: i32,
    group_size: i32,
    bits: Option<i32>,
) -> Result<()> {
    let Some(bits) = bits else {
        return Ok(());
    };
    for c in caches.iter_mut() {
        if c.offset() < quantized_kv_start {
            continue;
        }
        if let Some(kv) = c.as_any().downcast_ref::<KVCache>() {
            let q = kv.to_quantized(group_size, bits)?;
            *c = Box::new(q);
        } else if let Some(r) = c.as_any().downcast_ref::<RotatingKVCache>() {
            r.to_quantized(group_size, bits)?;
        }
    }
    Ok(())
}

//! The interface every architecture implements.
use mlx_array::{Array, Result};
use mlx_nn::{KvCache, Module};

/// The kind of KV cache a layer wants (mlx-lm's `model.make_cache()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSpec {
    /// A growing cache (mlx-lm `KVCache`).
    Standard,
    /// A sliding-window cache (mlx-lm `RotatingKVCache(max_size, keep)`).
    Rotating {
        /// Window size.
        max_size: i32,
        /// Leading positions never evicted.
        keep: i32,
    },
}

/// A causal language model: token ids in, logits out.
pub trait LanguageModel: Send {
    /// `tokens` is `[B, L]` int32 (uint32 accepted); returns logits `[B, L, vocab]`.
    /// `caches` is empty (no cache) or holds one cache per layer; they are updated in place.
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array>;

    /// The caches this model wants, one per layer. Callers pass a cache's own
    /// `--max-kv-size` instead where the user asks for one.
    fn cache_specs(&self) -> Vec<CacheSpec>;

    /// `model_type` from config.json.
    fn model_type(&self) -> &str;

    /// Vocabulary size (last axis of the logits).
    fn vocab_size(&self) -> i32;

    /// Number of transformer layers.
    fn num_layers(&self) -> usize;

    /// The parameter tree (names, freezing, updates), where the model exposes one.
    fn as_module(&self) -> Option<&dyn Module> {
        None
    }

    /// The parameter tree, mutably.
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        None
    }
}

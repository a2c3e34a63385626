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
    /// A cache that keeps the last `chunk_size` positions for chunked attention (mlx-lm
    /// `ChunkedKVCache(chunk_size)`, Llama 4's local layers). mlx-lm cannot batch it
    /// (the class has no `merge`), so a model with such layers is served unbatched.
    Chunked {
        /// Attention chunk size.
        chunk_size: i32,
    },
    /// Recurrent state of a linear-attention or state-space layer (mlx-lm
    /// `ArraysCache(size)`): `size` arrays, no keys or values.
    Arrays {
        /// Number of state arrays.
        size: usize,
    },
    /// Several caches for one layer (mlx-lm `CacheList(...)`), which the layer reads as
    /// `cache[0]`, `cache[1]`, ...: e.g. the latent keys and values plus the indexer's
    /// keys of a sparse-attention layer, or a recurrent state plus keys and values.
    List(&'static [CacheSpec]),
}

/// A causal language model: token ids in, logits out.
pub trait LanguageModel: Send {
    /// `tokens` is `[B, L]` int32 (uint32 accepted); returns logits `[B, L, vocab]`.
    /// `caches` is empty (no cache) or holds one cache per entry of [`Self::cache_specs`]
    /// (one per layer, except where layers share keys and values); updated in place.
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array>;

    /// The caches this model wants (mlx-lm's `make_cache`): one per layer, or fewer where
    /// later layers read an earlier layer's keys and values (Gemma 4). Callers pass a cache's own
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

    /// The blocks, norms and projections activation-aware quantization works on
    /// ([`crate::awq`]); `None` for architectures it does not cover.
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        None
    }

    /// Whether mlx-lm's class for this model defines `make_cache`: mlx-lm's
    /// `make_prompt_cache(model, max_kv_size)` then returns the model's own caches and
    /// ignores `max_kv_size`. Each architecture answers for its own mlx-lm class.
    fn defines_make_cache(&self) -> bool {
        false
    }

    /// Whether prompts of different lengths prefilled together in one right-padded
    /// batch each end with the state they would have alone: true where every layer keeps
    /// the padding out (attention masks, recurrent layers through `ArraysCache`'s
    /// lengths). Models whose recurrent blocks ignore the padding (as mlx-lm's do) answer
    /// false, and the engine prefills their prompts one at a time (decoding them
    /// together still).
    fn padded_prefill_is_exact(&self) -> bool {
        true
    }
}

/// How many keys mlx-lm's `load_model(dir)` takes from MLX's global random sequence.
///
/// Building the model draws initial weights: one key per `nn.Linear` weight and bias,
/// `nn.Embedding` weight and `SwitchLinear` weight (norms start from ones, a switch
/// bias from zeros). Each layer `nn.quantize` then replaces draws one more key for its
/// own random initial weight. Modules dropped by `sanitize` (gemma3's tied `lm_head`)
/// were built, so they count. mlx-lm's commands seed before loading, so a sampler
/// seeded the same way sees mlx-lm's keys only after as many
/// [`mlx_array::random::next_key`] calls as this returns.
///
/// Reads config.json, and for a quantized model the weight files' headers (the
/// tensors stay unread).
pub fn mlx_lm_init_key_draws(dir: &std::path::Path) -> crate::Result<usize> {
    let raw = crate::loader::load_config(dir)?;
    let mut model = crate::registry::build_model(&raw)?;
    // Quantizable layers of the freshly built model: path -> rank of the dense weight
    // (2: Linear or Embedding, 3: SwitchLinear).
    let mut layers = std::collections::BTreeMap::new();
    model.visit_quantizable_mut("", &mut |path, layer| {
        layers.insert(path.to_string(), layer.dense_weight_shape().len());
        Ok(())
    })?;
    let mut draws = layers.len() + model.extra_init_key_draws();
    model.visit_params("", &mut |name, _| {
        let linear_bias = name
            .strip_suffix(".bias")
            .and_then(|path| layers.get(path))
            .is_some_and(|&rank| rank == 2);
        draws += usize::from(linear_bias);
    });
    let Some(quantization) = crate::QuantizationConfig::from_config(&raw)? else {
        return Ok(draws);
    };
    let weights = model.sanitize(crate::loader::load_weights(dir)?)?;
    let mut quantized = 0;
    model.visit_quantizable_mut("", &mut |path, layer| {
        let spec = quantization.spec_for(path, layer, &weights).map_err(|e| {
            mlx_nn::Error::Quantization {
                path: path.to_string(),
                message: e.to_string(),
            }
        })?;
        quantized += usize::from(spec.is_some());
        Ok(())
    })?;
    Ok(draws + quantized)
}

//! One module per architecture, each following one mlx-lm file, plus the pieces they
//! share (head reshapes, the RoPE + cache + SDPA step, per-layer cache handout).
use crate::model::LanguageModel;
use mlx_array::{Array, Error, Result};
use mlx_nn::{
    scaled_dot_product_attention, AttnMask, FusedLinears, KvCache, KvFetch, LinearLayer, Module,
    Rope,
};
use std::collections::BTreeMap;

/// The [`LanguageModel`] methods every decoder file writes the same way, for a model
/// with `args.model_type`, `args.vocab_size` and `model.layers` (or the layer list
/// named, e.g. `decoder_accessors!(transformer.h)`) that is its own module.
macro_rules! decoder_accessors {
    () => {
        decoder_accessors!(model.layers);
    };
    ($($layers:ident).+) => {
        fn model_type(&self) -> &str {
            &self.args.model_type
        }
        fn vocab_size(&self) -> i32 {
            self.args.vocab_size
        }
        fn num_layers(&self) -> usize {
            self.$($layers).+.len()
        }
        fn as_module(&self) -> Option<&dyn mlx_nn::Module> {
            Some(self)
        }
        fn as_module_mut(&mut self) -> Option<&mut dyn mlx_nn::Module> {
            Some(self)
        }
    };
}

pub mod attention;
#[macro_use]
mod recurrent;
pub mod decoder;
pub mod head;
#[macro_use]
pub mod lm;
pub mod mla;
pub mod mlp;

/// Builds an architecture (zero placeholder weights) from config.json.
pub(crate) type Builder = fn(&serde_json::Value) -> crate::Result<Box<dyn Architecture>>;

/// Declares one module per architecture and [`ARCHITECTURES`], the registry's list, from
/// one list of names: each module is the mlx-lm file of that `model_type` and has a
/// `build` function. `module = "model-type"` names a file whose `model_type` is no Rust
/// identifier (`lille-130m`).
macro_rules! architectures {
    ($($name:ident $(= $model_type:literal)?),* $(,)?) => {
        $(pub mod $name;)*

        /// Every architecture, by the `model_type` of its mlx-lm file.
        pub(crate) const ARCHITECTURES: &[(&str, Builder)] =
            &[$((model_type!($name $(, $model_type)?), $name::build)),*];
    };
}

/// The `model_type` of an [`architectures!`] entry: its literal, else its module name.
macro_rules! model_type {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident, $model_type:literal) => {
        $model_type
    };
}

// One line per architecture.
architectures! {
    cohere2,
    exaone4,
    gemma,
    gemma2,
    gemma3,
    gemma3_text,
    glm4,
    gpt_oss,
    granite,
    llama,
    ministral3,
    mistral3,
    mixtral,
    olmo2,
    olmo3,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    seed_oss,
    smollm3,
    starcoder2,
    // Issue 26, dense and MoE families on the shared pieces:
    olmoe,
    mimo,
    helium,
    ernie4_5,
    internlm3,
    glm4_moe,
    ernie4_5_moe,
    qwen2_vl,
    qwen3_vl,
    hunyuan_v1_dense,
    // Issue 26, hybrid linear-attention and state-space families (`recurrent`):
    qwen3_next,
    qwen3_5,
    qwen3_5_moe,
    lfm2,
    lfm2_moe,
    granitemoehybrid,
    nemotron_h,
    mamba,
    mamba2,
    falcon_h1,
    // Issue 26, multi-head latent attention (`mla`):
    deepseek_v3,
    deepseek_v32,
    kimi_k25,
    glm4_moe_lite,
    deepseek_v2,
    minicpm3,
    // Issue 26, wave 2 part B: dense and MoE families.
    phi,
    phimoe,
    granitemoe,
    internlm2,
    exaone,
    cohere,
    minicpm,
    nemotron,
    gpt_neox,
    gpt2,
    gpt_bigcode,
    stablelm,
    qwen3_vl_moe,
    dots1,
    // Issue 26, chunked attention (`ChunkedKVCache`):
    llama4,
    llama4_text,
    minimax,
    exaone_moe,
    olmo,
    hunyuan,
    baichuan_m1,
    bailing_moe,
    apertus,
    glm_moe_dsa,
    solar_open,
    qwen,
    gptj,
    glm,
    openelm,
    nanochat,
    mistral4,
    deepseek,
    dbrx,
    phixtral,
    telechat3,
    nanbeige,
    lille_130m = "lille-130m",
    pixtral,
    lfm2_vl = "lfm2-vl",
    kimi_vl,
    nemotron_nas = "nemotron-nas",
    youtu_llm,
    klear = "Klear",
    mellum,
    talkie,
    plamo,
    iquestloopcoder,
    plamo3,
    muse_glimmer,
    spark2_5,
    laguna,
    mimo_v2_flash,
    // Wave 5.
    afmoe,
    jamba,
    olmo_hybrid,
    recurrent_gemma,
    step3p5,
    plamo2,
    // Wave 6.
    gear,
    rwkv7,
    longcat_flash,
    // Issue 26: Gemma 4 (KV caches shared between layers).
    gemma4_text,
    gemma4,
    gemma3n,
}

/// Flat weight map (checkpoint name -> array).
pub type Weights = BTreeMap<String, Array>;

/// Converts a boxed architecture into the public trait object.
pub trait IntoLanguageModel {
    /// The model as a `LanguageModel`.
    fn into_language_model(self: Box<Self>) -> Box<dyn LanguageModel>;
}

impl<T: LanguageModel + 'static> IntoLanguageModel for T {
    fn into_language_model(self: Box<Self>) -> Box<dyn LanguageModel> {
        self
    }
}

/// What the loader needs from an architecture beyond [`LanguageModel`].
pub trait Architecture: LanguageModel + Module + IntoLanguageModel {
    /// mlx-lm's `Model.sanitize(weights)`: renames, stacks or drops checkpoint tensors
    /// so they match [`Module::parameters`] (it may also adjust the model, like
    /// gemma3's tied head).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights)
    }

    /// Keys mlx-lm's constructor draws besides those of the built model's `Linear`,
    /// `Embedding` and `SwitchLinear` layers: convolution weights, random initial
    /// parameters, and modules it builds and then replaces or drops; see
    /// [`crate::model::mlx_lm_init_key_draws`].
    fn extra_init_key_draws(&self) -> usize {
        0
    }

    /// Concatenates the weights of projections that read the same input (q/k/v, gate/up)
    /// so single-position steps run one matmul for them ([`FusedLinears`]); called by
    /// the loader once the weights are in. Architectures without it do nothing.
    fn fuse_projections(&mut self) -> crate::Result<()> {
        Ok(())
    }
}

/// A malformed config.json of architecture `model_type` (the error's path reads
/// `config.json (model_type)`).
pub(crate) fn config_error(model_type: &str, message: String) -> crate::Error {
    crate::Error::Config {
        path: format!("config.json ({model_type})"),
        message,
    }
}

/// [`FusedLinears::fuse`] over a fixed set of dense layers. Quantized layers stay
/// separate: on the H200 (benchmarks/GPU.md, run 5) fused 4-bit projections were
/// bit-identical but slower for llama-3.2-1b-4bit (decode ~-20%, prefill through the
/// weight views ~-10%), while fused dense ones sped decoding up (qwen2.5-0.5b-bf16, whose
/// biased projections are `addmm`s: +20-50%).
pub(crate) fn fuse<const N: usize>(
    layers: [&mut LinearLayer; N],
) -> crate::Result<Option<Box<FusedLinears>>> {
    if layers
        .iter()
        .any(|l| !matches!(&**l, LinearLayer::Dense(_)))
    {
        return Ok(None);
    }
    let mut layers = layers;
    Ok(FusedLinears::fuse(&mut layers)?.map(Box::new))
}

/// The outputs of `layers` for `x`: from the fused matmul when `x` has one position per
/// row and the fused weights still match the layers, else layer by layer (quantized ones
/// through one [`LinearLayer::forward_many`]: one launch for all in a decoding step).
pub(crate) fn project<const N: usize>(
    fused: Option<&FusedLinears>,
    layers: [&LinearLayer; N],
    x: &Array,
) -> Result<[Array; N]> {
    if let Some(f) = fused {
        if x.ndim() == 3 && x.dim(1)? == 1 && f.matches(&layers) {
            let outs = f.forward(x)?;
            if let Ok(outs) = <[Array; N]>::try_from(outs) {
                return Ok(outs);
            }
        }
    }
    let outs = LinearLayer::forward_many(&layers, x)?;
    <[Array; N]>::try_from(outs)
        .map_err(|_| Error::InvalidArgument("projection count mismatch".into()))
}

/// mlx-lm's `swiglu(gate(x), up(x))`: through the fused dense matmul where the layers
/// have one (see [`project`]; in a decoding step on the CUDA backend one launch of our
/// kernel for the product and the swiglu, `FusedLinears::forward_swiglu`), else
/// [`LinearLayer::forward_swiglu`] (one launch of our kernels for quantized layers in a
/// decoding step).
pub(crate) fn swiglu_mlp(
    fused: Option<&FusedLinears>,
    gate: &LinearLayer,
    up: &LinearLayer,
    x: &Array,
) -> Result<Array> {
    let Some(f) = fused else {
        return LinearLayer::forward_swiglu(gate, up, x);
    };
    if x.ndim() == 3 && x.dim(1)? == 1 && f.matches(&[gate, up]) {
        if let Some(y) = f.forward_swiglu(x)? {
            return Ok(y);
        }
    }
    let [g, u] = project(fused, [gate, up], x)?;
    mlx_nn::activations::swiglu(&g, &u)
}

/// `layer.forward(x)`, plus `residual` when given: the same arrays as `residual +
/// layer.forward(x)`, as one op for a quantized layer (`LinearLayer::forward_add`, which
/// can add the residual in our kernel's launch).
pub(crate) fn project_out(
    layer: &LinearLayer,
    x: &Array,
    residual: Option<&Array>,
) -> Result<Array> {
    match residual {
        Some(r) => layer.forward_add(x, r),
        None => layer.forward(x),
    }
}

/// `x.reshape(B, L, n, -1).transpose(0, 2, 1, 3)`.
///
/// With one position (`L == 1`, every decode step) the transpose only moves a size-1
/// axis, so one reshape gives the same elements in the same order and the same
/// row-contiguity (MLX ignores size-1 axes there): one graph node instead of two per
/// call, which the host builds and schedules every token.
pub(crate) fn split_heads(x: &Array, b: i32, l: i32, n: i32) -> Result<Array> {
    if l == 1 {
        return x.reshape(&[b, n, 1, -1]);
    }
    x.reshape(&[b, l, n, -1])?.transpose(Some(&[0, 2, 1, 3]))
}

/// `x.transpose(0, 2, 1, 3).reshape(B, L, -1)`; a single reshape when `L == 1` (same
/// element order, see [`split_heads`]).
pub(crate) fn merge_heads(x: &Array, b: i32, l: i32) -> Result<Array> {
    if l == 1 {
        return x.reshape(&[b, 1, -1]);
    }
    x.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])
}

/// `(B, L)` of a `[B, L, D]` activation.
pub(crate) fn batch_len(x: &Array) -> Result<(i32, i32)> {
    let s = x.shape();
    if s.len() != 3 {
        return Err(Error::InvalidArgument(format!(
            "expected [B, L, D] activations, got {s:?}"
        )));
    }
    Ok((s[0], s[1]))
}

/// RoPE at the cache offset, cache update, then mlx-lm's SDPA: the common tail of
/// every attention block.
pub(crate) fn rope_attend(
    queries: &Array,
    keys: &Array,
    values: Array,
    rope: &Rope,
    cache: Option<&mut dyn KvCache>,
    scale: f64,
    mask: &AttnMask,
) -> Result<Array> {
    let (queries, fetch) = rope_cache(queries, keys, values, rope, cache)?;
    scaled_dot_product_attention(&queries, &fetch, scale, mask, None)
}

/// The head of [`rope_attend`]: queries and keys rotated at the cache offset, the cache
/// updated; returns the queries and what attention reads.
pub(crate) fn rope_cache(
    queries: &Array,
    keys: &Array,
    values: Array,
    rope: &Rope,
    cache: Option<&mut dyn KvCache>,
) -> Result<(Array, KvFetch)> {
    rope_cache_with(queries, keys, values, rope, cache, None)
}

/// What a model does to the rotated queries and keys before the cache update.
pub(crate) type AfterRope<'a> = &'a dyn Fn(Array, Array) -> Result<(Array, Array)>;

/// Queries and keys rotated, then passed through `after_rope` (a model that normalizes
/// them there), before the cache update: [`rope_cache`] with that extra step.
pub(crate) fn rope_cache_with(
    queries: &Array,
    keys: &Array,
    values: Array,
    rope: &Rope,
    cache: Option<&mut dyn KvCache>,
    after_rope: Option<AfterRope<'_>>,
) -> Result<(Array, KvFetch)> {
    let post = |q: Array, k: Array| match after_rope {
        Some(f) => f(q, k),
        None => Ok((q, k)),
    };
    Ok(match cache {
        Some(c) => {
            let offset = c.rope_offset()?;
            let q = rope.forward_at(queries, offset.as_rope_offset())?;
            let k = rope.forward_at(keys, offset.as_rope_offset())?;
            let (q, k) = post(q, k)?;
            (q, mlx_nn::pipeline::update_and_fetch(c, &k, &values)?)
        }
        None => {
            let (q, keys) = post(rope.forward(queries, 0)?, rope.forward(keys, 0)?)?;
            (q, KvFetch::Plain { keys, values })
        }
    })
}

/// mlx-lm's `make_cache` for models with sliding-window layers: a `RotatingKVCache(max_size
/// = window, keep = 0)` for each sliding layer, a plain `KVCache` for the others.
pub(crate) fn window_cache_specs(
    sliding: impl IntoIterator<Item = bool>,
    window: i32,
) -> Vec<crate::model::CacheSpec> {
    sliding
        .into_iter()
        .map(|s| {
            if s {
                crate::model::CacheSpec::Rotating {
                    max_size: window,
                    keep: 0,
                }
            } else {
                crate::model::CacheSpec::Standard
            }
        })
        .collect()
}

/// The indices of the `k` largest entries of the last axis, unordered: the last `k` of
/// `argpartition(x, kth=-k)`, as mlx-lm's routers take them.
pub(crate) fn top_k_indices(x: &Array, k: i32) -> Result<Array> {
    let part = x.argpartition(-k, Some(-1))?;
    let last = part.dim(-1)?;
    part.slice_axis(-1, last - k, last)?.stop_gradient()
}

/// The same `k` indices the other way round: the first `k` of
/// `argpartition(-x, kth=k - 1)` (mixtral's and qwen2_moe's form; the order within the
/// `k` can differ from [`top_k_indices`], so each model keeps mlx-lm's own).
pub(crate) fn top_k_indices_of_negated(x: &Array, k: i32) -> Result<Array> {
    x.negative()?
        .argpartition(k - 1, Some(-1))?
        .slice_axis(-1, 0, k)?
        .stop_gradient()
}

/// The group-limited step of mlx-lm's routers: the last axis of `scores` viewed as
/// `n_group` groups, the `n_group - topk_group` groups whose two best scores sum lowest
/// set to zero, the groups flattened back.
pub(crate) fn zero_weak_groups(scores: &Array, n_group: i32, topk_group: i32) -> Result<Array> {
    let grouped = scores.unflatten(-1, &[n_group, -1])?;
    let group_scores = grouped.topk(2, Some(-1))?.sum(Some(&[-1]), true)?;
    let k = n_group - topk_group;
    let weakest = group_scores
        .argpartition(k - 1, Some(-2))?
        .slice_axis(-2, 0, k)?
        .stop_gradient()?;
    let zero = Array::scalar(0.0f32)?;
    grouped.put_along_axis(&weakest, &zero, -2)?.flatten(-2, -1)
}

/// A compiled router's two outputs, expert indices then their scores (`model` names the
/// router in the error when there are not two).
pub(crate) fn router_outputs(mut out: Vec<Array>, model: &str) -> Result<(Array, Array)> {
    let scores = out.pop();
    match (out.pop(), scores) {
        (Some(inds), Some(scores)) => Ok((inds, scores)),
        _ => Err(mlx_array::Error::InvalidArgument(format!(
            "{model} router: expected two outputs"
        ))),
    }
}

/// `(y * scores[..., None]).sum(axis=-2).astype(y.dtype)`: the chosen experts' outputs
/// weighted by their router scores.
pub(crate) fn weigh_experts(y: &Array, scores: &Array) -> Result<Array> {
    y.multiply(&scores.expand_dims(&[-1])?)?
        .sum(Some(&[-2]), false)?
        .astype(y.dtype())
}

/// The first layer of `kind` in `layer_types` (where mlx-lm's `layer_types.index(kind)`
/// would raise, a config error naming the key).
pub(crate) fn layer_type_index(types: &[String], kind: &str, model: &str) -> crate::Result<usize> {
    types
        .iter()
        .position(|t| t == kind)
        .ok_or_else(|| crate::Error::Config {
            path: format!("config.json ({model})"),
            message: format!("key `layer_types`: no \"{kind}\" layer"),
        })
}

/// One optional cache per layer: all `None` when `caches` is empty.
pub(crate) fn layer_caches(
    caches: &mut [Box<dyn KvCache>],
    n: usize,
) -> Result<Vec<Option<&mut dyn KvCache>>> {
    if caches.is_empty() {
        return Ok((0..n).map(|_| None).collect());
    }
    if caches.len() != n {
        return Err(Error::InvalidArgument(format!(
            "the model has {n} layers but {} caches were passed",
            caches.len()
        )));
    }
    Ok(caches
        .iter_mut()
        .map(|c| Some(c.as_mut() as &mut dyn KvCache))
        .collect())
}

/// The cache of layer `i`, for mask creation (`None` without caches).
pub(crate) fn cache_at(caches: &[Box<dyn KvCache>], i: usize) -> Option<&dyn KvCache> {
    caches.get(i).map(|c| c.as_ref())
}

/// The causal masks of a stack that mixes global and sliding-window layers (mlx-lm's
/// `fa_mask` / `swa_mask`): the global one from the cache at `full_idx`, and, where the
/// model has sliding layers (`swa_idx`, the first of them), the windowed one from that
/// layer's cache.
pub(crate) struct LayerMasks {
    full: AttnMask,
    sliding: Option<AttnMask>,
}

impl LayerMasks {
    /// Both masks for `n` new positions.
    pub(crate) fn new(
        n: i32,
        caches: &[Box<dyn KvCache>],
        full_idx: usize,
        swa_idx: Option<usize>,
        window: Option<i32>,
    ) -> Result<LayerMasks> {
        let full =
            mlx_nn::cache::create_attention_mask(n, cache_at(caches, full_idx), None, false)?;
        let sliding = match swa_idx {
            Some(i) => Some(mlx_nn::cache::create_attention_mask(
                n,
                cache_at(caches, i),
                window,
                false,
            )?),
            None => None,
        };
        Ok(LayerMasks { full, sliding })
    }

    /// A layer's mask: the windowed one where the layer slides (and the model has one),
    /// else the global one.
    pub(crate) fn get(&self, sliding: bool) -> &AttnMask {
        match (&self.sliding, sliding) {
            (Some(m), true) => m,
            _ => &self.full,
        }
    }
}

/// Drops the precomputed rotary buffers HF checkpoints may carry.
pub(crate) fn drop_rotary_inv_freq(weights: Weights) -> Weights {
    weights
        .into_iter()
        .filter(|(k, _)| !k.contains("self_attn.rotary_emb.inv_freq"))
        .collect()
}

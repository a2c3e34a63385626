//! Gear (`gear`), following `mlx_lm/models/gear.py`: embeddings times
//! `sqrt(hidden_size)`; sandwich layers (input, post-mixer, pre-MLP and post-MLP norms,
//! each `rms_norm(x, (1 + weight).astype(x.dtype))`); by `layer_types` a full attention
//! layer (`KVCache`, RoPE at `rope_theta` with `rope_scaling`), a sliding one
//! (`RotatingKVCache(sliding_window)`, RoPE at `rope_local_base_freq`, the windowed
//! mask) or a convolutional key/value-gated mixer (`conv_mixer`: the masked input
//! projected to q / k / v, per-head norms of q and k, a depthwise causal convolution of
//! width `conv_L_cache` over k and over v with their windows in an `ArraysCache(2)`,
//! k and v repeated over the query heads, `o_proj(sigmoid(q * k) * v)`). The attention
//! has per-head norms on q and k, a scale of `query_pre_attn_scalar ** -0.5`, and with
//! `attn_logit_softcapping` scores `tanh(s / cap) * cap` computed outside the fused
//! kernel (keys and values repeated per head, the string mask made a boolean one).
//! Gated MLPs by `hidden_activation`; the head tied by `tie_word_embeddings`, its
//! logits soft-capped by `final_logit_softcapping`. `sanitize` drops rotary buffers,
//! `embed_scale` and a tied head and moves HF's convolution weights to MLX's layout.
use super::config_error;
use super::head::{self, LogitScale};
use super::recurrent::{mask_positions, recurrent_state, DepthwiseConv};
use super::{batch_len, cache_at, layer_caches, merge_heads, split_heads, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result, Scalar};
use mlx_nn::attention::mask_scores;
use mlx_nn::cache::{create_attention_mask, ArraysState};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, KvFetch, LinearLayer, Param,
    Rope,
};
use serde::Deserialize;
use serde_json::Value;

const FULL: &str = "full_attention";
const SLIDING: &str = "sliding_attention";
const CONV: &str = "conv_mixer";

/// config.json keys read by Gear (mlx-lm's defaults for the optional ones).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    /// Required, but may be null (then `num_attention_heads`).
    #[serde(deserialize_with = "Option::deserialize")]
    pub num_key_value_heads: Option<i32>,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    /// Required, but may be null (then all full attention).
    #[serde(deserialize_with = "Option::deserialize")]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default = "d::hidden_activation")]
    pub hidden_activation: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(default = "d::sliding_window")]
    pub sliding_window: i32,
    #[serde(default = "d::conv_l_cache", rename = "conv_L_cache")]
    pub conv_l_cache: i32,
    #[serde(default = "d::rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "d::rope_local_base_freq")]
    pub rope_local_base_freq: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "d::yes")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub use_bidirectional_attention: bool,
}

/// mlx-lm's dataclass defaults.
mod d {
    pub fn hidden_activation() -> String {
        "gelu_pytorch_tanh".into()
    }
    pub fn sliding_window() -> i32 {
        512
    }
    pub fn conv_l_cache() -> i32 {
        3
    }
    pub fn rope_theta() -> f64 {
        1_000_000.0
    }
    pub fn rope_local_base_freq() -> f64 {
        10_000.0
    }
    pub fn yes() -> bool {
        true
    }
}

/// A Python-truthy soft cap (`None` and 0 mean none).
fn softcap(v: Option<f64>) -> Option<f64> {
    v.filter(|c| *c != 0.0)
}

/// `GearRMSNorm`: `rms_norm(x, (1 + weight).astype(x.dtype), eps)`.
#[derive(Debug)]
struct GearNorm {
    weight: Param,
    eps: f32,
}
impl_module!(GearNorm { weight });

impl GearNorm {
    fn new(dims: i32, eps: f64) -> crate::Result<GearNorm> {
        Ok(GearNorm {
            weight: Param::new(ops::zeros(&[dims], Dtype::Float32)?),
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let w = Array::weak_scalar(Scalar::Float(1.0), self.weight.dtype())?
            .add(&self.weight)?
            .astype(x.dtype())?;
        fast::rms_norm(x, Some(&w), self.eps)
    }
}

/// The MLP's activation (`_activation`).
#[derive(Debug, Clone, Copy)]
enum Act {
    GeluApprox,
    Gelu,
    Silu,
}

impl Act {
    fn parse(name: &str) -> Option<Act> {
        match name {
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Some(Act::GeluApprox),
            "gelu" => Some(Act::Gelu),
            "silu" | "swish" => Some(Act::Silu),
            _ => None,
        }
    }

    fn apply(self, x: &Array) -> Result<Array> {
        match self {
            Act::GeluApprox => mlx_nn::activations::gelu_approx(x),
            Act::Gelu => mlx_nn::activations::gelu(x),
            Act::Silu => mlx_nn::activations::silu(x),
        }
    }
}

/// `down_proj(act(gate_proj(x)) * up_proj(x))`.
#[derive(Debug)]
struct Mlp {
    gate_proj: LinearLayer,
    up_proj: LinearLayer,
    down_proj: LinearLayer,
    act: Act,
}
impl_module!(Mlp {
    gate_proj,
    up_proj,
    down_proj
});

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let g = self.act.apply(&self.gate_proj.forward(x)?)?;
        self.down_proj.forward(&g.multiply(&self.up_proj.forward(x)?)?)
    }
}

/// `x` with its `[B, n_kv, L, D]` heads repeated `repeats` times each (`_repeat_kv`).
fn repeat_kv(x: &Array, repeats: i32) -> Result<Array> {
    if repeats == 1 {
        return Ok(x.clone());
    }
    let s = x.shape();
    let (b, n, l, d) = (s[0], s[1], s[2], s[3]);
    x.expand_dims(&[2])?
        .broadcast_to(&[b, n, repeats, l, d])?
        .reshape(&[b, n * repeats, l, d])
}

/// Full or sliding attention.
#[derive(Debug)]
struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    q_norm: GearNorm,
    k_norm: GearNorm,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
    softcap: Option<f64>,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj,
    q_norm,
    k_norm
});

impl Attention {
    fn new(a: &ModelArgs, kv: i32, sliding: bool) -> crate::Result<Attention> {
        let (dim, h, hd, bias) = (a.hidden_size, a.num_attention_heads, a.head_dim, a.attention_bias);
        let rope = if sliding {
            initialize_rope(hd, a.rope_local_base_freq, false, None, a.max_position_embeddings)?
        } else {
            initialize_rope(
                hd,
                a.rope_theta,
                false,
                rope_scaling(a.rope_scaling.as_ref())?.as_ref(),
                a.max_position_embeddings,
            )?
        };
        Ok(Attention {
            q_proj: LinearLayer::new(dim, h * hd, bias)?,
            k_proj: LinearLayer::new(dim, kv * hd, bias)?,
            v_proj: LinearLayer::new(dim, kv * hd, bias)?,
            o_proj: LinearLayer::new(h * hd, dim, bias)?,
            q_norm: GearNorm::new(hd, a.rms_norm_eps)?,
            k_norm: GearNorm::new(hd, a.rms_norm_eps)?,
            rope,
            n_heads: h,
            n_kv_heads: kv,
            scale: a.query_pre_attn_scalar.unwrap_or(f64::from(hd)).powf(-0.5),
            softcap: softcap(a.attn_logit_softcapping),
        })
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let heads = |p: &LinearLayer, n: i32| -> Result<Array> {
            p.forward(x)?.reshape(&[b, l, n, -1])
        };
        let q = self.q_norm.forward(&heads(&self.q_proj, self.n_heads)?)?.transpose(Some(&[0, 2, 1, 3]))?;
        let k = self.k_norm.forward(&heads(&self.k_proj, self.n_kv_heads)?)?.transpose(Some(&[0, 2, 1, 3]))?;
        let v = split_heads(&self.v_proj.forward(x)?, b, l, self.n_kv_heads)?;
        let (q, fetch) = super::rope_cache(&q, &k, v, &self.rope, cache)?;
        let out = match self.softcap {
            None => mlx_nn::scaled_dot_product_attention(&q, &fetch, self.scale, mask, None)?,
            Some(cap) => {
                let KvFetch::Plain { keys, values } = &fetch else {
                    return Err(mlx_array::Error::InvalidArgument(
                        "gear's soft-capped attention does not support quantized KV caches (as in mlx-lm)".into(),
                    ));
                };
                softcap_attention(&q, keys, values, self.scale, cap, mask)?
            }
        };
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// `_softcap_attention`: keys and values repeated per query head, `tanh(s / cap) * cap`
/// of the scaled scores, the mask (a string one made `q >= k` over the scores' shape),
/// a precise softmax.
fn softcap_attention(
    q: &Array,
    keys: &Array,
    values: &Array,
    scale: f64,
    cap: f64,
    mask: &AttnMask,
) -> Result<Array> {
    let repeats = q.dim(1)? / keys.dim(1)?;
    let keys = repeat_kv(keys, repeats)?;
    let values = repeat_kv(values, repeats)?;
    let scores = q.multiply(scale)?.matmul(&keys.swapaxes(-1, -2)?)?;
    let scores = scores.divide(cap)?.tanh()?.multiply(cap)?;
    let scores = match mask {
        AttnMask::None => scores,
        AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => mask_scores(&scores, m)?,
        AttnMask::Causal => {
            let (ql, kl) = (scores.dim(-2)?, scores.dim(-1)?);
            let qi = ops::arange(f64::from(kl - ql), f64::from(kl), 1.0, Dtype::Int32)?;
            let ki = ops::arange(0.0, f64::from(kl), 1.0, Dtype::Int32)?;
            let m = qi.expand_dims(&[1])?.greater_equal(&ki.expand_dims(&[0])?)?;
            mask_scores(&scores, &m)?
        }
    };
    scores.softmax(Some(&[-1]), true)?.matmul(&values)
}

/// `ConvKVGatedMixer`.
#[derive(Debug)]
struct ConvMixer {
    key_conv: DepthwiseConv,
    value_conv: DepthwiseConv,
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    q_norm: GearNorm,
    k_norm: GearNorm,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    l_cache: i32,
}
impl_module!(ConvMixer {
    key_conv,
    value_conv,
    q_proj,
    k_proj,
    v_proj,
    o_proj,
    q_norm,
    k_norm
});

impl ConvMixer {
    fn new(a: &ModelArgs, kv: i32) -> crate::Result<ConvMixer> {
        let (dim, h, hd, bias) = (a.hidden_size, a.num_attention_heads, a.head_dim, a.attention_bias);
        let kv_dim = kv * hd;
        let conv = || DepthwiseConv::zeros(kv_dim, a.conv_l_cache, bias);
        Ok(ConvMixer {
            key_conv: conv()?,
            value_conv: conv()?,
            q_proj: LinearLayer::new(dim, h * hd, bias)?,
            k_proj: LinearLayer::new(dim, kv_dim, bias)?,
            v_proj: LinearLayer::new(dim, kv_dim, bias)?,
            o_proj: LinearLayer::new(h * hd, dim, bias)?,
            q_norm: GearNorm::new(hd, a.rms_norm_eps)?,
            k_norm: GearNorm::new(hd, a.rms_norm_eps)?,
            n_heads: h,
            n_kv_heads: kv,
            head_dim: hd,
            l_cache: a.conv_l_cache,
        })
    }

    /// `_conv`: `x` after the cached window of slot `idx` (zeros without one), the last
    /// `L_cache - 1` real positions kept there; after that many zeros without a cache.
    fn conv(&self, x: &Array, conv: &DepthwiseConv, cache: Option<&mut ArraysState>, idx: usize) -> Result<Array> {
        let n_keep = self.l_cache - 1;
        let (b, l, c) = (x.dim(0)?, x.dim(1)?, x.dim(2)?);
        let input = match cache {
            Some(cache) => {
                let state = match cache.get(idx) {
                    Some(s) => s.clone(),
                    None => ops::zeros(&[b, n_keep, c], x.dtype())?,
                };
                let input = ops::concatenate(&[&state, x], 1)?;
                let kept = if n_keep > 0 {
                    match &cache.lengths {
                        Some(lengths) => {
                            let lo = Array::weak_scalar(Scalar::Int(0), lengths.dtype())?;
                            let hi = Array::weak_scalar(Scalar::Int(l.into()), lengths.dtype())?;
                            let ends = lengths.clip(Some(&lo), Some(&hi))?;
                            let steps = ops::arange(0.0, f64::from(n_keep), 1.0, Dtype::Int32)?;
                            let pos = ends.expand_dims(&[1])?.add(&steps)?.expand_dims(&[-1])?;
                            input.take_along_axis(&pos, 1)?
                        }
                        None => {
                            let t = input.dim(1)?;
                            input.slice_axis(1, t - n_keep, t)?.contiguous()?
                        }
                    }
                } else {
                    ops::zeros(&[b, 0, c], x.dtype())?
                };
                cache.set(idx, kept)?;
                input
            }
            None => x.pad(&[1], &[n_keep], &[0], None, "constant")?,
        };
        conv.apply(&input)
    }

    /// `_expand_kv`: `[B, L, n_kv * D]` to `[B, L, n_heads * D]`, each head repeated.
    fn expand_kv(&self, x: &Array) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let (kv, hd) = (self.n_kv_heads, self.head_dim);
        x.reshape(&[b, l, kv, hd])?
            .expand_dims(&[3])?
            .broadcast_to(&[b, l, kv, self.n_heads / kv, hd])?
            .reshape(&[b, l, self.n_heads * hd])
    }

    fn forward(&self, x: &Array, mask: Option<&Array>, mut cache: Option<&mut ArraysState>) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let x = mask_positions(x.clone(), mask)?;
        let (h, kv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q = self.q_proj.forward(&x)?.reshape(&[b, l, h, hd])?;
        let k = self.k_proj.forward(&x)?.reshape(&[b, l, kv, hd])?;
        let v = self.v_proj.forward(&x)?;
        let q = self.q_norm.forward(&q)?.reshape(&[b, l, -1])?;
        let k = self.k_norm.forward(&k)?.reshape(&[b, l, -1])?;
        let k = self.conv(&k, &self.key_conv, cache.as_deref_mut(), 0)?;
        let v = self.conv(&v, &self.value_conv, cache.as_deref_mut(), 1)?;
        if let Some(c) = cache {
            c.advance(l)?;
        }
        let k = self.expand_kv(&k)?;
        let v = self.expand_kv(&v)?;
        self.o_proj.forward(&q.multiply(&k)?.sigmoid()?.multiply(&v)?)
    }
}

/// A layer's mixer.
#[derive(Debug)]
enum Mixer {
    Attention(Box<Attention>),
    Conv(Box<ConvMixer>),
}
enum_module!(Mixer {
    Attention => "self_attn",
    Conv => "local_mixer",
});

/// A layer's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Full,
    Sliding,
    Conv,
}

/// `DecoderLayer`.
#[derive(Debug)]
struct DecoderLayer {
    mixer: Mixer,
    mlp: Mlp,
    input_layernorm: GearNorm,
    post_attention_layernorm: GearNorm,
    pre_feedforward_layernorm: GearNorm,
    post_feedforward_layernorm: GearNorm,
    kind: Kind,
}
impl_module!(DecoderLayer {
    mixer as "",
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm
});

/// `GearModel`.
#[derive(Debug)]
struct GearModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: GearNorm,
}
impl_module!(GearModel {
    embed_tokens,
    layers,
    norm
});

/// Gear with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    kinds: Vec<Kind>,
    model: GearModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("gear", m);
        let n = args.num_hidden_layers;
        if n < 0 {
            return Err(err("key `num_hidden_layers` must not be negative".into()));
        }
        let types = args
            .layer_types
            .clone()
            .unwrap_or_else(|| vec![FULL.to_string(); n as usize]);
        if types.len() != n as usize {
            return Err(err(format!(
                "key `layer_types`: expected {n} layer types, got {}",
                types.len()
            )));
        }
        if args.use_bidirectional_attention {
            return Err(err(
                "key `use_bidirectional_attention`: Gear bidirectional attention is not supported".into(),
            ));
        }
        // mlx-lm builds attention for any other name but gives it an `ArraysCache` (and
        // the mixer's mask), which it cannot run: refused here.
        let kinds = types
            .iter()
            .map(|t| match t.as_str() {
                FULL => Ok(Kind::Full),
                SLIDING => Ok(Kind::Sliding),
                CONV => Ok(Kind::Conv),
                other => Err(err(format!(
                    "key `layer_types`: unknown layer type {other:?} (expected {FULL:?}, {SLIDING:?} or {CONV:?})"
                ))),
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let act = Act::parse(&args.hidden_activation).ok_or_else(|| {
            err(format!(
                "key `hidden_activation`: unsupported Gear activation {:?}",
                args.hidden_activation
            ))
        })?;
        let (h, hd) = (args.num_attention_heads, args.head_dim);
        let kv = args.num_key_value_heads.unwrap_or(h);
        if h <= 0 || kv <= 0 || h % kv != 0 || hd <= 0 || hd % 2 != 0 {
            return Err(err(format!(
                "`num_attention_heads` ({h}) must be a positive multiple of \
                 `num_key_value_heads` ({kv}) and `head_dim` ({hd}) positive and even"
            )));
        }
        if kinds.contains(&Kind::Conv) && args.conv_l_cache < 1 {
            return Err(err(format!("key `conv_L_cache` ({}) must be positive", args.conv_l_cache)));
        }
        if kinds.contains(&Kind::Sliding) && args.sliding_window <= 0 {
            return Err(err(format!("key `sliding_window` ({}) must be positive", args.sliding_window)));
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = kinds
            .iter()
            .map(|&kind| {
                let mixer = match kind {
                    Kind::Conv => Mixer::Conv(Box::new(ConvMixer::new(&args, kv)?)),
                    _ => Mixer::Attention(Box::new(Attention::new(&args, kv, kind == Kind::Sliding)?)),
                };
                Ok(DecoderLayer {
                    mixer,
                    mlp: Mlp {
                        gate_proj: LinearLayer::new(dim, args.intermediate_size, false)?,
                        up_proj: LinearLayer::new(dim, args.intermediate_size, false)?,
                        down_proj: LinearLayer::new(args.intermediate_size, dim, false)?,
                        act,
                    },
                    input_layernorm: GearNorm::new(dim, eps)?,
                    post_attention_layernorm: GearNorm::new(dim, eps)?,
                    pre_feedforward_layernorm: GearNorm::new(dim, eps)?,
                    post_feedforward_layernorm: GearNorm::new(dim, eps)?,
                    kind,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GearModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: GearNorm::new(dim, eps)?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            kinds,
            model,
            lm_head,
        })
    }

    fn first(&self, kind: Kind) -> Option<usize> {
        self.kinds.iter().position(|&k| k == kind)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gear")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let mut x = h.multiply(f64::from(self.args.hidden_size).sqrt())?;
        let n = x.dim(1)?;
        let full_mask = match self.first(Kind::Full) {
            Some(i) => create_attention_mask(n, cache_at(caches, i), None, false)?,
            None => AttnMask::None,
        };
        let sliding_mask = match self.first(Kind::Sliding) {
            Some(i) => create_attention_mask(n, cache_at(caches, i), Some(self.args.sliding_window), false)?,
            None => AttnMask::None,
        };
        let conv_mask = match self.first(Kind::Conv).and_then(|i| caches.get(i)).and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        for (i, (layer, cache)) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?).enumerate() {
            let mask = match layer.kind {
                Kind::Sliding => &sliding_mask,
                _ => &full_mask,
            };
            let conv_mask = conv_mask.clone();
            let forward = move |layer: &DecoderLayer, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>| {
                let normed = layer.input_layernorm.forward(x)?;
                let mixed = match &layer.mixer {
                    Mixer::Attention(at) => at.forward(&normed, mask, cache)?,
                    Mixer::Conv(cm) => cm.forward(&normed, conv_mask.as_ref(), recurrent_state(cache, i, "conv_mixer")?)?,
                };
                let h = x.add(&layer.post_attention_layernorm.forward(&mixed)?)?;
                let f = layer.mlp.forward(&layer.pre_feedforward_layernorm.forward(&h)?)?;
                h.add(&layer.post_feedforward_layernorm.forward(&f)?)
            };
            x = mlx_nn::checkpoint::layer(layer, &x, mask, cache, forward)?;
        }
        let out = m.norm.forward(&x)?;
        let scale = match softcap(self.args.final_logit_softcapping) {
            Some(cap) => LogitScale::SoftCap(cap),
            None => LogitScale::None,
        };
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, scale)
    }

    /// `make_cache`: a `KVCache` per full layer, a `RotatingKVCache(sliding_window)` per
    /// sliding one, an `ArraysCache(2)` per convolutional mixer.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.kinds
            .iter()
            .map(|k| match k {
                Kind::Full => CacheSpec::Standard,
                Kind::Sliding => CacheSpec::Rotating {
                    max_size: self.args.sliding_window,
                    keep: 0,
                },
                Kind::Conv => CacheSpec::Arrays { size: 2 },
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Each mixer's two `nn.Conv1d` draw one key each for their weights.
    fn extra_init_key_draws(&self) -> usize {
        2 * self.kinds.iter().filter(|&&k| k == Kind::Conv).count()
    }

    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let tied = self.args.tie_word_embeddings;
        weights
            .into_iter()
            .filter(|(k, _)| {
                !(k.contains("rotary_emb.inv_freq") || k.ends_with("embed_scale") || (tied && k == "lm_head.weight"))
            })
            .map(|(k, v)| {
                let v = if (k.ends_with("key_conv.weight") || k.ends_with("value_conv.weight"))
                    && v.ndim() == 3
                    && v.dim(1)? == 1
                {
                    v.transpose(Some(&[0, 2, 1]))?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect()
    }
}

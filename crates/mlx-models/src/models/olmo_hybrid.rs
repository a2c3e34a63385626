//! OLMo Hybrid (`olmo_hybrid`), following `mlx_lm/models/olmo_hybrid.py`: by
//! `layer_types` (default: every fourth layer `full_attention`, the others
//! `linear_attention`) a gated delta-net layer (pre-norm; separate q/k/v projections
//! each through its own depthwise convolution, L2-normalized q/k, the gated delta rule
//! with beta doubled by `linear_allow_neg_eigval`, a gated RMS norm per value head) over
//! an `ArraysCache(4)`, or an OLMo 2 attention layer (RMS q/k norms over the whole
//! projections, RoPE at `rope_theta` unless it is null, post-norms on both residual
//! branches) over a `KVCache`; SiLU-gated MLPs; the head tied by `tie_word_embeddings`.
//! Like mlx-lm's, the convolutions take no padding mask (only the recurrence does), so
//! prompts of a batch must not be padded. `sanitize` drops a tied head and moves HF's
//! convolution weights to MLX's layout.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::config_error;
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::Mlp;
use super::recurrent::{recurrent_state, DepthwiseConv};
use super::{batch_len, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::activations::silu;
use mlx_nn::cache::ArraysState;
use mlx_nn::gated_delta::{compute_g, gated_delta_ops, normalize_qk, precise_swiglu};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Param,
    RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::{Map, Value};

const LINEAR: &str = "linear_attention";

fn default_layer_norm_eps() -> f64 {
    1e-5
}
fn default_rope_theta() -> Option<f64> {
    Some(10000.0)
}

/// config.json keys read by OLMo Hybrid.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    /// Required, but may be null (then `num_attention_heads`).
    #[serde(deserialize_with = "Option::deserialize")]
    pub num_key_value_heads: Option<i32>,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub max_position_embeddings: i32,
    pub linear_num_key_heads: i32,
    pub linear_num_value_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    pub linear_allow_neg_eigval: bool,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub rope_parameters: Option<Map<String, Value>>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: Option<f64>,
}

/// `__post_init__`'s resolved values.
struct Resolved {
    n_kv_heads: i32,
    head_dim: i32,
    rope_theta: Option<f64>,
    linear: Vec<bool>,
}

fn resolve(a: &ModelArgs) -> crate::Result<Resolved> {
    let err = |m: String| config_error("olmo_hybrid", m);
    let nh = a.num_attention_heads;
    if nh <= 0 {
        return Err(err(format!("key `num_attention_heads` ({nh}) must be positive")));
    }
    let n_kv_heads = a.num_key_value_heads.unwrap_or(nh);
    if n_kv_heads <= 0 || nh % n_kv_heads != 0 {
        return Err(err(format!(
            "`num_attention_heads` ({nh}) must be a positive multiple of \
             `num_key_value_heads` ({n_kv_heads})"
        )));
    }
    let head_dim = a.head_dim.unwrap_or(a.hidden_size / nh);
    let rope_theta = match &a.rope_parameters {
        None => a.rope_theta,
        Some(p) => match p.get("rope_theta") {
            None => Some(10000.0),
            Some(Value::Null) => None,
            Some(v) => Some(v.as_f64().ok_or_else(|| {
                err(format!("key `rope_parameters.rope_theta` must be a number, got {v}"))
            })?),
        },
    };
    if rope_theta.is_some() && (head_dim <= 0 || head_dim % 2 != 0) {
        return Err(err(format!("key `head_dim` ({head_dim}) must be positive and even")));
    }
    let n = a.num_hidden_layers;
    if n < 0 {
        return Err(err("key `num_hidden_layers` must not be negative".into()));
    }
    let linear: Vec<bool> = match &a.layer_types {
        Some(t) => t.iter().map(|t| t == LINEAR).collect(),
        None => (0..n).map(|i| i % 4 != 3).collect(),
    };
    let (nk, nv) = (a.linear_num_key_heads, a.linear_num_value_heads);
    if linear.iter().any(|&l| l) {
        if nk <= 0 || nv <= 0 || nv % nk != 0 {
            return Err(err(format!(
                "`linear_num_value_heads` ({nv}) must be a positive multiple of \
                 `linear_num_key_heads` ({nk})"
            )));
        }
        if a.linear_key_head_dim <= 0 || a.linear_value_head_dim <= 0 {
            return Err(err(format!(
                "`linear_key_head_dim` ({}) and `linear_value_head_dim` ({}) must be positive",
                a.linear_key_head_dim, a.linear_value_head_dim
            )));
        }
        if a.linear_conv_kernel_dim < 2 {
            return Err(err(format!(
                "key `linear_conv_kernel_dim` ({}) must be at least 2",
                a.linear_conv_kernel_dim
            )));
        }
    }
    Ok(Resolved {
        n_kv_heads,
        head_dim,
        rope_theta,
        linear,
    })
}

/// `RMSNormGated`: RMS norm, then `silu(gate) * normed` in float32.
#[derive(Debug)]
struct GatedRmsNorm {
    weight: Param,
    eps: f32,
}
impl_module!(GatedRmsNorm { weight });

/// `GatedDeltaNet`.
#[derive(Debug)]
struct GatedDeltaNet {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    a_proj: LinearLayer,
    b_proj: LinearLayer,
    g_proj: LinearLayer,
    o_proj: LinearLayer,
    q_conv1d: DepthwiseConv,
    k_conv1d: DepthwiseConv,
    v_conv1d: DepthwiseConv,
    a_log: Param,
    dt_bias: Param,
    o_norm: GatedRmsNorm,
    nk: i32,
    nv: i32,
    dk: i32,
    dv: i32,
    kernel: i32,
    neg_eigval: bool,
}
impl_module!(GatedDeltaNet {
    q_proj,
    k_proj,
    v_proj,
    a_proj,
    b_proj,
    g_proj,
    o_proj,
    q_conv1d,
    k_conv1d,
    v_conv1d,
    a_log as "A_log",
    dt_bias,
    o_norm
});

impl GatedDeltaNet {
    fn new(a: &ModelArgs) -> crate::Result<GatedDeltaNet> {
        let (nk, nv, dk, dv) = (
            a.linear_num_key_heads,
            a.linear_num_value_heads,
            a.linear_key_head_dim,
            a.linear_value_head_dim,
        );
        let (d, key_dim, value_dim, kern) = (a.hidden_size, nk * dk, nv * dv, a.linear_conv_kernel_dim);
        let zeros = |s: &[i32]| ops::zeros(s, Dtype::Float32);
        let conv = |c: i32| DepthwiseConv::zeros(c, kern, false);
        Ok(GatedDeltaNet {
            q_proj: LinearLayer::new(d, key_dim, false)?,
            k_proj: LinearLayer::new(d, key_dim, false)?,
            v_proj: LinearLayer::new(d, value_dim, false)?,
            a_proj: LinearLayer::new(d, nv, false)?,
            b_proj: LinearLayer::new(d, nv, false)?,
            g_proj: LinearLayer::new(d, value_dim, false)?,
            o_proj: LinearLayer::new(value_dim, d, false)?,
            q_conv1d: conv(key_dim)?,
            k_conv1d: conv(key_dim)?,
            v_conv1d: conv(value_dim)?,
            a_log: Param::new(zeros(&[nv])?),
            dt_bias: Param::new(zeros(&[nv])?),
            o_norm: GatedRmsNorm {
                weight: Param::new(ops::ones(&[dv], Dtype::Float32)?),
                eps: a.layer_norm_epsilon as f32,
            },
            nk,
            nv,
            dk,
            dv,
            kernel: kern,
            neg_eigval: a.linear_allow_neg_eigval,
        })
    }

    /// `_apply_conv1d`: the convolution over the cached window (zeros without one) and
    /// `x`, the window's last `kernel - 1` positions kept in `slot`.
    fn conv(
        &self,
        x: &Array,
        conv: &DepthwiseConv,
        cache: Option<&mut ArraysState>,
        slot: usize,
    ) -> Result<Array> {
        let (b, s) = batch_len(x)?;
        let n_keep = self.kernel - 1;
        let channels = x.dim(-1)?;
        let state = cache.as_deref().and_then(|c| c.get(slot)).cloned();
        let padded = match state {
            Some(st) => ops::concatenate(&[&st, x], 1)?,
            None => ops::concatenate(&[&ops::zeros(&[b, n_keep, channels], x.dtype())?, x], 1)?,
        };
        if let Some(c) = cache {
            let t = n_keep + s;
            c.set(slot, padded.slice_axis(1, t - n_keep, t)?.contiguous()?)?;
        }
        silu(&conv.apply(&padded)?)
    }

    fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        mut cache: Option<&mut ArraysState>,
    ) -> Result<Array> {
        let (b, s) = batch_len(x)?;
        let q = self.q_proj.forward(x)?;
        let k = self.k_proj.forward(x)?;
        let v = self.v_proj.forward(x)?;
        let q = self.conv(&q, &self.q_conv1d, cache.as_deref_mut(), 0)?;
        let k = self.conv(&k, &self.k_conv1d, cache.as_deref_mut(), 1)?;
        let v = self.conv(&v, &self.v_conv1d, cache.as_deref_mut(), 2)?;
        let q = q.reshape(&[b, s, self.nk, self.dk])?;
        let k = k.reshape(&[b, s, self.nk, self.dk])?;
        let v = v.reshape(&[b, s, self.nv, self.dv])?;
        let (q, k) = normalize_qk(&q, &k, f64::from(self.dk).powf(-0.5), 1e-6)?;
        let state = cache.as_deref().and_then(|c| c.get(3)).cloned();
        // gated_delta_update with allow_neg_eigval: beta in [0, 2].
        let mut beta = self.b_proj.forward(x)?.sigmoid()?;
        if self.neg_eigval {
            beta = beta.multiply(2.0)?;
        }
        let g = compute_g(&self.a_log, &self.a_proj.forward(x)?, &self.dt_bias)?;
        let (out, state) = gated_delta_ops(&q, &k, &v, &g, &beta, state.as_ref(), mask)?;
        if let Some(c) = cache {
            c.set(3, state)?;
            c.advance(s)?;
        }
        let gate = self.g_proj.forward(x)?.reshape(&[-1, self.dv])?;
        let out = out.reshape(&[-1, self.dv])?;
        let normed = fast::rms_norm(&out, Some(&self.o_norm.weight), self.o_norm.eps)?;
        let out = precise_swiglu(&out, &gate, &normed)?.reshape(&[b, s, -1])?;
        self.o_proj.forward(&out)
    }
}

/// `LinearAttentionDecoderLayer`.
#[derive(Debug)]
struct LinearLayerBlock {
    linear_attn: GatedDeltaNet,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(LinearLayerBlock {
    linear_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

/// `FullAttentionDecoderLayer`: post-norms on both branches, no input norm.
#[derive(Debug)]
struct FullLayerBlock {
    self_attn: Attention,
    mlp: Mlp,
    post_attention_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
}
impl_module!(FullLayerBlock {
    self_attn,
    mlp,
    post_attention_layernorm,
    post_feedforward_layernorm
});

/// One layer of either kind.
#[derive(Debug)]
enum Layer {
    Linear(Box<LinearLayerBlock>),
    Full(Box<FullLayerBlock>),
}
enum_module!(Layer {
    Linear => "",
    Full => "",
});

impl Layer {
    fn is_linear(&self) -> bool {
        matches!(self, Layer::Linear(_))
    }
}

/// `OlmoHybridModel`.
#[derive(Debug)]
struct OlmoHybridModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<Layer>,
    norm: RmsNorm,
}
impl_module!(OlmoHybridModel {
    embed_tokens,
    layers,
    norm
});

/// OLMo Hybrid with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: OlmoHybridModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

/// `MLP`: `down(silu(gate(x)) * up(x))` with mlx.nn's `silu` (not the fused `swiglu`).
fn mlp(a: &ModelArgs) -> crate::Result<Mlp> {
    Ok(Mlp::new(a.hidden_size, a.intermediate_size, false)?.with_activation(silu))
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let r = resolve(&args)?;
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = r
            .linear
            .iter()
            .map(|&linear| {
                Ok(if linear {
                    Layer::Linear(Box::new(LinearLayerBlock {
                        linear_attn: GatedDeltaNet::new(&args)?,
                        mlp: mlp(&args)?,
                        input_layernorm: RmsNorm::new(dim, eps)?,
                        post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    }))
                } else {
                    let d = AttentionDims {
                        dim,
                        n_heads: args.num_attention_heads,
                        n_kv_heads: r.n_kv_heads,
                        head_dim: r.head_dim,
                        qkv_bias: args.attention_bias,
                        o_bias: args.attention_bias,
                    };
                    let rope = match r.rope_theta {
                        Some(base) => initialize_rope(
                            r.head_dim,
                            base,
                            false,
                            None,
                            Some(args.max_position_embeddings),
                        )?,
                        None => Rope::Identity,
                    };
                    let self_attn = Attention::new(d, rope, f64::from(r.head_dim).powf(-0.5))?
                        .with_qk_norms(NormAt::Projection, |n| {
                            Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?))
                        })?;
                    Layer::Full(Box::new(FullLayerBlock {
                        self_attn,
                        mlp: mlp(&args)?,
                        post_attention_layernorm: RmsNorm::new(dim, eps)?,
                        post_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                    }))
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = OlmoHybridModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "olmo_hybrid")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let fa_idx = m.layers.iter().position(|l| !l.is_linear());
        let lin_idx = m.layers.iter().position(|l| l.is_linear());
        let fa_mask = match fa_idx {
            Some(i) => {
                mlx_nn::cache::create_attention_mask(n, super::cache_at(caches, i), None, false)?
            }
            None => AttnMask::None,
        };
        let ssm_mask = match lin_idx.and_then(|i| caches.get(i)).and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let ssm_mask = ssm_mask.clone();
            let forward = move |layer: &Layer,
                                x: &Array,
                                mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| match layer {
                Layer::Linear(l) => {
                    let state = recurrent_state(cache, i, "linear-attention")?;
                    let h = x.add(&l.linear_attn.forward(
                        &l.input_layernorm.forward(x)?,
                        ssm_mask.as_ref(),
                        state,
                    )?)?;
                    h.add(&l.mlp.forward(&l.post_attention_layernorm.forward(&h)?, None)?)
                }
                Layer::Full(f) => {
                    let a = f
                        .self_attn
                        .forward(x, mask, cache, None, Default::default())?;
                    let h = x.add(&f.post_attention_layernorm.forward(&a)?)?;
                    h.add(&f.post_feedforward_layernorm.forward(&f.mlp.forward(&h, None)?)?)
                }
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &fa_mask, cache, forward)?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: an `ArraysCache(4)` per linear-attention layer, a `KVCache` per
    /// attention layer.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .iter()
            .map(|l| {
                if l.is_linear() {
                    CacheSpec::Arrays { size: 4 }
                } else {
                    CacheSpec::Standard
                }
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    /// The convolutions take no padding mask (as mlx-lm's): padded rows would reach
    /// their windows.
    fn padded_prefill_is_exact(&self) -> bool {
        false
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Each linear-attention layer's three `nn.Conv1d` draw one key each.
    fn extra_init_key_draws(&self) -> usize {
        3 * self.model.layers.iter().filter(|l| l.is_linear()).count()
    }

    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = weights;
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        weights
            .into_iter()
            .map(|(k, v)| {
                let v = if k.contains("conv1d.weight") && v.ndim() == 3 && v.dim(-1)? != 1 {
                    v.moveaxis(2, 1)?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect()
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            match layer {
                Layer::Linear(l) => l.mlp.fuse()?,
                Layer::Full(f) => {
                    f.self_attn.fuse()?;
                    f.mlp.fuse()?;
                }
            }
        }
        Ok(())
    }
}


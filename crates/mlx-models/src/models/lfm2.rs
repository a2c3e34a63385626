//! LFM2, following `mlx_lm/models/lfm2.py`: gated short-convolution layers (their
//! convolution window in an [`ArraysState`] of one slot) mixed with attention layers
//! (per-head q/k norms), SwiGLU feed-forward, the embedding as head.
use super::config_error;
use super::recurrent::{
    conv_window_or_zeros, keep_conv_window, mask_positions, recurrent_state, DepthwiseConv,
};
use super::{batch_len, layer_caches, rope_cache, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::activations::swiglu;
use mlx_nn::cache::{create_attention_mask, ArraysState};
use mlx_nn::module::join;
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache, LinearLayer,
    Param, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

fn default_rope_theta() -> f64 {
    1_000_000.0
}

/// config.json keys read by LFM2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: Option<i32>,
    pub max_position_embeddings: i32,
    pub norm_eps: f64,
    pub conv_bias: bool,
    #[serde(rename = "conv_L_cache")]
    pub conv_l_cache: i32,
    pub block_dim: i32,
    pub block_multiple_of: i32,
    pub block_ffn_dim_multiplier: Option<f64>,
    pub block_auto_adjust_ff_dim: bool,
    #[serde(default)]
    pub block_ff_dim: Option<i32>,
    #[serde(default)]
    pub intermediate_size: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub full_attn_idxs: Option<Vec<i32>>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

impl ModelArgs {
    /// `__post_init__`: the feed-forward size, `rope_parameters.rope_theta`, the
    /// key/value heads and the attention layers.
    fn resolve(mut self) -> crate::Result<ModelArgs> {
        if self.block_ff_dim.is_none() {
            self.block_ff_dim = Some(self.intermediate_size.ok_or_else(|| {
                config_error("lfm2", 
                    "config must specify either `block_ff_dim` or `intermediate_size`".into(),
                )
            })?);
        }
        if let Some(t) = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
        {
            self.rope_theta = t.as_f64().ok_or_else(|| {
                config_error("lfm2", "key `rope_parameters.rope_theta` is not a number".into())
            })?;
        }
        if self.num_key_value_heads.is_none() {
            self.num_key_value_heads = Some(self.num_attention_heads);
        }
        if self.full_attn_idxs.is_none() {
            let types = self.layer_types.as_ref().ok_or_else(|| {
                config_error("lfm2", "config must specify either `full_attn_idxs` or `layer_types`".into())
            })?;
            let idxs = types.iter().enumerate();
            self.full_attn_idxs = Some(
                idxs.filter(|(_, t)| *t == "full_attention")
                    .map(|(i, _)| i as i32)
                    .collect(),
            );
        }
        if self.num_attention_heads <= 0 {
            return Err(config_error("lfm2", "num_attention_heads must be positive".into()));
        }
        Ok(self)
    }

    fn is_attention(&self, layer: i32) -> bool {
        self.full_attn_idxs
            .as_ref()
            .is_some_and(|idx| idx.contains(&layer))
    }
}

/// Attention with per-head q/k RMS norms.
#[derive(Debug)]
struct Attention {
    q_layernorm: RmsNorm,
    k_layernorm: RmsNorm,
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    out_proj: LinearLayer,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
}
impl_module!(Attention {
    q_layernorm,
    k_layernorm,
    q_proj,
    k_proj,
    v_proj,
    out_proj
});

impl Attention {
    fn new(a: &ModelArgs) -> crate::Result<Attention> {
        let dim = a.hidden_size;
        let nh = a.num_attention_heads;
        let nkv = a.num_key_value_heads.unwrap_or(nh);
        let hd = dim / nh;
        Ok(Attention {
            q_layernorm: RmsNorm::new(hd, a.norm_eps)?,
            k_layernorm: RmsNorm::new(hd, a.norm_eps)?,
            q_proj: LinearLayer::new(dim, nh * hd, false)?,
            k_proj: LinearLayer::new(dim, nkv * hd, false)?,
            v_proj: LinearLayer::new(dim, nkv * hd, false)?,
            out_proj: LinearLayer::new(nh * hd, dim, false)?,
            rope: Rope::new(hd, false, a.rope_theta, 1.0),
            n_heads: nh,
            n_kv_heads: nkv,
            scale: (hd as f64).powf(-0.5),
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let (q, k, v) = (
            self.q_proj.forward(x)?,
            self.k_proj.forward(x)?,
            self.v_proj.forward(x)?,
        );
        let heads = |t: &Array, n: i32| t.reshape(&[b, l, n, -1]);
        let t = |t: Array| t.transpose(Some(&[0, 2, 1, 3]));
        let queries = t(self.q_layernorm.forward(&heads(&q, self.n_heads)?)?)?;
        let keys = t(self.k_layernorm.forward(&heads(&k, self.n_kv_heads)?)?)?;
        let values = t(heads(&v, self.n_kv_heads)?)?;
        let (queries, fetch) = rope_cache(&queries, &keys, values, &self.rope, cache)?;
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.out_proj
            .forward(&out.transpose(Some(&[0, 2, 1, 3]))?.reshape(&[b, l, -1])?)
    }
}

/// The gated short convolution: `out_proj(C * conv(B * x))`.
#[derive(Debug)]
struct ShortConv {
    conv: DepthwiseConv,
    in_proj: LinearLayer,
    out_proj: LinearLayer,
    l_cache: i32,
}
impl_module!(ShortConv {
    conv,
    in_proj,
    out_proj
});

impl ShortConv {
    fn new(a: &ModelArgs) -> crate::Result<ShortConv> {
        let h = a.hidden_size;
        Ok(ShortConv {
            conv: DepthwiseConv::zeros(h, a.conv_l_cache, a.conv_bias)?,
            in_proj: LinearLayer::new(h, 3 * h, a.conv_bias)?,
            out_proj: LinearLayer::new(h, h, a.conv_bias)?,
            l_cache: a.conv_l_cache,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: Option<&Array>,
        cache: Option<&mut ArraysState>,
    ) -> Result<Array> {
        let parts = self.in_proj.forward(x)?.split_sections(3, -1)?;
        let (bg, c, xx) = (&parts[0], &parts[1], &parts[2]);
        let mut bx = mask_positions(bg.multiply(xx)?, mask)?;
        let n_keep = self.l_cache - 1;
        match cache {
            Some(cache) => {
                let (b, c) = (bx.dim(0)?, bx.dim(2)?);
                let state = conv_window_or_zeros(Some(cache), b, n_keep, c, bx.dtype())?;
                bx = ops::concatenate(&[&state, &bx], 1)?;
                let t = xx.dim(1)?;
                keep_conv_window(cache, &bx, n_keep, t, false)?;
                cache.advance(t)?;
            }
            None => bx = bx.pad(&[1], &[n_keep], &[0], None, "constant")?,
        }
        let conv_out = self.conv.apply(&bx)?;
        self.out_proj.forward(&c.multiply(&conv_out)?)
    }
}

/// The SwiGLU feed-forward (`w2(silu(w1(x)) * w3(x))`).
#[derive(Debug)]
pub(crate) struct Mlp {
    w1: LinearLayer,
    w3: LinearLayer,
    w2: LinearLayer,
}
impl_module!(Mlp { w1, w3, w2 });

impl Mlp {
    fn new(a: &ModelArgs) -> crate::Result<Mlp> {
        let mut ff = a.block_ff_dim.unwrap_or_default();
        if a.block_auto_adjust_ff_dim {
            ff = (2.0 * ff as f64 / 3.0) as i32;
            if let Some(m) = a.block_ffn_dim_multiplier {
                ff = (m * ff as f64) as i32;
            }
            let k = a.block_multiple_of;
            if k <= 0 {
                return Err(config_error("lfm2", format!(
                    "block_multiple_of must be positive, got {k}"
                )));
            }
            ff = k * ((ff + k - 1) / k);
        }
        let dim = a.block_dim;
        Ok(Mlp {
            w1: LinearLayer::new(dim, ff, false)?,
            w3: LinearLayer::new(dim, ff, false)?,
            w2: LinearLayer::new(ff, dim, false)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        self.w2
            .forward(&swiglu(&self.w1.forward(x)?, &self.w3.forward(x)?)?)
    }
}

/// A layer's feed-forward block: LFM2's, or LFM2-MoE's SwiGLU (dense layers) and
/// sigmoid-routed experts.
#[derive(Debug)]
pub(crate) enum FeedForward {
    /// LFM2's `w1` / `w3` / `w2`.
    Lfm2(Box<Mlp>),
    /// `gate_proj` / `up_proj` / `down_proj`.
    Glu(Box<super::mlp::Mlp>),
    /// Routed experts.
    Moe(Box<super::lfm2_moe::SparseMoe>),
}

enum_module!(FeedForward { Lfm2 => "", Glu => "", Moe => "" });

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Lfm2(m) => m.forward(x),
            FeedForward::Glu(m) => m.forward(x, None),
            FeedForward::Moe(m) => m.forward(x),
        }
    }
}

/// A layer's operator.
#[derive(Debug)]
enum Operator {
    Conv(Box<ShortConv>),
    Attention(Box<Attention>),
}

enum_module!(Operator { Conv => "conv", Attention => "self_attn" });

/// One decoder layer.
#[derive(Debug)]
struct DecoderLayer {
    op: Operator,
    feed_forward: FeedForward,
    operator_norm: RmsNorm,
    ffn_norm: RmsNorm,
}
impl_module!(DecoderLayer {
    op as "",
    feed_forward,
    operator_norm,
    ffn_norm
});

/// The decoder stack.
#[derive(Debug)]
pub struct Lfm2Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    embedding_norm: RmsNorm,
}
impl_module!(Lfm2Model {
    embed_tokens,
    layers,
    embedding_norm
});

/// LFM2 (its head is the embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Lfm2Model,
    fa_idx: usize,
    conv_idx: usize,
    /// LFM2-MoE's expert count (its `sanitize` stacks the experts).
    n_experts: Option<i32>,
}

impl mlx_nn::Module for Model {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.model.visit_params(&join(prefix, "model"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.model.visit_params_mut(&join(prefix, "model"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut mlx_nn::module::QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.model.visit_quantizable_mut(&join(prefix, "model"), f)
    }
    /// LFM2-MoE's `cast_predicate`: the routers' `expert_bias` keeps its dtype (LFM2
    /// has no such parameter).
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        super::deepseek_v3::cast_all_except(self, dtype, "expert_bias")
    }
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        Model::with_feed_forward(args, &|a, _| Ok(FeedForward::Lfm2(Box::new(Mlp::new(a)?))))
    }

    /// Builds the model with layer `i`'s feed-forward block from `feed_forward(args, i)`.
    pub(crate) fn with_feed_forward(
        args: ModelArgs,
        feed_forward: &dyn Fn(&ModelArgs, i32) -> crate::Result<FeedForward>,
    ) -> crate::Result<Model> {
        let args = args.resolve()?;
        let n = args.num_hidden_layers;
        let first_attn = args
            .full_attn_idxs
            .as_ref()
            .and_then(|v| v.first().copied());
        let fa_idx = match first_attn {
            Some(i) if (0..n).contains(&i) => i as usize,
            _ => {
                return Err(config_error("lfm2", format!(
                    "no attention layer among the {n} layers (`full_attn_idxs` / `layer_types`): \
                     mlx-lm masks attention with the first one's cache"
                )))
            }
        };
        let conv_idx = (0..n).take_while(|&i| args.is_attention(i)).count();
        if conv_idx as i32 >= n {
            return Err(config_error("lfm2", 
                "every layer is an attention layer: mlx-lm needs a convolution layer".into(),
            ));
        }
        let eps = args.norm_eps;
        let layers = (0..n)
            .map(|i| {
                Ok(DecoderLayer {
                    op: if args.is_attention(i) {
                        Operator::Attention(Box::new(Attention::new(&args)?))
                    } else {
                        Operator::Conv(Box::new(ShortConv::new(&args)?))
                    },
                    feed_forward: feed_forward(&args, i)?,
                    operator_norm: RmsNorm::new(args.hidden_size, eps)?,
                    ffn_norm: RmsNorm::new(args.hidden_size, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Lfm2Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            embedding_norm: RmsNorm::new(args.hidden_size, eps)?,
        };
        Ok(Model {
            args,
            model,
            fa_idx,
            conv_idx,
            n_experts: None,
        })
    }

    /// LFM2-MoE: `sanitize` also renames and stacks `n` experts per layer.
    pub(crate) fn with_experts(mut self, n: i32) -> Model {
        self.n_experts = Some(n);
        self
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "lfm2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let attn_mask =
            create_attention_mask(n, caches.get(self.fa_idx).map(|c| c.as_ref()), None, false)?;
        let conv_mask = match caches.get(self.conv_idx).and_then(|c| c.arrays()) {
            Some(state) => state.make_mask(n)?,
            None => None,
        };
        for (i, (layer, cache)) in m
            .layers
            .iter()
            .zip(layer_caches(caches, m.layers.len())?)
            .enumerate()
        {
            let conv_mask = conv_mask.clone();
            let forward = move |layer: &DecoderLayer,
                                h: &Array,
                                attn_mask: &AttnMask,
                                cache: Option<&mut dyn KvCache>| {
                let x = layer.operator_norm.forward(h)?;
                let r = match &layer.op {
                    Operator::Attention(a) => a.forward(&x, attn_mask, cache)?,
                    Operator::Conv(c) => {
                        let state = recurrent_state(cache, i, "convolution")?;
                        c.forward(&x, conv_mask.as_ref(), state)?
                    }
                };
                let hh = h.add(&r)?;
                hh.add(&layer.feed_forward.forward(&layer.ffn_norm.forward(&hh)?)?)
            };
            h = mlx_nn::checkpoint::layer(layer, &h, &attn_mask, cache, forward)?;
        }
        let out = m.embedding_norm.forward(&h)?;
        m.embed_tokens.as_linear(&out)
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model
            .layers
            .iter()
            .map(|l| match l.op {
                Operator::Conv(_) => CacheSpec::Arrays { size: 1 },
                Operator::Attention(_) => CacheSpec::Standard,
            })
            .collect()
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Each short convolution's `nn.Conv1d` draws one key for its weight.
    fn extra_init_key_draws(&self) -> usize {
        let layers = self.model.layers.iter();
        layers.filter(|l| matches!(l.op, Operator::Conv(_))).count()
    }

    /// Convolution weights stored `[channels, 1, kernel]` move to MLX's
    /// `[channels, kernel, 1]`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let weights: Weights = weights
            .into_iter()
            .map(|(k, v)| {
                let s = v.shape();
                let v = if k.contains("conv.weight") && s.len() == 3 && s[2] > s[1] {
                    v.transpose(Some(&[0, 2, 1]))?
                } else {
                    v
                };
                Ok((k, v))
            })
            .collect::<crate::Result<_>>()?;
        match self.n_experts {
            Some(n) => super::lfm2_moe::sanitize(weights, n, self.args.num_hidden_layers),
            None => Ok(weights),
        }
    }
}

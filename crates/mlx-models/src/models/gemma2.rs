//! Gemma 2, following `mlx_lm/models/gemma2.py` (soft-capped attention written out
//! with plain ops, `1 + weight` RMS norms, scaled embeddings, soft-capped logits).
use super::lm::{masked_layers, Stack};
use super::{batch_len, cache_at, merge_heads, split_heads, Architecture};
use crate::config::parse_args;
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::activations::gelu_approx;
use mlx_nn::attention::mask_scores;
use mlx_nn::cache::{create_attention_mask, RopePosition};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, KvFetch, LinearLayer, Param, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Gemma 2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default = "default_attn_softcap")]
    pub attn_logit_softcapping: f64,
    #[serde(default = "default_final_softcap")]
    pub final_logit_softcapping: f64,
    #[serde(default = "default_query_pre_attn_scalar")]
    pub query_pre_attn_scalar: f64,
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_attn_softcap() -> f64 {
    50.0
}
fn default_final_softcap() -> f64 {
    30.0
}
fn default_query_pre_attn_scalar() -> f64 {
    144.0
}

/// Gemma's RMS norm: `rms_norm(x, 1 + weight, eps)` (or another `offset + weight`).
#[derive(Debug)]
pub struct RmsNorm {
    weight: Param,
    eps: f32,
    /// Added to the weight (1 for Gemma; PLaMo 3's post-norms use 1/5 and 1/5^1.5).
    offset: f64,
}
impl_module!(RmsNorm { weight });

impl RmsNorm {
    /// A norm with a zero weight (the checkpoint stores `weight`, applied as `1 + weight`).
    pub fn new(dims: i32, eps: f64) -> crate::Result<RmsNorm> {
        RmsNorm::with_offset(dims, eps, 1.0)
    }

    /// A norm applied as `rms_norm(x, weight + offset, eps)` (PLaMo 3's `RMSNorm`).
    pub fn with_offset(dims: i32, eps: f64, offset: f64) -> crate::Result<RmsNorm> {
        Ok(RmsNorm {
            weight: Param::new(ops::ones(&[dims], Dtype::Float32)?),
            eps: eps as f32,
            offset,
        })
    }

    /// The weight (applied as `offset + weight`), mutably (AWQ, on Gemma's offset of 1).
    pub(crate) fn weight_mut(&mut self) -> &mut Param {
        &mut self.weight
    }

    /// `mx.fast.rms_norm(x, offset + weight, eps)`, the offset in the weight's dtype.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let w = Array::weak_scalar(mlx_array::Scalar::Float(self.offset), self.weight.dtype())?
            .add(&self.weight)?;
        fast::rms_norm(x, Some(&w), self.eps)
    }
}

/// Self-attention with logit soft-capping.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    repeats: i32,
    head_dim: i32,
    scale: f64,
    softcap: f64,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj
});

impl Attention {
    fn new(args: &ModelArgs) -> crate::Result<Attention> {
        let (dim, n_heads, n_kv_heads, head_dim) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        );
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n_heads * head_dim, false)?,
            k_proj: LinearLayer::new(dim, n_kv_heads * head_dim, false)?,
            v_proj: LinearLayer::new(dim, n_kv_heads * head_dim, false)?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, false)?,
            rope: Rope::new(head_dim, args.rope_traditional, args.rope_theta, 1.0),
            n_heads,
            n_kv_heads,
            repeats: n_heads / n_kv_heads,
            head_dim,
            scale: 1.0 / args.query_pre_attn_scalar.powf(0.5),
            softcap: args.attn_logit_softcapping,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let queries = split_heads(&self.q_proj.forward(x)?, b, l, self.n_heads)?;
        let keys = split_heads(&self.k_proj.forward(x)?, b, l, self.n_kv_heads)?;
        let values = split_heads(&self.v_proj.forward(x)?, b, l, self.n_kv_heads)?;
        let offset = match cache.as_ref() {
            Some(c) => c.rope_offset()?,
            None => RopePosition::Scalar(0),
        };
        let queries = self.rope.forward_at(&queries, offset.as_rope_offset())?;
        let keys = self.rope.forward_at(&keys, offset.as_rope_offset())?;
        let (keys, values) = match cache {
            Some(c) => match mlx_nn::pipeline::update_and_fetch(c, &keys, &values)? {
                KvFetch::Plain { keys, values } => (keys, values),
                KvFetch::Quantized { .. } => {
                    return Err(mlx_array::Error::InvalidArgument(
                        "gemma2 attention does not support quantized KV caches (as in mlx-lm)"
                            .into(),
                    ))
                }
            },
            None => (keys, values),
        };
        let mut queries = queries.multiply(self.scale)?;
        let (mut keys, mut values) = (keys, values);
        if self.repeats > 1 {
            queries = queries.reshape(&[b, self.n_kv_heads, self.repeats, l, self.head_dim])?;
            keys = keys.expand_dims(&[2])?;
            values = values.expand_dims(&[2])?;
        }
        let scores = queries.matmul(&keys.swapaxes(-1, -2)?)?;
        let scores = scores
            .divide(self.softcap)?
            .tanh()?
            .multiply(self.softcap)?;
        // A batch cache's mask is `[B, 1, N, T]`: with grouped heads it needs an axis for
        // the repeats (mlx-lm fails to broadcast it there and cannot batch gemma2).
        let grouped;
        let mask = match mask {
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. }
                if self.repeats > 1 && m.ndim() == 4 =>
            {
                grouped = AttnMask::Array(m.expand_dims(&[2])?);
                &grouped
            }
            other => other,
        };
        let scores = match mask {
            AttnMask::None => scores,
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => mask_scores(&scores, m)?,
            AttnMask::Causal => {
                return Err(mlx_array::Error::InvalidArgument(
                    "gemma2 attention needs an array mask".into(),
                ))
            }
        };
        let scores = scores.softmax(Some(&[-1]), true)?;
        let mut output = scores.matmul(&values)?;
        if self.repeats > 1 {
            output = output.reshape(&[b, self.n_heads, l, self.head_dim])?;
        }
        self.o_proj.forward(&merge_heads(&output, b, l)?)
    }
}

/// The GELU-gated feed-forward block.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
}
impl_module!(Mlp {
    gate_proj,
    down_proj,
    up_proj
});

impl Mlp {
    /// Zero placeholders.
    pub fn new(dim: i32, hidden: i32) -> crate::Result<Mlp> {
        Ok(Mlp {
            gate_proj: LinearLayer::new(dim, hidden, false)?,
            down_proj: LinearLayer::new(hidden, dim, false)?,
            up_proj: LinearLayer::new(dim, hidden, false)?,
        })
    }

    /// gate/up/down, mutably (AWQ).
    pub(crate) fn projections_mut(&mut self) -> [&mut LinearLayer; 3] {
        [&mut self.gate_proj, &mut self.up_proj, &mut self.down_proj]
    }

    /// `down(gelu_approx(gate(x)) * up(x))`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let g = gelu_approx(&self.gate_proj.forward(x)?)?;
        self.down_proj
            .forward(&g.multiply(&self.up_proj.forward(x)?)?)
    }
}

/// One decoder layer with pre and post norms around both sub-blocks.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm,
    post_attention_layernorm,
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = x.add(&self.post_attention_layernorm.forward(&r)?)?;
        let r = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        h.add(&self.post_feedforward_layernorm.forward(&r)?)
    }
}

/// The decoder stack.
pub type GemmaModel = Stack<TransformerBlock, RmsNorm>;

/// Gemma 2 (the head is always the tied embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GemmaModel,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: Attention::new(&args)?,
                    mlp: Mlp::new(dim, args.intermediate_size)?,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    pre_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                    post_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GemmaModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gemma2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let h = h.multiply((self.args.hidden_size as f64).powf(0.5))?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, true)?;
        let h = masked_layers(&m.layers, h, &mask, caches, TransformerBlock::forward)?;
        let out = m.norm.forward(&h)?;
        let scale = LogitScale::SoftCap(self.args.final_logit_softcapping);
        head::logits(&m.embed_tokens, None, &out, scale)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {}

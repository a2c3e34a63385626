//! OLMo 2, following `mlx_lm/models/olmo2.py`: Llama's layers with RMS norms over the
//! whole q and k projections, and norms after (not before) attention and feed-forward.
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::head::{self, LogitScale};
use super::lm::causal_layers;
use super::mlp::Mlp;
use super::{drop_rotary_inv_freq, Architecture, Weights};
use crate::config::{default_true, parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by OLMo 2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}

/// Head size: `head_dim`, else `hidden_size / num_attention_heads`.
pub(crate) fn head_dim(args: &ModelArgs) -> i32 {
    args.head_dim
        .filter(|&d| d > 0)
        .unwrap_or(args.hidden_size / args.num_attention_heads)
}

/// Self-attention with RMS norms over the full q and k projections.
fn attention(args: &ModelArgs, rope: Rope) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = head_dim(args);
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let eps = args.rms_norm_eps;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))?.with_qk_norms(NormAt::Projection, |n| {
        Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?))
    })
}

/// One decoder layer: `h = x + norm(attn(x))`, `out = h + norm(mlp(h))`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    post_attention_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    post_attention_layernorm,
    post_feedforward_layernorm
});

impl TransformerBlock {
    /// One layer whose attention rotates with `rope`.
    pub(crate) fn new(args: &ModelArgs, rope: Rope) -> crate::Result<TransformerBlock> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        Ok(TransformerBlock {
            self_attn: attention(args, rope)?,
            mlp: Mlp::new(dim, args.intermediate_size, args.mlp_bias)?,
            post_attention_layernorm: RmsNorm::new(dim, eps)?,
            post_feedforward_layernorm: RmsNorm::new(dim, eps)?,
        })
    }

    /// Fuses the dense q/k/v and gate/up projections (see `fuse_projections`).
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        self.self_attn.fuse()?;
        self.mlp.fuse()
    }

    pub(crate) fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self
            .post_attention_layernorm
            .forward(
                &self
                    .self_attn
                    .forward(x, mask, cache, None, Extras::default())?,
            )?;
        let h = x.add(&r)?;
        let r = self
            .post_feedforward_layernorm
            .forward(&self.mlp.forward(&h, None)?)?;
        h.add(&r)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Olmo2Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(Olmo2Model {
    embed_tokens,
    layers,
    norm
});

impl Olmo2Model {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let h = self.embed_tokens.forward(inputs)?;
        let h = causal_layers(&self.layers, h, caches, TransformerBlock::forward)?;
        self.norm.forward(&h)
    }
}

/// OLMo 2 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Olmo2Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = initialize_rope(
                    head_dim(&args),
                    args.rope_theta,
                    args.rope_traditional,
                    rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                    args.max_position_embeddings,
                )?;
                TransformerBlock::new(&args, rope)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Olmo2Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, args.hidden_size, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "olmo2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        head::logits(
            &self.model.embed_tokens,
            self.lm_head.as_ref(),
            &out,
            LogitScale::None,
        )
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    /// mlx-lm drops only the rotary buffers (a tied checkpoint's `lm_head.weight` stays,
    /// and loading then refuses it as unexpected, as mlx-lm does).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(drop_rotary_inv_freq(weights))
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model
            .layers
            .iter_mut()
            .try_for_each(TransformerBlock::fuse)
    }
}

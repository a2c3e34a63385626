//! StarCoder2, following `mlx_lm/models/starcoder2.py`: biased projections, layer
//! norms and a GELU feed-forward (`c_fc`, `c_proj`).
use super::lm::Stack;
use super::attention::{Attention, AttentionDims, Extras};
use super::{project_out, Architecture};
use crate::config::{default_true, parse_args};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by StarCoder2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_norm_epsilon")]
    pub norm_epsilon: f64,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_norm_epsilon() -> f64 {
    1e-5
}

fn default_vocab_size() -> i32 {
    49152
}

fn default_rope_theta() -> f64 {
    100000.0
}

/// Every projection biased, head size `hidden_size / num_attention_heads`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.hidden_size / args.num_attention_heads;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: true,
        o_bias: true,
    };
    let rope = Rope::new(head_dim, false, args.rope_theta, 1.0);
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// `c_proj(gelu(c_fc(x)))`.
#[derive(Debug)]
pub struct Mlp {
    c_fc: LinearLayer,
    c_proj: LinearLayer,
}
impl_module!(Mlp { c_fc, c_proj });

/// One decoder layer (pre-norm, layer norms).
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm,
    post_attention_layernorm: LayerNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            Extras::default(),
        )?;
        let up = self
            .mlp
            .c_fc
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        project_out(&self.mlp.c_proj, &activations::gelu(&up)?, Some(&h))
    }
}

/// The decoder stack.
pub type Starcoder2Model = Stack<TransformerBlock, LayerNorm>;

/// StarCoder2 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Starcoder2Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.norm_epsilon);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: attention(&args)?,
                    mlp: Mlp {
                        c_fc: LinearLayer::new(dim, args.intermediate_size, true)?,
                        c_proj: LinearLayer::new(args.intermediate_size, dim, true)?,
                    },
                    input_layernorm: LayerNorm::new(dim, eps, true, true)?,
                    post_attention_layernorm: LayerNorm::new(dim, eps, true, true)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Starcoder2Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: LayerNorm::new(dim, eps, true, true)?,
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
    Ok(Box::new(Model::new(parse_args(config, "starcoder2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches, TransformerBlock::forward, LayerNorm::forward)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
        }
        Ok(())
    }
}

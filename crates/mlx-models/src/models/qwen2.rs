//! Qwen2, following `mlx_lm/models/qwen2.py`.
use super::attention::{Attention, AttentionDims, Extras};
use super::mlp::Mlp;
use super::{cache_at, drop_rotary_inv_freq, layer_caches, Architecture, Weights};
use crate::config::{default_true, parse_args, rope_scaling};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen2.
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
    pub num_key_value_heads: i32,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_max_position_embeddings() -> i32 {
    32768
}
fn default_rope_theta() -> f64 {
    1_000_000.0
}

/// Self-attention with biased q/k/v projections.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.hidden_size / args.num_attention_heads;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: true,
        o_bias: false,
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        args.rope_traditional,
        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
        Some(args.max_position_embeddings),
    )?;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
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
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Qwen2Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(Qwen2Model {
    embed_tokens,
    layers,
    norm
});

impl Qwen2Model {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&h)
    }
}

/// Qwen2 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Qwen2Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: attention(&args)?,
                    mlp: Mlp::new(args.hidden_size, args.intermediate_size, false)?,
                    input_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                    post_attention_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Qwen2Model {
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
    Ok(Box::new(Model::new(parse_args(config, "qwen2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        Ok(drop_rotary_inv_freq(weights))
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

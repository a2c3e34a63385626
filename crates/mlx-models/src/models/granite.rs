//! Granite, following `mlx_lm/models/granite.py`: Llama's blocks with a scaled
//! embedding, attention scale, residual branches and logits.
use super::attention::{Attention, Extras};
use super::llama;
use super::mlp::Mlp;
use super::{cache_at, layer_caches, Architecture, Weights};
use crate::config::parse_args;
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Granite (all but `rope_scaling` and `tie_word_embeddings`
/// required, as in mlx-lm).
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
    pub logits_scaling: f64,
    pub attention_multiplier: f64,
    pub embedding_multiplier: f64,
    pub residual_multiplier: f64,
    pub max_position_embeddings: i32,
    pub num_key_value_heads: i32,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "crate::config::default_true")]
    pub tie_word_embeddings: bool,
}

impl ModelArgs {
    /// The Llama arguments that build the same attention and feed-forward layers (head
    /// size `hidden_size / num_attention_heads`, rotations not traditional).
    fn as_llama(&self) -> llama::ModelArgs {
        llama::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            head_dim: None,
            max_position_embeddings: Some(self.max_position_embeddings),
            num_key_value_heads: Some(self.num_key_value_heads),
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            rope_theta: self.rope_theta,
            rope_traditional: false,
            rope_scaling: self.rope_scaling.clone(),
            tie_word_embeddings: self.tie_word_embeddings,
            layer_types: None,
            sliding_window: None,
        }
    }
}

/// One decoder layer: `h = x + attn(norm(x)) * m`, `out = h + mlp(norm(h)) * m`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    residual_multiplier: f64,
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
        let r = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            None,
            Extras::default(),
        )?;
        let h = x.add(&r.multiply(self.residual_multiplier)?)?;
        let r = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, None)?;
        h.add(&r.multiply(self.residual_multiplier)?)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct GraniteModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    embedding_multiplier: f64,
}
impl_module!(GraniteModel {
    embed_tokens,
    layers,
    norm
});

impl GraniteModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self
            .embed_tokens
            .forward(inputs)?
            .multiply(self.embedding_multiplier)?;
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

/// Granite with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GraniteModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let base = args.as_llama();
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: llama::attention(&base, Some(args.attention_multiplier), None)?,
                    mlp: Mlp::new(args.hidden_size, args.intermediate_size, args.mlp_bias)?,
                    input_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                    post_attention_layernorm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
                    residual_multiplier: args.residual_multiplier,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GraniteModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, args.hidden_size)?,
            layers,
            norm: RmsNorm::new(args.hidden_size, args.rms_norm_eps)?,
            embedding_multiplier: args.embedding_multiplier,
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
    Ok(Box::new(Model::new(parse_args(config, "granite")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let scale = LogitScale::Over(self.args.logits_scaling);
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, scale)
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
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

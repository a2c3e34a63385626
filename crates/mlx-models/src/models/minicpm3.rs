//! MiniCPM3 (`minicpm3`), following `mlx_lm/models/minicpm3.py`: the low-rank query /
//! compressed key-value attention of [`super::deepseek_v2`] (keys expanded by
//! `kv_b_proj`, the rotary part shared by the heads) with a Su-scaled ("longrope")
//! rotary embedding from the required `rope_scaling`, dense SwiGLU MLPs, embeddings
//! scaled by `scale_emb`, residual branches by `scale_depth / sqrt(layers)`, and an
//! untied head reading `h / (hidden_size / dim_model_base)`.
use super::config_error;
use super::deepseek_v2::{Attention, AttentionParts};
use super::mlp::Mlp;
use super::{cache_at, layer_caches, Architecture};
use crate::config::{parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by MiniCPM3.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub dim_model_base: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub q_lora_rank: i32,
    pub qk_nope_head_dim: i32,
    pub qk_rope_head_dim: i32,
    pub kv_lora_rank: i32,
    pub scale_depth: f64,
    pub scale_emb: f64,
    pub max_position_embeddings: i32,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    1_000_000.0
}

/// One decoder layer.
#[derive(Debug)]
pub struct Layer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(Layer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

/// `embed_tokens`, the layers and the final `norm`.
#[derive(Debug)]
pub struct Stack {
    embed_tokens: EmbeddingLayer,
    layers: Vec<Layer>,
    norm: RmsNorm,
}
impl_module!(Stack {
    embed_tokens,
    layers,
    norm
});

/// MiniCPM3 with its head (the embedding when tied).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Stack,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let cfg = rope_scaling(args.rope_scaling.as_ref())?.ok_or_else(|| {
            config_error("minicpm3", "key `rope_scaling`: required by MiniCPM3's Su-scaled RoPE".into())
        })?;
        if args.num_attention_heads <= 0 || args.dim_model_base == 0 {
            return Err(config_error("minicpm3", 
                "keys `num_attention_heads` and `dim_model_base` must be non-zero".into(),
            ));
        }
        let dim = args.hidden_size;
        let long = cfg.long_factor.clone().unwrap_or_else(|| vec![1.0]);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = Rope::su_scaled(
                    args.qk_rope_head_dim,
                    args.rope_theta,
                    args.max_position_embeddings as f64,
                    cfg.original_max_position_embeddings.unwrap_or(4096.0),
                    &long,
                )?;
                let q_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim;
                Ok(Layer {
                    self_attn: Attention::from_parts(AttentionParts {
                        dim,
                        num_heads: args.num_attention_heads,
                        q_lora_rank: Some(args.q_lora_rank),
                        kv_lora_rank: args.kv_lora_rank,
                        qk_nope_head_dim: args.qk_nope_head_dim,
                        qk_rope_head_dim: args.qk_rope_head_dim,
                        v_head_dim: dim / args.num_attention_heads,
                        bias: args.attention_bias,
                        norm_eps: 1e-5,
                        rope,
                        scale: (q_head_dim as f64).powf(-0.5),
                    })?,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?.up_before_down(),
                    input_layernorm: RmsNorm::new(dim, args.rms_norm_eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, args.rms_norm_eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Stack {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, args.rms_norm_eps)?,
        };
        let lm_head = super::head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "minicpm3")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?.multiply(self.args.scale_emb)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        let s = self.args.scale_depth / (self.args.num_hidden_layers as f64).powf(0.5);
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, move |layer, h, mask, cache| {
                let x = layer.input_layernorm.forward(h)?;
                let r = layer.self_attn.forward(&x, mask, cache)?;
                let h = h.add(&r.multiply(s)?)?;
                let r = layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h)?, None)?;
                h.add(&r.multiply(s)?)
            })?;
        }
        let out = m.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => {
                let ratio = self.args.hidden_size as f64 / self.args.dim_model_base as f64;
                head.forward(&out.divide(ratio)?)
            }
            None => m.embed_tokens.as_linear(&out),
        }
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

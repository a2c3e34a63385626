//! Phi (Phi-1, Phi-1.5, Phi-2), following `mlx_lm/models/phi.py`: attention and a GELU
//! feed-forward side by side on one layer norm, a partial RoPE, attention on float32
//! queries, and a biased head.
use super::attention::{Attention, AttentionDims, Extras};
use super::lm::{causal_layers, even_head_dim};
use super::Architecture;
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Phi (mlx-lm's defaults are Phi-2's).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default = "default_vocab")]
    pub vocab_size: i32,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: i32,
    /// `None` (or absent with mlx-lm's default 32) is `num_attention_heads`.
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_partial_rotary")]
    pub partial_rotary_factor: f64,
    #[serde(default = "default_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
}

fn default_model_type() -> String {
    "phi".into()
}
fn default_vocab() -> i32 {
    51200
}
fn default_hidden() -> i32 {
    2560
}
fn default_heads() -> i32 {
    32
}
fn default_layers() -> i32 {
    32
}
fn default_kv_heads() -> Option<i32> {
    Some(32)
}
fn default_partial_rotary() -> f64 {
    0.4
}
fn default_intermediate() -> i32 {
    10240
}
fn default_eps() -> f64 {
    1e-5
}
fn default_rope_theta() -> f64 {
    10000.0
}

/// `fc2(gelu_approx(fc1(x)))`.
#[derive(Debug)]
pub struct PhiMlp {
    fc1: LinearLayer,
    fc2: LinearLayer,
}
impl_module!(PhiMlp { fc1, fc2 });

/// One layer: `attn(norm(x)) + mlp(norm(x)) + x`.
#[derive(Debug)]
pub struct PhiDecoderLayer {
    self_attn: Attention,
    input_layernorm: LayerNorm,
    mlp: PhiMlp,
}
impl_module!(PhiDecoderLayer {
    self_attn,
    input_layernorm,
    mlp
});

impl PhiDecoderLayer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.input_layernorm.forward(x)?;
        let extras = Extras {
            queries_in_f32: true,
            ..Default::default()
        };
        let attn = self.self_attn.forward(&h, mask, cache, None, extras)?;
        let ff = self
            .mlp
            .fc2
            .forward(&activations::gelu_approx(&self.mlp.fc1.forward(&h)?)?)?;
        attn.add(&ff)?.add(x)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct PhiModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<PhiDecoderLayer>,
    final_layernorm: LayerNorm,
}
impl_module!(PhiModel {
    embed_tokens,
    layers,
    final_layernorm
});

/// Phi with its biased head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: PhiModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads) = (args.hidden_size, args.num_attention_heads);
        let head_dim = even_head_dim(dim, n_heads, "phi")?;
        let d = AttentionDims {
            dim,
            n_heads,
            n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            qkv_bias: true,
            o_bias: true,
        };
        let rotary = (args.partial_rotary_factor * head_dim as f64) as i32;
        let eps = args.layer_norm_eps;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = Rope::new(rotary, false, args.rope_theta, 1.0);
                Ok(PhiDecoderLayer {
                    self_attn: Attention::new(d, rope, (head_dim as f64).recip().sqrt())?
                        .with_out_name("dense"),
                    input_layernorm: LayerNorm::new(dim, eps, true, true)?,
                    mlp: PhiMlp {
                        fc1: LinearLayer::new(dim, args.intermediate_size, true)?,
                        fc2: LinearLayer::new(args.intermediate_size, dim, true)?,
                    },
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = PhiModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            final_layernorm: LayerNorm::new(dim, eps, true, true)?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, true)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "phi")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let h = causal_layers(&m.layers, h, caches, PhiDecoderLayer::forward)?;
        self.lm_head.forward(&m.final_layernorm.forward(&h)?)
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

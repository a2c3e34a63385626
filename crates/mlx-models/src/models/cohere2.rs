//! Cohere 2 (Command R7B, Command A), following `mlx_lm/models/cohere2.py`: attention
//! and feed-forward side by side on one layer norm, sliding-window layers with
//! (traditional) RoPE and every `sliding_window_pattern`-th layer global without it,
//! the tied head scaled by `logit_scale`.
use super::attention::{Attention, AttentionDims, Extras};
use super::mlp::Mlp;
use super::window_cache_specs;
use super::LayerMasks;
use super::{layer_caches, Architecture};
use crate::config::parse_args;
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Cohere 2 (mlx-lm's defaults are Command R7B's).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_head_dim")]
    pub head_dim: i32,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "default_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_vocab")]
    pub vocab_size: i32,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_logit_scale")]
    pub logit_scale: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub layer_norm_bias: bool,
    #[serde(default = "default_window")]
    pub sliding_window: i32,
    #[serde(default = "default_pattern")]
    pub sliding_window_pattern: i32,
}

fn default_hidden() -> i32 {
    4096
}
fn default_head_dim() -> i32 {
    128
}
fn default_layers() -> i32 {
    32
}
fn default_intermediate() -> i32 {
    14336
}
fn default_heads() -> i32 {
    32
}
fn default_kv_heads() -> i32 {
    8
}
fn default_rope_theta() -> f64 {
    50000.0
}
fn default_vocab() -> i32 {
    256000
}
fn default_eps() -> f64 {
    1e-5
}
fn default_logit_scale() -> f64 {
    0.0625
}
fn default_window() -> i32 {
    4096
}
fn default_pattern() -> i32 {
    4
}

impl ModelArgs {
    /// Whether layer `i` attends globally (without RoPE or window).
    fn is_global(&self, i: i32) -> bool {
        i % self.sliding_window_pattern == self.sliding_window_pattern - 1
    }
}

/// One decoder layer: `attn(norm(x)) + mlp(norm(x)) + x`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm,
    global: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.input_layernorm.forward(x)?;
        let extras = Extras {
            f16_queries_in_f32: true,
            ..Default::default()
        };
        let attn = self.self_attn.forward(&h, mask, cache, None, extras)?;
        let ff = self.mlp.forward(&h, None)?;
        attn.add(&ff)?.add(x)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct CohereModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: LayerNorm,
    window_size: i32,
    pattern: usize,
}
impl_module!(CohereModel {
    embed_tokens,
    layers,
    norm
});

impl CohereModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        let masks = LayerMasks::new(n, caches, self.pattern - 1, Some(0), Some(self.window_size))?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            h = layer.forward(&h, masks.get(!layer.global), cache)?;
        }
        self.norm.forward(&h)
    }
}

/// Cohere 2 (the head is always the tied embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: CohereModel,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |message: String| crate::Error::Config {
            path: "config.json (cohere2)".into(),
            message,
        };
        let (dim, n_heads, d) = (args.hidden_size, args.num_attention_heads, args.head_dim);
        if d * n_heads != dim {
            return Err(err(format!(
                "`hidden_size` ({dim}) must be `num_attention_heads` ({n_heads}) x `head_dim` ({d})"
            )));
        }
        if args.sliding_window_pattern < 1 || args.num_hidden_layers < args.sliding_window_pattern {
            return Err(err(format!(
                "`sliding_window_pattern` ({}) must be between 1 and the {} layers",
                args.sliding_window_pattern, args.num_hidden_layers
            )));
        }
        let dims = AttentionDims {
            dim,
            n_heads,
            n_kv_heads: args.num_key_value_heads,
            head_dim: d,
            qkv_bias: args.attention_bias,
            o_bias: args.attention_bias,
        };
        let norm = || LayerNorm::new(dim, args.layer_norm_eps, true, args.layer_norm_bias);
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let global = args.is_global(i);
                let rope = if global {
                    Rope::Identity
                } else {
                    Rope::new(d, true, args.rope_theta, 1.0)
                };
                Ok(TransformerBlock {
                    self_attn: Attention::new(dims, rope, (d as f64).powf(-0.5))?,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?,
                    input_layernorm: norm()?,
                    global,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = CohereModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: norm()?,
            window_size: args.sliding_window,
            pattern: args.sliding_window_pattern as usize,
        };
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "cohere2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        let scale = LogitScale::Times(self.args.logit_scale);
        head::logits(&self.model.embed_tokens, None, &out, scale)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| !l.global);
        window_cache_specs(sliding, self.args.sliding_window)
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

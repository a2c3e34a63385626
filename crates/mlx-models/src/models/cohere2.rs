//! Cohere 2 (Command R7B, Command A), following `mlx_lm/models/cohere2.py`: attention
//! and feed-forward side by side on one layer norm, sliding-window layers with
//! (traditional) RoPE and every `sliding_window_pattern`-th layer global without it,
//! the tied head scaled by `logit_scale`.
use super::attention::{Attention, AttentionDims};
use super::cohere::{CohereModel, TransformerBlock};
use super::mlp::Mlp;
use super::window_cache_specs;
use super::Architecture;
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, LayerNorm, Rope};
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
                let attn = Attention::new(dims, rope, (d as f64).powf(-0.5))?;
                let mlp = Mlp::new(dim, args.intermediate_size, false)?.up_before_down();
                Ok(TransformerBlock::new(attn, mlp, norm()?).sliding(!global))
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let masks = (
            args.sliding_window_pattern as usize - 1,
            Some(0),
            Some(args.sliding_window),
        );
        let model = CohereModel::new(args.vocab_size, dim, layers, norm()?, masks)?;
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "cohere2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.model.logits(tokens, caches, self.args.logit_scale)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.sliding);
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
        self.model.fuse()
    }
}

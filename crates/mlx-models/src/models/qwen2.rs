//! Qwen2, following `mlx_lm/models/qwen2.py`.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::{drop_tied_head, DecoderLm};
use super::mlp::Mlp;
use super::{drop_rotary_inv_freq, Architecture, Weights};
use crate::config::{default_true, parse_args, rope_scaling};
use mlx_nn::initialize_rope;
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

/// Qwen2 with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "qwen2")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, false)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(drop_rotary_inv_freq(weights))
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

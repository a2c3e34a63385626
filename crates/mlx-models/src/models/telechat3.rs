//! TeleChat3 (`telechat3`), following `mlx_lm/models/telechat3.py`: Llama-shaped layers
//! on the shared [`DecoderLm`], all four attention projections biased by
//! `attention_bias`, the SwiGLU MLP's three by `mlp_bias`, RoPE from `rope_scaling`
//! (mlx-lm's `initialize_rope`, never traditional) over `head_dim` (null or 0:
//! `hidden_size / num_attention_heads`). The checkpoint loads as it is (no `sanitize`).
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::DecoderLm;
use super::mlp::Mlp;
use super::Architecture;
use crate::config::{parse_args, rope_scaling};
use mlx_nn::initialize_rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by TeleChat3 (those without a default are required, as in
/// mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub rope_theta: f64,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn config_err(message: &str) -> crate::Error {
    crate::Error::Config {
        path: "config.json (telechat3)".into(),
        message: message.into(),
    }
}

/// Self-attention, every projection biased by `attention_bias`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = match args.head_dim.filter(|&d| d != 0) {
        Some(d) => d,
        None if n_heads > 0 => args.hidden_size / n_heads,
        None => return Err(config_err("key `num_attention_heads` must be positive")),
    };
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        false,
        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
        Some(args.max_position_embeddings),
    )?;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "telechat3")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, args.mlp_bias)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

//! ERNIE 4.5 (dense), following `mlx_lm/models/ernie4_5.py`: Llama-shaped layers with
//! every projection biased by `use_bias` and a traditional RoPE.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::DecoderLm;
use super::mlp::Mlp;
use super::Architecture;
use crate::config::parse_args;
use mlx_nn::initialize_rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by ERNIE 4.5 (all required, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub max_position_embeddings: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: Option<i32>,
    pub num_hidden_layers: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub rope_theta: f64,
    pub use_bias: bool,
    pub tie_word_embeddings: bool,
}

/// Self-attention, every projection biased by `use_bias`, a traditional RoPE.
pub(crate) fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args
        .head_dim
        .filter(|&d| d > 0)
        .unwrap_or(args.hidden_size / args.num_attention_heads);
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.use_bias,
        o_bias: args.use_bias,
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        true,
        None,
        Some(args.max_position_embeddings),
    )?;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "ernie4_5")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, args.use_bias)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

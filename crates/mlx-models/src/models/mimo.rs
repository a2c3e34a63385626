//! MiMo, following `mlx_lm/models/mimo.py`: Qwen2's layers (biased q/k/v) with other
//! defaults; the multi-token-prediction layers of the checkpoint are dropped.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::{drop_tied_head, DecoderLm};
use super::mlp::Mlp;
use super::{drop_rotary_inv_freq, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use mlx_nn::initialize_rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by MiMo.
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
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_max_position_embeddings() -> i32 {
    32768
}
fn default_rope_theta() -> f64 {
    10000.0
}

const MLP_BIAS: bool = false;

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

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "mimo")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, MLP_BIAS)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Drops a tied head, the rotary buffers and the multi-token-prediction layers.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(drop_rotary_inv_freq(weights)
            .into_iter()
            .filter(|(k, _)| !k.starts_with("model.mtp_layers."))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

//! GLM (`glm`, GLM-4-0414's predecessor layout), following `mlx_lm/models/glm.py`:
//! Llama-shaped layers on the shared decoder whose attention rotates traditionally
//! (interleaved pairs) over the whole `head_dim` at `rope_theta`, biases on q/k/v only
//! where `attention_bias` (never on `o_proj`), and a SwiGLU MLP with one fused
//! `gate_up_proj`. `sanitize` drops HF's rotary `inv_freq` buffers and a tied `lm_head`.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::{drop_tied_head, DecoderLm};
use super::mlp::GateUpMlp;
use super::{drop_rotary_inv_freq, Architecture, Weights};
use crate::config::{default_true, parse_args};
use mlx_nn::Rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GLM (those without a default are required, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs, dead_code)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    /// Required, though `null` (or 0) falls back to `hidden_size / num_attention_heads`.
    #[serde(deserialize_with = "Option::deserialize")]
    pub head_dim: Option<i32>,
    pub num_key_value_heads: i32,
    #[serde(default)]
    max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}

/// Self-attention: q/k/v biased by `attention_bias`, `o_proj` never; traditional RoPE
/// over `head_dim`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = match args.head_dim.filter(|&d| d != 0) {
        Some(d) => d,
        None if n_heads > 0 => args.hidden_size / n_heads,
        None => {
            return Err(crate::Error::Config {
                path: "config.json (glm)".into(),
                message: "key `num_attention_heads` must be positive".into(),
            })
        }
    };
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: false,
    };
    let rope = Rope::new(head_dim, true, args.rope_theta, 1.0);
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, GateUpMlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "glm")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = GateUpMlp::new(dim, args.intermediate_size, ["gate_up_proj", "down_proj"])?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// HF's `self_attn.rotary_emb.inv_freq` buffers dropped, and a tied `lm_head`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = drop_rotary_inv_freq(weights);
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

//! InternLM 3, following `mlx_lm/models/internlm3.py`: Llama-shaped layers, q/k/v and
//! o biased by `qkv_bias`, the MLP by `bias`; only linear or dynamic RoPE scaling.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::DecoderLm;
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use mlx_nn::initialize_rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by InternLM 3.
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
    #[serde(default)]
    pub bias: bool,
    #[serde(default)]
    pub qkv_bias: bool,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
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

impl ModelArgs {
    /// `__post_init__`'s check of `rope_scaling`: `factor` and `rope_type` given, the type
    /// `linear` or `dynamic`.
    fn check(self) -> crate::Result<ModelArgs> {
        let err = |message: String| crate::Error::Config {
            path: "config.json (internlm3)".into(),
            message,
        };
        if let Some(s) = self.rope_scaling.as_ref().and_then(Value::as_object) {
            if s.is_empty() {
                return Ok(self);
            }
            if !(s.contains_key("factor") && s.contains_key("rope_type")) {
                return Err(err(
                    "key `rope_scaling` must contain keys `factor` and `rope_type`".into(),
                ));
            }
            let ty = s.get("rope_type").and_then(Value::as_str).unwrap_or("");
            if ty != "linear" && ty != "dynamic" {
                return Err(err(format!(
                    "key `rope_scaling.rope_type` supports only \"linear\" or \"dynamic\", got {}",
                    s["rope_type"]
                )));
            }
        }
        Ok(self)
    }
}

/// Self-attention, all four projections biased by `qkv_bias`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = args.hidden_size / n_heads;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        qkv_bias: args.qkv_bias,
        o_bias: args.qkv_bias,
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

/// InternLM 3 with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "internlm3")?;
    let args = args.check()?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, args.bias)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Drops the precomputed rotary buffers (`attention.rope.inv_freq`).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("attention.rope.inv_freq"))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

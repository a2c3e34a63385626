//! Hunyuan dense (`hunyuan_v1_dense`), following `mlx_lm/models/hunyuan_v1_dense.py`:
//! Llama-shaped layers whose attention normalizes the rotated queries and keys
//! (`query_layernorm` / `key_layernorm`) before the cache update, with a RoPE whose base
//! is scaled by `rope_scaling.alpha` (mlx-lm's `DynamicNTKAlphaRoPE`).
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::DecoderLayer;
use super::lm::{drop_tied_head, DecoderLm};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::parse_args;
use mlx_array::{ops, Array, Dtype, Scalar};
use mlx_nn::{RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Hunyuan dense.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: i32,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_true")]
    pub use_qk_norm: bool,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub head_dim: Option<i32>,
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_max_position_embeddings() -> i32 {
    32768
}
fn default_true() -> bool {
    true
}

impl ModelArgs {
    /// `__post_init__`: a `rope_scaling` must carry `alpha`, `factor` and `type`.
    fn check(self) -> crate::Result<ModelArgs> {
        if let Some(s) = self.rope_scaling.as_ref().filter(|s| !s.is_empty()) {
            if !["alpha", "factor", "type"]
                .iter()
                .all(|k| s.contains_key(*k))
            {
                return Err(crate::Error::Config {
                    path: "config.json (hunyuan_v1_dense)".into(),
                    message: "key `rope_scaling` must contain keys `alpha`, `factor` and `type`"
                        .into(),
                });
            }
        }
        Ok(self)
    }
}

/// `DynamicNTKAlphaRoPE`: frequencies `(base * alpha ** (dims / (dims - 2))) **
/// (arange(0, dims, 2) / dims)`, not traditional.
pub(crate) fn alpha_rope(dims: i32, base: f64, alpha: f64) -> crate::Result<Rope> {
    let base = base * alpha.powf(dims as f64 / (dims - 2) as f64);
    let exponents = ops::arange(0.0, dims as f64, 2.0, Dtype::Int32)?.divide(dims)?;
    let freqs = Array::weak_scalar(Scalar::Float(base), Dtype::Float32)?.power(&exponents)?;
    mlx_array::transforms::eval(&[&freqs])?;
    Ok(Rope::Freqs {
        dims,
        traditional: false,
        freqs,
        input_scale: None,
    })
}

/// Self-attention, all four projections biased by `attention_bias`, q/k norms after the
/// rotation where `use_qk_norm`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = args.head_dim.unwrap_or(args.hidden_size / n_heads);
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let alpha = args
        .rope_scaling
        .as_ref()
        .and_then(|s| s.get("alpha"))
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    let rope = alpha_rope(head_dim, args.rope_theta, alpha)?;
    let attn = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?;
    if !args.use_qk_norm {
        return Ok(attn);
    }
    let eps = args.rms_norm_eps;
    Ok(attn
        .with_qk_norms(NormAt::AfterRope, |n| {
            Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?))
        })?
        .with_norm_names("query_layernorm", "key_layernorm"))
}

/// Hunyuan dense with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "hunyuan_v1_dense")?;
    let args = args.check()?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, false)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Drops a tied head's `lm_head.weight`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

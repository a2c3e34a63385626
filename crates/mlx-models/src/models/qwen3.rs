//! Qwen3, following `mlx_lm/models/qwen3.py`.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::DecoderLayer;
use super::lm::{drop_tied_head, DecoderLm};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use mlx_nn::{initialize_rope, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen3.
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
    pub max_position_embeddings: i32,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// transformers >= 5 nests `rope_theta` and the scaling here.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
}

impl ModelArgs {
    /// `__post_init__`: fills `rope_theta` / `rope_scaling` from `rope_parameters`.
    fn resolve(mut self) -> crate::Result<ModelArgs> {
        if let Some(p) = self
            .rope_parameters
            .clone()
            .filter(|p| p.as_object().is_some_and(|o| !o.is_empty()))
        {
            if self.rope_theta.is_none() {
                self.rope_theta = p.get("rope_theta").and_then(Value::as_f64);
            }
            if self.rope_scaling.is_none() {
                self.rope_scaling = Some(p);
            }
        }
        if self.rope_theta.is_none() {
            return Err(crate::Error::Config {
                path: "config.json (qwen3)".into(),
                message: "key `rope_theta` is missing from the model config".into(),
            });
        }
        Ok(self)
    }
}

/// Self-attention with per-head q/k RMS norms.
pub(crate) fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.head_dim;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta.unwrap_or_default(),
        false,
        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
        Some(args.max_position_embeddings),
    )?;
    let eps = args.rms_norm_eps;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))?
        .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))
}

/// Qwen3 with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "qwen3")?;
    let args = args.resolve()?;
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
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

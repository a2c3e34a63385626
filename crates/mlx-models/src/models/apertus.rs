//! Apertus (`apertus`), following `mlx_lm/models/apertus.py`: Llama-shaped layers whose
//! norms are named `attention_layernorm` / `feedforward_layernorm`, attention without
//! biases and with per-head `q_norm` / `k_norm` always (before the rotation), and an MLP
//! of `down_proj(xielu(up_proj(x)))` (no gate) whose XieLU activation carries four
//! scalar parameters (`alpha_p`, `alpha_n`, `beta`, `eps`). `attention_bias`, `qk_norm`
//! and `post_norm` are required but not read, as in mlx-lm. `sanitize` squeezes HF's
//! one-element `alpha_p` / `alpha_n` and drops a tied `lm_head`.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::{DecoderLayer, FeedForward};
use super::lm::{drop_tied_head, DecoderLm};
use super::{project_out, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::{impl_module, initialize_rope, LinearLayer, Param, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Apertus (those without a default are required, as in
/// mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs, dead_code)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub mlp_bias: bool,
    pub num_attention_heads: i32,
    attention_bias: bool,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub max_position_embeddings: i32,
    pub rope_theta: f64,
    post_norm: bool,
    qk_norm: bool,
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
}

/// mlx-lm's `XieLU` module: its parameters (placeholders at mlx-lm's initial values).
#[derive(Debug)]
pub struct XieLu {
    alpha_p: Param,
    alpha_n: Param,
    beta: Param,
    eps: Param,
}
impl_module!(XieLu {
    alpha_p,
    alpha_n,
    beta,
    eps
});

impl XieLu {
    fn new() -> Result<XieLu> {
        let scalar = |v: f64| -> Result<Param> { Ok(Param::new(Array::scalar_f64(v, Dtype::Float32)?)) };
        // `log(exp(a) - 1)`: the softplus inverse of the initial alphas (0.8, 0.8 - beta).
        let inverse_softplus = |a: f64| -> Result<Param> {
            let a = Array::scalar_f64(a, Dtype::Float32)?;
            Ok(Param::new(a.exp()?.subtract(1.0)?.log()?))
        };
        Ok(XieLu {
            alpha_p: inverse_softplus(0.8)?,
            alpha_n: inverse_softplus(0.8 - 0.5)?,
            beta: scalar(0.5)?,
            eps: scalar(-1e-6)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        mlx_nn::activations::xielu(x, &self.alpha_p, &self.alpha_n, &self.beta, &self.eps)
    }
}

/// `down_proj(xielu(up_proj(x)))`, both projections biased by `mlp_bias`.
#[derive(Debug)]
pub struct Mlp {
    up_proj: LinearLayer,
    down_proj: LinearLayer,
    act_fn: XieLu,
}
impl_module!(Mlp {
    up_proj,
    down_proj,
    act_fn
});

impl FeedForward for Mlp {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let h = self.act_fn.forward(&self.up_proj.forward(x)?)?;
        project_out(&self.down_proj, &h, residual)
    }
}

/// Self-attention without biases, per-head RMS norms on q and k before RoPE.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    if n_heads < 1 {
        return Err(crate::Error::Config {
            path: "config.json (apertus)".into(),
            message: "key `num_attention_heads` must be positive".into(),
        });
    }
    let head_dim = args.hidden_size / n_heads;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let scaling = rope_scaling(args.rope_scaling.as_ref())?;
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        args.rope_traditional,
        scaling.as_ref(),
        Some(args.max_position_embeddings),
    )?;
    let eps = args.rms_norm_eps;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))?
        .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "apertus")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let (hidden, bias) = (args.intermediate_size, args.mlp_bias);
        let mlp = Mlp {
            up_proj: LinearLayer::new(dim, hidden, bias)?,
            down_proj: LinearLayer::new(hidden, dim, bias)?,
            act_fn: XieLu::new()?,
        };
        Ok(DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)?
            .with_norm_names("attention_layernorm", "feedforward_layernorm"))
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// `alpha_p` / `alpha_n` squeezed to scalars; a tied `lm_head` dropped.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        for (k, v) in weights.iter_mut() {
            if k.ends_with("alpha_p") || k.ends_with("alpha_n") {
                *v = v.squeeze(None)?;
            }
        }
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

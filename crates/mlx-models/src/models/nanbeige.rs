//! Nanbeige (`nanbeige`), following `mlx_lm/models/nanbeige.py`: Llama-shaped layers
//! on the shared [`DecoderLm`] (all four attention projections biased by
//! `attention_bias`, the SwiGLU MLP's by `mlp_bias`, RoPE from `rope_scaling` through
//! mlx-lm's `initialize_rope`), the layer stack run `num_loops` times with shared
//! weights (`len(loop_loss_weights) + 1` times where that list is non-empty), each run
//! with its own caches and ending with the final norm unless `skip_loop_final_norm`
//! (then normed once at the end). The reference implementation's features without
//! weights of their own (`enable_double_loop_split`, `loop_share_kv`,
//! `enable_depth_attention`) are refused, as mlx-lm refuses them. `sanitize` drops HF's
//! rotary `inv_freq` buffers.
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::DecoderLm;
use super::mlp::Mlp;
use super::{drop_rotary_inv_freq, Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use mlx_nn::initialize_rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Nanbeige (those without a default are required, as in
/// mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_num_loops")]
    pub num_loops: i32,
    #[serde(default)]
    pub loop_loss_weights: Option<Vec<f64>>,
    #[serde(default)]
    pub skip_loop_final_norm: bool,
    #[serde(default)]
    pub enable_double_loop_split: bool,
    #[serde(default)]
    pub loop_share_kv: bool,
    #[serde(default)]
    pub enable_depth_attention: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_num_loops() -> i32 {
    1
}

fn config_err(message: &str) -> crate::Error {
    crate::Error::Config {
        path: "config.json (nanbeige)".into(),
        message: message.into(),
    }
}

impl ModelArgs {
    /// How many times the layers run: one per loss weight plus one where
    /// `loop_loss_weights` is non-empty, else `num_loops`.
    fn effective_num_loops(&self) -> i32 {
        match &self.loop_loss_weights {
            Some(w) if !w.is_empty() => w.len() as i32 + 1,
            _ => self.num_loops,
        }
    }

    /// `head_dim`, or `hidden_size / num_attention_heads` where it is missing or null.
    fn head_dim(&self) -> crate::Result<i32> {
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.num_attention_heads > 0 => self.hidden_size / self.num_attention_heads,
            None => return Err(config_err("key `num_attention_heads` must be positive")),
        };
        if head_dim <= 0 {
            return Err(config_err("key `head_dim` must be positive"));
        }
        Ok(head_dim)
    }
}

/// Self-attention, every projection biased by `attention_bias`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let head_dim = args.head_dim()?;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
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
        args.max_position_embeddings,
    )?;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "nanbeige")?;
    if args.enable_double_loop_split || args.loop_share_kv || args.enable_depth_attention {
        return Err(config_err(
            "enable_double_loop_split, loop_share_kv, and enable_depth_attention are not yet \
             supported (as in mlx-lm)",
        ));
    }
    let loops = args.effective_num_loops();
    if loops < 1 {
        return Err(config_err("key `num_loops` must be positive"));
    }
    let skip_final_norm = args.skip_loop_final_norm;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let mut model = Model::new(lm_dims!(args), args, |args, _| {
        let mlp = Mlp::new(dim, args.intermediate_size, args.mlp_bias)?;
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    model.model = model.model.with_loops(loops as usize, skip_final_norm);
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// HF's `self_attn.rotary_emb.inv_freq` buffers dropped.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(drop_rotary_inv_freq(weights))
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

//! Qwen (v1, `qwen`), following `mlx_lm/models/qwen.py`: the shared decoder under HF's
//! Qwen names (`transformer.wte`, `transformer.h.{i}.ln_1` / `attn` / `ln_2` / `mlp`,
//! `transformer.ln_f`), attention through one biased `c_attn` projection split in three
//! (no grouped heads) and `c_proj`, a SwiGLU MLP of `c_proj(swiglu(w2(x), w1(x)))` half
//! `intermediate_size` wide, and an untied `lm_head`. `no_bias` drops the biases of
//! `c_proj`, the MLP and the head (never `c_attn`'s). No `sanitize`, as in mlx-lm.
use super::config_error;
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::{DecoderLm, LmDims};
use super::mlp::Mlp;
use super::Architecture;
use crate::config::parse_args;
use mlx_nn::Rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen (all but `model_type` defaulted, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "default_hidden_size")]
    pub hidden_size: i32,
    #[serde(default = "default_num_attention_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_num_hidden_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "default_kv_channels")]
    pub kv_channels: i32,
    #[serde(default = "default_layer_norm_epsilon")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_intermediate_size")]
    pub intermediate_size: i32,
    #[serde(default = "crate::config::default_true")]
    pub no_bias: bool,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
}

fn default_hidden_size() -> i32 {
    2048
}
fn default_num_attention_heads() -> i32 {
    16
}
fn default_num_hidden_layers() -> i32 {
    24
}
fn default_kv_channels() -> i32 {
    128
}
fn default_layer_norm_epsilon() -> f64 {
    1e-6
}
fn default_intermediate_size() -> i32 {
    11008
}
fn default_vocab_size() -> i32 {
    151936
}

/// `c_proj(sdpa(rope(q), rope(k), v))` over the biased `c_attn`: `kv_channels` per head,
/// rotated over `hidden_size / num_attention_heads` dimensions (non-traditional, base
/// 10000), scaled by that size's inverse square root.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    if n_heads < 1 {
        return Err(config_error("qwen", 
            "key `num_attention_heads` must be positive".into(),
        ));
    }
    let per_head = args.hidden_size / n_heads;
    // mlx-lm's `c_proj` is `Linear(hidden_size, kv_channels * num_attention_heads)` over
    // the attention's `kv_channels * num_attention_heads` features: only equal sizes run.
    if args.kv_channels * n_heads != args.hidden_size {
        return Err(config_error("qwen", format!(
            "`kv_channels` * `num_attention_heads` ({} * {n_heads}) must equal `hidden_size` \
             ({}): mlx-lm's c_proj reads hidden_size features",
            args.kv_channels, args.hidden_size
        )));
    }
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: n_heads,
        head_dim: args.kv_channels,
        qkv_bias: true,
        o_bias: !args.no_bias,
    };
    let rope = Rope::new(per_head, false, 10000.0, 1.0);
    Ok(
        Attention::new_joint_qkv(d, "c_attn", rope, (per_head as f64).powf(-0.5))?
            .with_out_name("c_proj"),
    )
}

/// The model with its output head.
pub type Model = DecoderLm<ModelArgs, Mlp>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "qwen")?;
    let (dim, eps, bias) = (args.hidden_size, args.layer_norm_epsilon, !args.no_bias);
    let d = LmDims {
        model_type: args.model_type.clone(),
        vocab: args.vocab_size,
        dim,
        eps,
        layers: args.num_hidden_layers,
        tied: false,
    };
    let model = Model::new(d, args, |args, _| {
        let hidden = args.intermediate_size / 2;
        let mlp = Mlp::new(dim, hidden, bias)?.with_names("w2", "w1", "c_proj");
        Ok(DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)?
            .with_attn_name("attn")
            .with_norm_names("ln_1", "ln_2"))
    })?
    .with_model_name("transformer")
    .with_stack_names("wte", "h", "ln_f")
    .with_head_bias(dim, bias)?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

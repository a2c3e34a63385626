//! DeepSeek-MoE v1 (`deepseek`), following `mlx_lm/models/deepseek.py`: Llama-shaped
//! layers on the shared [`DecoderLm`] (attention biased by `attention_bias` on all four
//! projections, RoPE scaled linearly when `rope_scaling.type` is `linear`), whose
//! feed-forward is, from `first_k_dense_replace` on and every `moe_layer_freq`-th layer,
//! DeepSeek-V2's expert block without its scaling: softmax (precise) top-k experts,
//! unnormalized, plus shared experts. The head is always `lm_head`. `sanitize` stacks
//! per-expert weights.
use super::attention::{Attention, AttentionDims};
use super::decoder::{stack_mlp_experts, DecoderLayer, DenseOrMoe};
use super::deepseek_v2::Moe;
use super::lm::{even_head_dim, DecoderLm, LmDims};
use super::mlp::Mlp;
use super::{Architecture, Weights};
use crate::config::parse_args;
use mlx_nn::Rope;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by DeepSeek-MoE, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: Option<i32>,
    pub num_experts_per_tok: Option<i32>,
    pub moe_layer_freq: i32,
    pub first_k_dense_replace: i32,
    pub max_position_embeddings: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
    pub attention_bias: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "deepseek".into(),
            vocab_size: 102400,
            hidden_size: 4096,
            intermediate_size: 11008,
            moe_intermediate_size: 1407,
            num_hidden_layers: 30,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            n_shared_experts: None,
            n_routed_experts: None,
            num_experts_per_tok: None,
            moe_layer_freq: 1,
            first_k_dense_replace: 0,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: None,
            attention_bias: false,
        }
    }
}

fn config_err(message: String) -> crate::Error {
    crate::Error::Config {
        path: "config.json (deepseek)".into(),
        message,
    }
}

/// The RoPE scale: `1 / factor` for a `rope_scaling` of type `linear` (its `factor` a
/// float, as mlx-lm asserts), else 1; a non-empty `rope_scaling` needs its `type`.
fn rope_scale(rope_scaling: Option<&Value>) -> crate::Result<f64> {
    let Some(cfg) = rope_scaling.and_then(Value::as_object).filter(|m| !m.is_empty()) else {
        return Ok(1.0);
    };
    let ty = cfg
        .get("type")
        .ok_or_else(|| config_err("key `rope_scaling.type` is required".into()))?;
    if ty.as_str() != Some("linear") {
        return Ok(1.0);
    }
    match cfg.get("factor") {
        Some(f) if f.is_f64() => Ok(1.0 / f.as_f64().unwrap_or(1.0)),
        _ => Err(config_err(
            "key `rope_scaling.factor` must be a float for linear scaling".into(),
        )),
    }
}

/// Self-attention, every projection biased by `attention_bias`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = even_head_dim(args.hidden_size, n_heads, "deepseek")?;
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let scale = rope_scale(args.rope_scaling.as_ref())?;
    let rope = Rope::new(head_dim, false, args.rope_theta, scale);
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// DeepSeek-MoE with its head.
pub type Model = DecoderLm<ModelArgs, DenseOrMoe<Moe>>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "deepseek")?;
    if args.moe_layer_freq <= 0 {
        return Err(config_err("key `moe_layer_freq` must be positive".into()));
    }
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let dims = LmDims {
        model_type: args.model_type.clone(),
        vocab: args.vocab_size,
        dim,
        eps,
        layers: args.num_hidden_layers,
        tied: false,
    };
    let model = Model::new(dims, args, |args, i| {
        let mlp = match args.n_routed_experts {
            Some(n) if i >= args.first_k_dense_replace && i % args.moe_layer_freq == 0 => {
                let top_k = args.num_experts_per_tok.ok_or_else(|| {
                    config_err("key `num_experts_per_tok`: required with `n_routed_experts`".into())
                })?;
                let dims = (dim, args.moe_intermediate_size);
                DenseOrMoe::Moe(Box::new(Moe::new(
                    dims,
                    n,
                    args.n_shared_experts,
                    top_k,
                    None,
                    None,
                )?))
            }
            _ => DenseOrMoe::Dense(Box::new(
                Mlp::new(dim, args.intermediate_size, false)?.up_before_down(),
            )),
        };
        DecoderLayer::new(attention(args)?, mlp, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Stacks per-expert weights into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if let Some(n_experts) = self.args.n_routed_experts {
            stack_mlp_experts(&mut weights, self.args.num_hidden_layers, n_experts)?;
        }
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

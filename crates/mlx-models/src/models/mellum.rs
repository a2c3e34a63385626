//! Mellum (`mellum`), following `mlx_lm/models/mellum.py`: Qwen3-shaped attention
//! (per-head q/k RMS norms, `head_dim` given) whose RoPE each layer type takes from
//! `rope_parameters[layer_type]`, global and sliding-window layers by `layer_types`
//! (a rotating cache of `sliding_window` for the sliding ones, each kind's mask from its
//! first layer's cache), and in every layer Qwen3-MoE's softmax-routed experts
//! ([`super::qwen3_moe::SparseMoeBlock`]); tied or not by `tie_word_embeddings`. The
//! router keeps 8 bits (`quant_predicate`, in mlx-quant).
use super::config_error;
use super::attention::{Attention, AttentionDims};
use super::decoder::DecoderLayer;
use super::lm::DecoderLm;
use super::qwen3_moe::{drop_head_stack_experts, SparseMoeBlock};
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use mlx_nn::{initialize_rope, Rope};
use serde::Deserialize;
use serde_json::{Map, Value};

/// config.json keys read by Mellum (all required but `rope_parameters`, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i32,
    pub norm_topk_prob: bool,
    pub sliding_window: i32,
    pub layer_types: Vec<String>,
    #[serde(default)]
    pub rope_parameters: Map<String, Value>,
}

/// `_rope_for`: `rope_parameters[kind]`'s `rope_theta`; a `default` or `linear`
/// `rope_type` (the default) gives plain RoPE, any other the scaled one of those
/// parameters.
fn rope_for(kind: &str, args: &ModelArgs) -> crate::Result<Rope> {
    let params = args
        .rope_parameters
        .get(kind)
        .and_then(Value::as_object)
        .ok_or_else(|| config_error("mellum", format!("key `rope_parameters.{kind}` is missing")))?;
    let base = params
        .get("rope_theta")
        .and_then(Value::as_f64)
        .ok_or_else(|| {
            config_error("mellum", format!("key `rope_parameters.{kind}.rope_theta` is missing"))
        })?;
    let rope_type = params
        .get("rope_type")
        .map(|t| {
            t.as_str().ok_or_else(|| {
                config_error("mellum", format!("key `rope_parameters.{kind}.rope_type` is not a string"))
            })
        })
        .transpose()?
        .unwrap_or("default");
    let head_dim = args.head_dim;
    if matches!(rope_type, "default" | "linear") {
        return Ok(initialize_rope(head_dim, base, false, None, None)?);
    }
    let mut scaling = params.clone();
    scaling.insert("type".into(), rope_type.into());
    let scaling = rope_scaling(Some(&Value::Object(scaling)))?;
    let max_positions = Some(args.max_position_embeddings);
    Ok(initialize_rope(head_dim, base, false, scaling.as_ref(), max_positions)?)
}

/// Mellum: the shared decoder with sliding layers and experts in every layer.
pub type Model = DecoderLm<ModelArgs, SparseMoeBlock>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "mellum")?;
    if args.layer_types.len() != args.num_hidden_layers as usize {
        return Err(config_error("mellum", format!(
            "key `layer_types` has {} entries for {} layers",
            args.layer_types.len(),
            args.num_hidden_layers
        )));
    }
    let mut sliding = Vec::new();
    for t in &args.layer_types {
        match t.as_str() {
            "full_attention" => sliding.push(false),
            "sliding_attention" => sliding.push(true),
            _ => return Err(config_error("mellum", format!("unknown layer type {t:?}"))),
        }
    }
    let full_idx = sliding.iter().position(|&s| !s).ok_or_else(|| {
        config_error("mellum", "key `layer_types`: mlx-lm needs a full_attention layer".into())
    })?;
    let (k, n) = (args.num_experts_per_tok, args.num_experts);
    if k < 1 || k > n {
        return Err(config_error("mellum", format!(
            "key `num_experts_per_tok` must be between 1 and `num_experts` ({n}), got {k}"
        )));
    }
    let window = args.sliding_window;
    let model = Model::new(lm_dims!(args), args, |args, i| {
        let d = AttentionDims {
            dim: args.hidden_size,
            n_heads: args.num_attention_heads,
            n_kv_heads: args.num_key_value_heads,
            head_dim: args.head_dim,
            qkv_bias: false,
            o_bias: false,
        };
        let rope = rope_for(&args.layer_types[i as usize], args)?;
        let attn = Attention::with_rms_head_norms(d, rope, args.rms_norm_eps)?;
        let (dim, moe_dim) = (args.hidden_size, args.moe_intermediate_size);
        let topk = (args.num_experts_per_tok, args.norm_topk_prob);
        let moe = SparseMoeBlock::new(dim, moe_dim, args.num_experts, topk.0, topk.1)?;
        DecoderLayer::new(attn, moe, "mlp", dim, args.rms_norm_eps)
    })?;
    Ok(Box::new(model.with_sliding(sliding, window, full_idx)))
}

impl Architecture for Model {
    /// Drops a tied head; where layer 0 holds HF's per-expert weights, stacks each
    /// layer's `experts.{e}.{proj}.weight` into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        let a = &self.args;
        let hf = weights.contains_key("model.layers.0.mlp.experts.0.up_proj.weight");
        let layers = if hf { a.num_hidden_layers } else { 0 };
        drop_head_stack_experts(&mut weights, a.tie_word_embeddings, layers, a.num_experts)?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

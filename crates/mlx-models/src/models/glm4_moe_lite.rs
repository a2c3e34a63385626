//! GLM-4.7-Flash (`glm4_moe_lite`), following `mlx_lm/models/glm4_moe_lite.py`: the
//! DeepSeek-V3 model of [`super::deepseek_v3`] (multi-head latent attention, grouped
//! sigmoid routing) with GLM's defaults, `rms_norm_eps` on the low-rank norms, a router
//! whose normalization adds `1e-20` to the sum, and a `sanitize` that drops the
//! multi-token-prediction layers (index `>= num_hidden_layers`) and reads no FP8 or
//! int4 formats.
use super::deepseek_v3::{Flavor, Model, ModelArgs};
use super::Architecture;
use crate::config::{parse_args, with_defaults};
use serde_json::{json, Value};

/// mlx-lm's `ModelArgs` defaults where they differ from DeepSeek-V3's.
fn defaults() -> Value {
    json!({
        "model_type": "glm4_moe_lite",
        "vocab_size": 154880,
        "hidden_size": 2048,
        "intermediate_size": 10240,
        "moe_intermediate_size": 1536,
        "num_hidden_layers": 47,
        "num_attention_heads": 20,
        "n_shared_experts": 1,
        "n_routed_experts": 64,
        "routed_scaling_factor": 1.8,
        "q_lora_rank": 768,
        "qk_nope_head_dim": 192,
        "v_head_dim": 256,
        "num_experts_per_tok": 4,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 202752,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1_000_000.0,
    })
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let merged = with_defaults(defaults(), config);
    let args: ModelArgs = parse_args(&merged, "glm4_moe_lite")?;
    Ok(Box::new(Model::new(args, Flavor::Glm4MoeLite)?))
}

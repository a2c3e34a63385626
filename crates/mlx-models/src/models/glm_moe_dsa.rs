//! GLM-5 (`glm_moe_dsa`), following `mlx_lm/models/glm_moe_dsa.py`: the DeepSeek-V3.2
//! model of [`super::deepseek_v32`] (multi-head latent attention whose positions an
//! indexer picks, grouped sigmoid routing, `CacheList` caches) read from GLM's config:
//! its `ModelArgs` has no defaults for the model's sizes and routing, takes
//! `rope_scaling` and `rope_theta` from the required `rope_parameters` (whatever
//! `rope_scaling` / `rope_theta` config.json carries), and rotates the indexer's keys
//! interleaved unless `indexer_rope_interleave` says otherwise.
use super::deepseek_v3::{Flavor, Model, ModelArgs};
use super::deepseek_v32::IndexerArgs;
use super::Architecture;
use crate::config::parse_args;
use serde::Deserialize;
use serde_json::Value;

/// The config.json keys mlx-lm's `ModelArgs` requires (read again, with their values,
/// by [`ModelArgs`] and [`IndexerArgs`]); `n_shared_experts` and `n_routed_experts` may
/// be null.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Required {
    model_type: String,
    vocab_size: i32,
    hidden_size: i32,
    index_head_dim: i32,
    index_n_heads: i32,
    index_topk: i32,
    intermediate_size: i32,
    moe_intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    #[serde(deserialize_with = "Option::deserialize")]
    n_shared_experts: Option<i32>,
    #[serde(deserialize_with = "Option::deserialize")]
    n_routed_experts: Option<i32>,
    routed_scaling_factor: f64,
    kv_lora_rank: i32,
    q_lora_rank: i32,
    qk_rope_head_dim: i32,
    v_head_dim: i32,
    qk_nope_head_dim: i32,
    topk_method: String,
    scoring_func: String,
    norm_topk_prob: bool,
    n_group: i32,
    topk_group: i32,
    num_experts_per_tok: i32,
    moe_layer_freq: i32,
    first_k_dense_replace: i32,
    max_position_embeddings: i32,
    rms_norm_eps: f64,
    rope_parameters: RopeParameters,
    attention_bias: bool,
}

/// `rope_parameters["rope_theta"]`, which `__post_init__` reads.
#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: f64,
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let required: Required = parse_args(config, "glm_moe_dsa")?;
    let mut merged = config.clone();
    if let Some(m) = merged.as_object_mut() {
        let params = m.get("rope_parameters").cloned().unwrap_or(Value::Null);
        m.insert("rope_scaling".into(), params);
        m.insert("rope_theta".into(), required.rope_parameters.rope_theta.into());
        m.entry("indexer_rope_interleave").or_insert(true.into());
    }
    let args: ModelArgs = parse_args(&merged, "glm_moe_dsa")?;
    let ix: IndexerArgs = parse_args(&merged, "glm_moe_dsa")?;
    Ok(Box::new(Model::with_indexer(
        args,
        Flavor::DeepseekV32,
        Some(&ix),
    )?))
}

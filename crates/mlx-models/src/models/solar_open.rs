//! Solar Open (`solar_open`), following `mlx_lm/models/solar_open.py`: the GLM-4.5 MoE
//! model of [`super::glm4_moe`] as it is (partial-rotary attention, sigmoid-scored
//! group-limited experts beside shared ones, the untied head, the multi-token-prediction
//! layer dropped) read from Solar Open's config, whose `ModelArgs` default
//! `attention_bias` and `use_qk_norm` to false and `n_group` / `topk_group` to one
//! (glm4_moe's require them). `tie_word_embeddings` is required but not read: the head
//! is always `lm_head`, as in glm4_moe.
use super::glm4_moe::Model;
use super::Architecture;
use crate::config::{parse_args, with_defaults};
use serde_json::{json, Value};

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let defaults = json!({
        "attention_bias": false,
        "use_qk_norm": false,
        "n_group": 1,
        "topk_group": 1,
    });
    let merged = with_defaults(defaults, config);
    Ok(Box::new(Model::new(parse_args(&merged, "solar_open")?)?))
}

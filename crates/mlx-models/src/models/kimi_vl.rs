//! Kimi-VL, text part only, following `mlx_lm/models/kimi_vl.py`: the DeepSeek-V3 text
//! model (its arguments and defaults, from `text_config`) with an untied `lm_head` under
//! `language_model`, held as Kimi K2.5's ([`super::kimi_k25::Model`]) with Kimi-VL's own
//! `sanitize` (`Layout::Vl`); the routers' `e_score_correction_bias` keeps its dtype
//! (`cast_predicate`).
use super::kimi_k25::{Layout, Model};
use super::Architecture;
use crate::config::parse_args;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Kimi-VL (both required).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub text_config: serde_json::Map<String, Value>,
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "kimi_vl")?;
    Model::boxed(args.model_type, args.text_config, Layout::Vl)
}

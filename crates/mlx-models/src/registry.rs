//! `model_type` -> architecture, with mlx-lm's aliases (`MODEL_REMAPPING`).
use crate::error::{Error, Result};
use crate::models::{Architecture, ARCHITECTURES};
use serde_json::Value;

/// `model_type`s served by another architecture's file (mlx-lm `MODEL_REMAPPING`).
const ALIASES: &[(&str, &str)] = &[
    ("mistral", "llama"),
    ("iquestcoder", "llama"),
    ("xverse", "llama"),
    ("qwen2_5_vl", "qwen2_vl"),
    ("falcon_mamba", "mamba"),
    ("kimi_k2", "deepseek_v3"),
    ("joyai_llm_flash", "deepseek_v3"),
];

/// The architecture file a `model_type` resolves to.
pub fn resolve(model_type: &str) -> &str {
    ALIASES
        .iter()
        .find(|(a, _)| *a == model_type)
        .map_or(model_type, |(_, t)| t)
}

/// Every accepted `model_type` (architectures and aliases), sorted.
pub fn supported_model_types() -> Vec<String> {
    let mut v: Vec<String> = ARCHITECTURES
        .iter()
        .map(|(n, _)| n.to_string())
        .chain(ALIASES.iter().map(|(a, _)| a.to_string()))
        .collect();
    v.sort();
    v
}

/// Builds the architecture named by `config["model_type"]` with zero placeholder weights.
pub fn build_model(config: &Value) -> Result<Box<dyn Architecture>> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::Config {
            path: "config.json".into(),
            message: "key `model_type` is missing or not a string".into(),
        })?;
    let target = resolve(model_type);
    match ARCHITECTURES.iter().find(|(n, _)| *n == target) {
        Some((_, build)) => build(config),
        None => Err(Error::UnknownModelType {
            model_type: model_type.to_string(),
            supported: supported_model_types(),
        }),
    }
}

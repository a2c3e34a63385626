//! `model_type` -> architecture, with mlx-lm's aliases (`MODEL_REMAPPING`).
use crate::error::{Error, Result};
use crate::models::{self, Architecture};
use serde_json::Value;

type Builder = fn(&Value) -> Result<Box<dyn Architecture>>;

/// Every architecture, by the `model_type` of its mlx-lm file.
const ARCHITECTURES: &[(&str, Builder)] = &[
    ("cohere2", models::cohere2::build),
    ("exaone4", models::exaone4::build),
    ("gemma", models::gemma::build),
    ("gemma2", models::gemma2::build),
    ("gemma3", models::gemma3::build),
    ("gemma3_text", models::gemma3_text::build),
    ("glm4", models::glm4::build),
    ("gpt_oss", models::gpt_oss::build),
    ("granite", models::granite::build),
    ("granitemoehybrid", models::granitemoehybrid::build),
    ("lfm2", models::lfm2::build),
    ("llama", models::llama::build),
    ("mamba", models::mamba::build),
    ("mamba2", models::mamba2::build),
    ("ministral3", models::ministral3::build),
    ("mistral3", models::mistral3::build),
    ("mixtral", models::mixtral::build),
    ("nemotron_h", models::nemotron_h::build),
    ("olmo2", models::olmo2::build),
    ("olmo3", models::olmo3::build),
    ("phi3", models::phi3::build),
    ("qwen2", models::qwen2::build),
    ("qwen2_moe", models::qwen2_moe::build),
    ("qwen3", models::qwen3::build),
    ("qwen3_5", models::qwen3_5::build),
    ("qwen3_5_moe", models::qwen3_5::build_moe),
    ("qwen3_moe", models::qwen3_moe::build),
    ("qwen3_next", models::qwen3_next::build),
    ("seed_oss", models::seed_oss::build),
    ("smollm3", models::smollm3::build),
    ("starcoder2", models::starcoder2::build),
];

/// `model_type`s served by another architecture's file (mlx-lm `MODEL_REMAPPING`).
const ALIASES: &[(&str, &str)] = &[
    ("mistral", "llama"),
    ("iquestcoder", "llama"),
    ("xverse", "llama"),
    ("falcon_mamba", "mamba"),
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

//! Seed-OSS, following `mlx_lm/models/seed_oss.py`: Llama's layers with a separate
//! `attention_out_bias` for `o_proj`, and no `make_cache` of its own.
use super::{llama, Architecture};
use crate::config::parse_args;
use serde::Deserialize;
use serde_json::Value;

/// The key Seed-OSS adds to Llama's.
#[derive(Debug, Clone, Deserialize)]
struct OutBias {
    #[serde(default)]
    attention_out_bias: bool,
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let extra: OutBias = parse_args(config, "seed_oss")?;
    let args = parse_args(config, "seed_oss")?;
    Ok(Box::new(llama::Model::seed_oss(
        args,
        extra.attention_out_bias,
    )?))
}

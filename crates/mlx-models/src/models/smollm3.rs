//! SmolLM3, following `mlx_lm/models/smollm3.py`: Llama whose layers listed as 0 in
//! `no_rope_layers` (by default every `no_rope_layer_interval`-th) attend without
//! rotary embeddings.
use super::{llama, Architecture};
use crate::config::parse_args;
use serde::Deserialize;
use serde_json::Value;

/// config.json keys SmolLM3 adds to Llama's.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct NoPeArgs {
    pub num_hidden_layers: i32,
    #[serde(default = "default_interval")]
    pub no_rope_layer_interval: i32,
    /// One flag per layer: 1 keeps the rotary embedding, 0 drops it.
    #[serde(default)]
    pub no_rope_layers: Option<Vec<i32>>,
}

fn default_interval() -> i32 {
    4
}

impl NoPeArgs {
    /// Whether each layer keeps its rotary embedding (mlx-lm's `__post_init__`).
    pub fn uses_rope(&self) -> crate::Result<Vec<bool>> {
        let n = self.num_hidden_layers.max(0) as usize;
        match &self.no_rope_layers {
            Some(flags) if flags.len() != n => Err(crate::Error::Config {
                path: "config.json (smollm3)".into(),
                message: format!(
                    "key `no_rope_layers` has {} entries for {n} layers",
                    flags.len()
                ),
            }),
            Some(flags) => Ok(flags.iter().map(|&f| f != 0).collect()),
            None if self.no_rope_layer_interval <= 0 => Err(crate::Error::Config {
                path: "config.json (smollm3)".into(),
                message: format!(
                    "key `no_rope_layer_interval` must be positive, got {}",
                    self.no_rope_layer_interval
                ),
            }),
            None => Ok((0..n as i32)
                .map(|i| (i + 1) % self.no_rope_layer_interval != 0)
                .collect()),
        }
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let nope: NoPeArgs = parse_args(config, "smollm3")?;
    let model = llama::Model::new(parse_args(config, "smollm3")?)?;
    Ok(Box::new(model.into_smollm3(&nope.uses_rope()?)))
}

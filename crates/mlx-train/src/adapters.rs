//! An adapter directory as `mlx_lm.lora` writes it: `adapter_config.json` (the training
//! arguments, among them `fine_tune_type`, `num_layers` and `lora_parameters`) and
//! `adapters.safetensors` (the trained parameters under the model's dotted names:
//! `<layer>.lora_a` / `<layer>.lora_b`, DoRA's `<layer>.m`, or whole weights for a full
//! fine-tune).
use crate::error::{Result, TrainError};
use mlx_array::Array;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How the adapters were trained (`fine_tune_type`, `lora` when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FineTuneType {
    /// Low-rank `lora_a` / `lora_b` pairs.
    Lora,
    /// LoRA pairs plus a magnitude vector `m` per layer.
    Dora,
    /// Whole weights of the trained layers.
    Full,
}

impl FineTuneType {
    /// mlx-lm's name.
    pub fn name(self) -> &'static str {
        match self {
            FineTuneType::Lora => "lora",
            FineTuneType::Dora => "dora",
            FineTuneType::Full => "full",
        }
    }
}

/// `lora_parameters` of the config (LoRA and DoRA).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraParameters {
    /// Rank of the low-rank pairs.
    pub rank: i64,
    /// The factor of the low-rank update (mlx-lm's `scale`, not an `alpha`).
    pub scale: f64,
    /// Dropout during training (no effect on fusing).
    pub dropout: f64,
    /// The layer keys adapted, when given.
    pub keys: Option<Vec<String>>,
}

/// `adapter_config.json`.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// The fine-tune type.
    pub fine_tune_type: FineTuneType,
    /// Layers adapted, counted from the last (`num_layers`).
    pub num_layers: Option<i64>,
    /// The LoRA parameters (`None` for a full fine-tune).
    pub lora: Option<LoraParameters>,
    /// The whole file.
    pub raw: Map<String, Value>,
}

/// A loaded adapter directory.
pub struct Adapters {
    /// The directory.
    pub dir: PathBuf,
    /// Its config.
    pub config: AdapterConfig,
    /// `adapters.safetensors`, by parameter name.
    pub weights: BTreeMap<String, Array>,
}

fn config_err(path: &Path, message: impl Into<String>) -> TrainError {
    TrainError::Config {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl AdapterConfig {
    /// Parses `adapter_config.json` (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<AdapterConfig> {
        let raw = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(config_err(path, "not a JSON object")),
            Err(e) => return Err(config_err(path, format!("not valid JSON: {e}"))),
        };
        let fine_tune_type = match raw.get("fine_tune_type") {
            None | Some(Value::Null) => FineTuneType::Lora,
            Some(Value::String(s)) => match s.as_str() {
                "lora" => FineTuneType::Lora,
                "dora" => FineTuneType::Dora,
                "full" => FineTuneType::Full,
                other => {
                    return Err(config_err(
                        path,
                        format!("fine_tune_type {other:?} is not one of lora, dora, full"),
                    ))
                }
            },
            Some(v) => {
                return Err(config_err(
                    path,
                    format!("fine_tune_type {v} is not a string"),
                ))
            }
        };
        let num_layers = match raw.get("num_layers") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .ok_or_else(|| config_err(path, format!("num_layers {v} is not an integer")))?,
            ),
        };
        let lora = if fine_tune_type == FineTuneType::Full {
            None
        } else {
            Some(lora_parameters(&raw, path)?)
        };
        Ok(AdapterConfig {
            fine_tune_type,
            num_layers,
            lora,
            raw,
        })
    }
}

fn lora_parameters(raw: &Map<String, Value>, path: &Path) -> Result<LoraParameters> {
    let p = match raw.get("lora_parameters") {
        Some(Value::Object(p)) => p,
        Some(v) => {
            return Err(config_err(
                path,
                format!("lora_parameters {v} is not an object"),
            ))
        }
        None => {
            return Err(config_err(
                path,
                "no lora_parameters (a LoRA or DoRA adapter needs its rank and scale)",
            ))
        }
    };
    let number = |key: &str| -> Result<Option<f64>> {
        match p.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                config_err(path, format!("lora_parameters.{key} {v} is not a number"))
            }),
        }
    };
    let scale = number("scale")?.ok_or_else(|| {
        let hint = if p.contains_key("alpha") {
            " (it has `alpha`: mlx-lm's LoRA config uses `scale`, not `alpha`)"
        } else {
            ""
        };
        config_err(path, format!("lora_parameters has no `scale`{hint}"))
    })?;
    let rank = match p.get("rank") {
        Some(v) => v.as_i64().filter(|&r| r > 0).ok_or_else(|| {
            config_err(
                path,
                format!("lora_parameters.rank {v} is not a positive integer"),
            )
        })?,
        None => return Err(config_err(path, "lora_parameters has no `rank`")),
    };
    let keys = match p.get("keys") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|k| {
                    k.as_str().map(str::to_string).ok_or_else(|| {
                        config_err(
                            path,
                            format!("lora_parameters.keys holds {k}, not a string"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        ),
        Some(v) => {
            return Err(config_err(
                path,
                format!("lora_parameters.keys {v} is not a list"),
            ))
        }
    };
    Ok(LoraParameters {
        rank,
        scale,
        dropout: number("dropout")?.unwrap_or(0.0),
        keys,
    })
}

impl Adapters {
    /// The LoRA / DoRA `scale` (an error for a full fine-tune, which has none).
    pub fn lora_scale(&self) -> Result<f64> {
        self.config.lora.as_ref().map(|l| l.scale).ok_or_else(|| {
            TrainError::Unsupported(format!(
                "{}: {} adapters have no lora_parameters",
                self.dir.display(),
                self.config.fine_tune_type.name()
            ))
        })
    }

    /// Reads `dir/adapter_config.json` and `dir/adapters.safetensors` (mlx-lm's
    /// `load_adapters` without the model: [`crate::fuse`] checks the fit).
    pub fn load(dir: impl AsRef<Path>) -> Result<Adapters> {
        let dir = dir.as_ref();
        if !dir.exists() {
            return Err(config_err(dir, "the adapter path does not exist"));
        }
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|source| TrainError::Io {
            path: cfg_path.clone(),
            source,
        })?;
        let config = AdapterConfig::parse(&text, &cfg_path)?;
        let weights_path = dir.join("adapters.safetensors");
        if !weights_path.is_file() {
            return Err(config_err(
                &weights_path,
                "no such file (the trained adapter weights)",
            ));
        }
        let (weights, _) = mlx_array::io::load_safetensors(&weights_path)?;
        if weights.is_empty() {
            return Err(config_err(&weights_path, "holds no tensors"));
        }
        // Read now: a lazy array belongs to the stream (thread) it was made on, and the
        // adapters may be used on another (the server's engine thread).
        mlx_array::transforms::eval(&weights.values().collect::<Vec<_>>())?;
        Ok(Adapters {
            dir: dir.to_path_buf(),
            config,
            weights,
        })
    }
}

//! Which layers of a checkpoint are quantized and how: the `class_predicate` of
//! mlx-lm's `load_model` (per-layer entries of `quantization`, else the presence of
//! `<path>.scales`, with group size, bits and mode inferred from the shapes).
use crate::error::{Error, Result};
use crate::models::Weights;
use mlx_array::quant::QuantMode;
use mlx_array::Dtype;
use mlx_nn::{QuantSpec, Quantizable};
use serde_json::{Map, Value};

/// The `quantization` section after legacy `quantization_config` handling.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizationConfig {
    /// Top-level group size, bits and mode.
    pub default: QuantSpec,
    /// The whole section (per-layer entries keyed by module path).
    pub section: Map<String, Value>,
}

fn mode_of(m: &Map<String, Value>) -> Result<QuantMode> {
    match m.get("mode").and_then(Value::as_str) {
        Some(s) => Ok(QuantMode::parse(s)?),
        None => Ok(QuantMode::Affine),
    }
}

fn int_of(m: &Map<String, Value>, key: &str) -> Option<i32> {
    m.get(key).and_then(Value::as_i64).map(|v| v as i32)
}

/// mlx.nn's `to_quantized(**params)`: absent values take the mode's defaults.
fn spec_of(m: &Map<String, Value>) -> Result<QuantSpec> {
    Ok(QuantSpec::new(
        int_of(m, "group_size"),
        int_of(m, "bits"),
        mode_of(m)?,
    ))
}

impl QuantizationConfig {
    /// Reads the quantization of a config the way mlx-lm's `load_model` does: the
    /// `quantization` section, else a legacy `quantization_config` (`mxfp4`, `mxfp8`,
    /// `fp8` with ue8m0 32x32 blocks, `modelopt` NVFP4; other methods are errors).
    pub fn from_config(config: &Value) -> Result<Option<QuantizationConfig>> {
        if let Some(q) = config.get("quantization").filter(|v| !v.is_null()) {
            let section = q.as_object().cloned().ok_or_else(|| Error::Config {
                path: "config.json".into(),
                message: "key `quantization` is not an object".into(),
            })?;
            let need = |k: &str| {
                int_of(&section, k).ok_or_else(|| Error::Config {
                    path: "config.json".into(),
                    message: format!("key `quantization.{k}` is missing or not an integer"),
                })
            };
            let default = QuantSpec {
                group_size: need("group_size")?,
                bits: need("bits")?,
                mode: mode_of(&section)?,
            };
            return Ok(Some(QuantizationConfig { default, section }));
        }
        let qc = config.get("quantization_config").or_else(|| {
            config
                .get("text_config")
                .and_then(|t| t.get("quantization_config"))
        });
        let Some(qc) = qc.filter(|v| v.is_object()) else {
            return Ok(None);
        };
        let method = qc.get("quant_method").and_then(Value::as_str).unwrap_or("");
        let spec = match method {
            "mxfp4" => QuantSpec {
                group_size: 32,
                bits: 4,
                mode: QuantMode::Mxfp4,
            },
            "mxfp8" => QuantSpec {
                group_size: 32,
                bits: 8,
                mode: QuantMode::Mxfp8,
            },
            "fp8"
                if qc.get("scale_fmt").and_then(Value::as_str) == Some("ue8m0")
                    && qc.get("weight_block_size") == Some(&serde_json::json!([32, 32])) =>
            {
                QuantSpec {
                    group_size: 32,
                    bits: 8,
                    mode: QuantMode::Mxfp8,
                }
            }
            "modelopt" => {
                let settings = qc.get("quantization").unwrap_or(qc);
                let algo = settings
                    .get("quant_algo")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if algo != "NVFP4" {
                    return Err(Error::Quantization(format!(
                        "unsupported modelopt quant_algo `{algo}`"
                    )));
                }
                let g = settings
                    .get("group_size")
                    .and_then(Value::as_i64)
                    .unwrap_or(16) as i32;
                QuantSpec {
                    group_size: g,
                    bits: 4,
                    mode: QuantMode::Nvfp4,
                }
            }
            other => {
                return Err(Error::Quantization(format!(
                    "quant_method `{other}` is not supported (mlx-community checkpoints carry a \
                     `quantization` section; mxfp4, mxfp8 and modelopt NVFP4 are also read)"
                )))
            }
        };
        let mut section = Map::new();
        section.insert("group_size".into(), spec.group_size.into());
        section.insert("bits".into(), spec.bits.into());
        section.insert("mode".into(), spec.mode.name().into());
        Ok(Some(QuantizationConfig {
            default: spec,
            section,
        }))
    }

    /// mlx-lm's `class_predicate(path, module)` for a layer that can be quantized.
    pub fn spec_for(
        &self,
        path: &str,
        layer: &dyn Quantizable,
        weights: &Weights,
    ) -> Result<Option<QuantSpec>> {
        if let Some(v) = self.section.get(path) {
            return match v {
                Value::Bool(false) | Value::Null => Ok(None),
                Value::Bool(true) => Ok(Some(self.default)),
                Value::Object(m) if m.is_empty() => Ok(None),
                Value::Object(m) => Ok(Some(spec_of(m)?)),
                other => Err(Error::Config {
                    path: "config.json".into(),
                    message: format!(
                        "key `quantization.{path}`: expected an object or a bool, got {other}"
                    ),
                }),
            };
        }
        if !weights.contains_key(&format!("{path}.scales")) {
            return Ok(None);
        }
        if weights.contains_key(&format!("{path}.global_scale")) {
            return Err(Error::Quantization(format!(
                "{path}: nvfp4 global scales are not supported"
            )));
        }
        infer_quant_spec(path, layer, weights).map(Some)
    }
}

/// mlx-lm's `infer_quant_config`: group size and bits from the shapes of the packed
/// weight and the scales; uint8 scales mean one of the floating-point modes.
pub fn infer_quant_spec(
    path: &str,
    layer: &dyn Quantizable,
    weights: &Weights,
) -> Result<QuantSpec> {
    let missing = |what: &str| Error::Quantization(format!("{path}: `{path}.{what}` is missing"));
    let scales = weights
        .get(&format!("{path}.scales"))
        .ok_or_else(|| missing("scales"))?;
    let weight = weights
        .get(&format!("{path}.weight"))
        .ok_or_else(|| missing("weight"))?;
    let in_dims = layer.dense_weight_shape().last().copied().unwrap_or(0);
    let n_groups = scales.shape().last().copied().unwrap_or(0);
    let packed = weight.shape().last().copied().unwrap_or(0);
    if in_dims <= 0 || n_groups <= 0 {
        return Err(Error::Quantization(format!(
            "{path}: cannot infer the group size from the scales"
        )));
    }
    let group_size = in_dims / n_groups;
    let bits = packed * 32 / in_dims;
    if scales.dtype() != Dtype::Uint8 {
        return Ok(QuantSpec {
            group_size,
            bits,
            mode: QuantMode::Affine,
        });
    }
    let mode = match (bits, group_size) {
        (4, 16) => QuantMode::Nvfp4,
        (4, 32) => QuantMode::Mxfp4,
        (8, 32) => QuantMode::Mxfp8,
        _ => {
            return Err(Error::Quantization(format!(
                "cannot infer the quantization mode of {path}: {bits} bits with group size {group_size}"
            )))
        }
    };
    Ok(QuantSpec {
        group_size,
        bits,
        mode,
    })
}

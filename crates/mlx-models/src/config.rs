//! Reading config.json sections into typed arguments.
use crate::error::{Error, Result};
use mlx_nn::RopeScaling;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// Deserializes a model's arguments from its config, ignoring unknown keys; a missing
/// or mistyped key is an error naming the key.
pub fn parse_args<T: DeserializeOwned>(config: &Value, what: &str) -> Result<T> {
    serde_path_to_error::deserialize(config).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let message = if path.is_empty() || path == "." {
            inner
        } else {
            format!("key `{path}`: {inner}")
        };
        Error::Config {
            path: format!("config.json ({what})"),
            message,
        }
    })
}

/// What stands for Python's `Infinity` in a config read by [`parse_python_json`]: the
/// largest finite `f64` (JSON values cannot hold an infinity). Every use casts it to a
/// model's float type, where it is infinite again; `mlx-quant`'s config writer spells
/// it `Infinity` again, as Python's `json.dump` writes an infinity.
pub const JSON_INFINITY: f64 = f64::MAX;

/// Parses JSON as Python's `json.loads` does (mlx-lm reads config.json so): besides
/// standard JSON it takes the bare words `Infinity` and `-Infinity` (Mamba-2 checkpoints
/// write `"time_step_limit": [0.0, Infinity]`), read as `±`[`JSON_INFINITY`]. `NaN` is
/// refused with its line (no JSON value holds it, and no config means it).
pub fn parse_python_json(text: &str) -> std::result::Result<Value, String> {
    let first = match serde_json::from_str(text) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let mut out = String::with_capacity(text.len() + 32);
    let mut changed = false;
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else {
            let word = |w: &str| {
                rest.starts_with(w)
                    && !rest[w.len()..]
                        .chars()
                        .next()
                        .is_some_and(|n| n.is_ascii_alphanumeric() || n == '_')
            };
            if let Some((w, v)) = [("-Infinity", -JSON_INFINITY), ("Infinity", JSON_INFINITY)]
                .into_iter()
                .find(|(w, _)| word(w))
            {
                out.push_str(&format!("{v:e}"));
                rest = &rest[w.len()..];
                changed = true;
                continue;
            }
            if word("NaN") || word("-NaN") {
                let line = text[..text.len() - rest.len()].matches('\n').count() + 1;
                return Err(format!(
                    "NaN at line {line}: a JSON value cannot hold it (only Infinity and -Infinity \
                     are read beyond standard JSON)"
                ));
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    if !changed {
        return Err(first.to_string());
    }
    serde_json::from_str(&out).map_err(|e| e.to_string())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FloatOrList {
    One(f64),
    Many(Vec<f64>),
}

impl FloatOrList {
    fn into_vec(self) -> Vec<f64> {
        match self {
            FloatOrList::One(v) => vec![v],
            FloatOrList::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
struct RopeScalingJson {
    #[serde(rename = "type")]
    ty: Option<String>,
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
    short_factor: Option<FloatOrList>,
    long_factor: Option<FloatOrList>,
    partial_rotary_factor: Option<f64>,
}

/// Reads a `rope_scaling` (or `rope_parameters`) section; the type is `type`, else
/// `rope_type`, else `default`, as in mlx-lm's `initialize_rope`.
pub fn rope_scaling(v: Option<&Value>) -> Result<Option<RopeScaling>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let j: RopeScalingJson = parse_args(v, "rope_scaling")?;
    Ok(Some(RopeScaling {
        rope_type: j
            .ty
            .filter(|t| !t.is_empty())
            .or(j.rope_type)
            .unwrap_or_else(|| "default".into()),
        factor: j.factor,
        low_freq_factor: j.low_freq_factor,
        high_freq_factor: j.high_freq_factor,
        original_max_position_embeddings: j.original_max_position_embeddings,
        beta_fast: j.beta_fast,
        beta_slow: j.beta_slow,
        mscale: j.mscale,
        mscale_all_dim: j.mscale_all_dim,
        short_factor: j.short_factor.map(FloatOrList::into_vec),
        long_factor: j.long_factor.map(FloatOrList::into_vec),
        partial_rotary_factor: j.partial_rotary_factor,
    }))
}

/// A size given once for every layer or once per layer (mlx-lm's `int | list` keys).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
#[allow(missing_docs)]
pub enum PerLayer {
    One(i32),
    Each(Vec<i32>),
}

impl PerLayer {
    /// Layer `i`'s value (`arg[i] if isinstance(arg, list) else arg`); a list without
    /// an entry for it is a config error naming `key` of `model`.
    pub(crate) fn at(&self, i: usize, key: &str, model: &str) -> Result<i32> {
        match self {
            PerLayer::One(n) => Ok(*n),
            PerLayer::Each(v) => v.get(i).copied().ok_or_else(|| Error::Config {
                path: format!("config.json ({model})"),
                message: format!("key `{key}` has no entry for layer {i}"),
            }),
        }
    }
}

pub(crate) fn default_true() -> bool {
    true
}

/// `config` over `defaults`: the keys of a file's `ModelArgs` defaults that config.json
/// leaves out filled in (config.json wins where it has the key).
pub(crate) fn with_defaults(mut defaults: Value, config: &Value) -> Value {
    if let (Some(m), Some(c)) = (defaults.as_object_mut(), config.as_object()) {
        m.extend(c.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    defaults
}

#[cfg(test)]
mod python_json_tests {
    use super::*;

    #[test]
    fn infinities_outside_strings_read_as_python_reads_them() {
        let v = parse_python_json(
            r#"{"time_step_limit": [0.0, Infinity], "lo": -Infinity, "s": "Infinity \" NaN"}"#,
        )
        .unwrap();
        assert_eq!(v["time_step_limit"][1].as_f64(), Some(JSON_INFINITY));
        assert_eq!(v["lo"].as_f64(), Some(-JSON_INFINITY));
        assert_eq!(v["s"].as_str(), Some("Infinity \" NaN"));
        // Cast to a model's float type, it is infinite again.
        assert!((JSON_INFINITY as f32).is_infinite());
    }

    #[test]
    fn nan_and_broken_json_are_errors_naming_the_problem() {
        let e = parse_python_json("{\n\"a\": NaN}").unwrap_err();
        assert!(e.contains("NaN at line 2"), "{e}");
        let e = parse_python_json("{\"a\": Infinityy}").unwrap_err();
        assert!(e.contains("expected value"), "{e}");
        let e = parse_python_json("{\"a\": 1,}").unwrap_err();
        assert!(e.contains("trailing comma"), "{e}");
    }
}

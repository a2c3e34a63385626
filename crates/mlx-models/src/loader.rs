//! Loading a model directory the way mlx-lm's `utils.load_model` does: config.json,
//! `model*.safetensors` (sharded or not), per-architecture sanitize, quantized layers
//! from the `quantization` section, strict weight loading.
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::models::Weights;
use crate::quantization::QuantizationConfig;
use crate::registry::build_model;
use mlx_array::Dtype;
use mlx_nn::{dequantize_module, quantize_module, Module};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Options beyond what mlx-lm does at load time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// Replace quantized layers with dense ones and, for a quantized checkpoint, bring
    /// every floating parameter to `dtype`, else float32: MLX's CPU quantized matmul is
    /// slow, so CPU runs prefer dense float32 weights there. A checkpoint that is not
    /// quantized keeps its dtypes (MLX's CPU bf16 matmul is faster than float32 here).
    pub dequantize: bool,
    /// Cast every floating-point parameter to this dtype after loading (mlx-lm keeps
    /// the checkpoint's dtypes; this is `convert --dtype` applied at load).
    pub dtype: Option<Dtype>,
    /// Leave the weights unevaluated (read from disk on first use).
    pub lazy: bool,
    /// Keep every projection its own matmul in decoding steps. By default the dense
    /// (not quantized) projections that read the same input (q/k/v, gate/up of Llama,
    /// Mistral, Qwen2, Qwen3) are concatenated at load so a decoding step runs one matmul
    /// for them (`mlx_nn::FusedLinears`: fewer graph nodes per token, the same values).
    pub unfused: bool,
}

/// The parsed configuration of a loaded model.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// `model_type` as written in config.json.
    pub model_type: String,
    /// config.json, with `eos_token_id` from generation_config.json as mlx-lm merges it.
    pub raw: Value,
    /// The quantization the checkpoint was loaded with, if any.
    pub quantization: Option<QuantizationConfig>,
}

/// Loads `dir` with default options.
pub fn load_model(dir: impl AsRef<Path>) -> Result<(Box<dyn LanguageModel>, ModelConfig)> {
    load_model_with(dir, &LoadOptions::default())
}

/// Loads `dir`: see the module docs.
pub fn load_model_with(
    dir: impl AsRef<Path>,
    options: &LoadOptions,
) -> Result<(Box<dyn LanguageModel>, ModelConfig)> {
    let dir = dir.as_ref();
    let raw = load_config(dir)?;
    if raw.get("quantize_activations").and_then(Value::as_bool) == Some(true) {
        return Err(Error::Quantization(
            "activation quantization (`quantize_activations`, mlx.nn QQLinear) is not supported"
                .into(),
        ));
    }
    let weights = load_weights(dir)?;
    let mut model = build_model(&raw)?;
    let weights = model.sanitize(weights)?;
    let quantization = QuantizationConfig::from_config(&raw)?;
    if let Some(q) = &quantization {
        quantize_module(model.as_mut(), &mut |path, layer| {
            q.spec_for(path, layer, &weights)
                .map_err(|e| mlx_nn::Error::Quantization {
                    path: path.to_string(),
                    message: e.to_string(),
                })
        })?;
    }
    model.load_weights(weights, true)?;
    let dtype = match (options.dtype, options.dequantize, &quantization) {
        (Some(d), _, _) => Some(d),
        (None, true, Some(_)) => Some(Dtype::Float32),
        _ => None,
    };
    if options.dequantize {
        dequantize_module(model.as_mut(), dtype)?;
    }
    if let Some(dtype) = dtype {
        model.cast_floating(dtype)?;
    }
    if !options.lazy {
        model.eval_parameters()?;
        if !options.unfused {
            model.fuse_projections()?;
            // The separate weights the fused buffers replaced sit in MLX's buffer cache.
            mlx_array::memory::clear_cache();
        }
    }
    let model_type = raw
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok((
        model.into_language_model(),
        ModelConfig {
            model_type,
            raw,
            quantization,
        },
    ))
}

/// mlx-lm's `load_config`: config.json plus generation_config.json's `eos_token_id`.
pub fn load_config(dir: &Path) -> Result<Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Config {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let mut config: Value =
        crate::config::parse_python_json(&text).map_err(|message| Error::Config {
            path: path.display().to_string(),
            message,
        })?;
    if !config.is_object() {
        return Err(Error::Config {
            path: path.display().to_string(),
            message: "not a JSON object".into(),
        });
    }
    let gen = dir.join("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(gen) {
        if let Ok(g) = crate::config::parse_python_json(&text) {
            if let Some(eos) = g
                .get("eos_token_id")
                .filter(|v| !v.is_null() && v != &&Value::Bool(false))
            {
                config["eos_token_id"] = eos.clone();
            }
        }
    }
    Ok(config)
}

/// The weight files of `dir`: every `model*.safetensors` (mlx-lm's glob); when an
/// index is present, each shard it names must exist.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::Weights {
            path: index.clone(),
            message: e.to_string(),
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| Error::Weights {
            path: index.clone(),
            message: e.to_string(),
        })?;
        if let Some(map) = v.get("weight_map").and_then(Value::as_object) {
            for (tensor, file) in map {
                let f = dir.join(file.as_str().unwrap_or_default());
                if !f.is_file() {
                    return Err(Error::Weights {
                        path: f,
                        message: format!("shard listed in the index for `{tensor}` is missing"),
                    });
                }
            }
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Weights {
            path: dir.to_path_buf(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.starts_with("model") && name.ends_with(".safetensors") && p.is_file()
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::Weights {
            path: dir.to_path_buf(),
            message: "no model*.safetensors files".into(),
        });
    }
    Ok(files)
}

/// Reads every tensor of the model's weight files, checking each file's header first.
pub fn load_weights(dir: &Path) -> Result<Weights> {
    let mut weights = Weights::new();
    for file in weight_files(dir)? {
        check_safetensors(&file)?;
        let (arrays, _) = mlx_array::io::load_safetensors(&file).map_err(|e| Error::Weights {
            path: file.clone(),
            message: e.to_string(),
        })?;
        weights.extend(arrays);
    }
    Ok(weights)
}

fn dtype_size(name: &str) -> Option<u64> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// Validates a safetensors header against the file: every tensor's byte range must lie
/// inside the file and match its shape and dtype (a truncated download fails here,
/// naming the first tensor that does not fit, instead of at evaluation time).
pub fn check_safetensors(path: &Path) -> Result<()> {
    use std::io::Read;
    let err = |message: String| Error::Weights {
        path: path.to_path_buf(),
        message,
    };
    let mut f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let file_len = f.metadata().map_err(|e| err(e.to_string()))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| err("file is shorter than a safetensors header".into()))?;
    let n = u64::from_le_bytes(len);
    if n > file_len.saturating_sub(8) || n > 100 << 20 {
        return Err(err(format!(
            "header length {n} exceeds the file size {file_len}"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| err(format!("cannot read the header: {e}")))?;
    let v: Value =
        serde_json::from_slice(&header).map_err(|e| err(format!("corrupt header: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| err("corrupt header: not an object".into()))?;
    let data_len = file_len - 8 - n;
    for (name, t) in obj.iter().filter(|(k, _)| k.as_str() != "__metadata__") {
        let dtype = t.get("dtype").and_then(Value::as_str).unwrap_or_default();
        let size = dtype_size(dtype)
            .ok_or_else(|| err(format!("tensor `{name}`: unknown dtype `{dtype}`")))?;
        let shape: Option<Vec<u64>> = t
            .get("shape")
            .and_then(Value::as_array)
            .map(|s| s.iter().filter_map(Value::as_u64).collect());
        let offsets: Option<Vec<u64>> = t
            .get("data_offsets")
            .and_then(Value::as_array)
            .map(|s| s.iter().filter_map(Value::as_u64).collect());
        let (Some(shape), Some(off)) = (shape, offsets) else {
            return Err(err(format!("tensor `{name}`: corrupt header entry")));
        };
        if off.len() != 2 || off[0] > off[1] {
            return Err(err(format!("tensor `{name}`: bad data offsets {off:?}")));
        }
        let expected = shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| err(format!("tensor `{name}`: shape {shape:?} is too large")))?;
        if off[1] - off[0] != expected {
            return Err(err(format!(
                "tensor `{name}`: {} bytes for shape {shape:?} of {dtype} (expected {expected})",
                off[1] - off[0]
            )));
        }
        if off[1] > data_len {
            return Err(err(format!(
                "tensor `{name}` ends at byte {} but the file holds {data_len} data bytes (truncated?)",
                off[1]
            )));
        }
    }
    Ok(())
}

//! The model-level steps of `mlx_lm.convert`: loading (lazily), the dtype cast,
//! `quantize_model`, `dequantize_model` and the bits-per-weight count.
use crate::error::{QuantError, Result};
use crate::predicate::LayerChoice;
use mlx_array::quant::QuantMode;
use mlx_array::{Array, Dtype};
use mlx_models::{LanguageModel, LoadOptions, QuantizationConfig};
use mlx_nn::{Module, QuantSpec};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The dtypes `mlx_lm.convert --dtype` accepts (`MODEL_CONVERSION_DTYPES`).
pub const CONVERSION_DTYPES: [Dtype; 3] = [Dtype::Float16, Dtype::Bfloat16, Dtype::Float32];

/// A model loaded for conversion, with the config mlx-lm would save.
pub struct LoadedModel {
    /// The model (weights unevaluated: read from disk when first needed).
    pub model: Box<dyn LanguageModel>,
    /// config.json as mlx-lm's `load_model` leaves it (generation_config's `eos_token_id`
    /// merged, legacy `quantization_config` methods turned into a `quantization` section).
    pub config: Map<String, Value>,
}

impl LoadedModel {
    /// The model's parameter tree.
    pub fn module(&self) -> Result<&dyn Module> {
        self.model
            .as_module()
            .ok_or_else(|| no_tree(self.model.model_type()))
    }

    /// The model's parameter tree, mutably.
    pub fn module_mut(&mut self) -> Result<&mut dyn Module> {
        let ty = self.model.model_type().to_string();
        self.model.as_module_mut().ok_or_else(|| no_tree(&ty))
    }
}

fn no_tree(model_type: &str) -> QuantError {
    QuantError::Unsupported(format!(
        "model type `{model_type}` does not expose its parameters, so it cannot be converted"
    ))
}

/// What mlx-lm's model arguments change in the config dict they were read from (and so
/// in the config `mlx_lm.convert` saves): qwen3_5's `__post_init__` renames
/// `rope_parameters.rope_type` to `type` in place; pixtral's and lfm2-vl's set
/// `text_config.tie_word_embeddings` false (pixtral's also `num_attention_heads` 32 when
/// missing); mistral3's sets it false only when missing.
fn args_side_effects(model_type: &str, config: &mut Map<String, Value>) {
    if model_type == "mistral3" {
        if let Some(Value::Object(text)) = config.get_mut("text_config") {
            text.entry("tie_word_embeddings").or_insert(false.into());
        }
        return;
    }
    if matches!(model_type, "pixtral" | "lfm2-vl") {
        if let Some(Value::Object(text)) = config.get_mut("text_config") {
            text.insert("tie_word_embeddings".into(), false.into());
            if model_type == "pixtral" {
                text.entry("num_attention_heads").or_insert(32.into());
            }
        }
        return;
    }
    if !matches!(model_type, "qwen3_5" | "qwen3_5_moe") {
        return;
    }
    let text = match config.get_mut("text_config") {
        Some(Value::Object(t)) => t,
        _ => config,
    };
    if let Some(Value::Object(rp)) = text.get_mut("rope_parameters") {
        if !rp.contains_key("type") {
            if let Some(t) = rp.remove("rope_type") {
                rp.insert("type".into(), t);
            }
        }
    }
}

/// Loads `dir` lazily, like `mlx_lm.utils.load(..., lazy=True)`.
pub fn load(dir: &Path, lazy: bool) -> Result<LoadedModel> {
    let (model, cfg) = mlx_models::load_model_with(
        dir,
        &LoadOptions {
            lazy,
            // Conversion replaces the layers: fused copies would only hold memory.
            unfused: true,
            ..Default::default()
        },
    )?;
    let mut config = match cfg.raw {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if !config.contains_key("quantization_config") {
        let nested = config
            .get("text_config")
            .and_then(|t| t.get("quantization_config"))
            .cloned();
        if let Some(q) = nested {
            config.insert("quantization_config".into(), q);
        }
    }
    args_side_effects(model.model_type(), &mut config);
    if !config.contains_key("quantization") {
        if let Some(q) = &cfg.quantization {
            // A legacy method mlx-lm turns into a section and records in both keys.
            config.insert("quantization".into(), Value::Object(q.section.clone()));
            config.insert(
                "quantization_config".into(),
                Value::Object(q.section.clone()),
            );
        }
    }
    Ok(LoadedModel { model, config })
}

/// The dtype `mlx_lm.convert` casts to: `requested`, else config's `torch_dtype`, else
/// `text_config.dtype`; `None` unless it is float16, bfloat16 or float32.
pub fn conversion_dtype(requested: Option<Dtype>, config: &Map<String, Value>) -> Option<Dtype> {
    if let Some(d) = requested {
        return CONVERSION_DTYPES.contains(&d).then_some(d);
    }
    let name = match config.get("torch_dtype").filter(|v| !v.is_null()) {
        Some(v) => v.as_str(),
        None => config
            .get("text_config")
            .and_then(|t| t.get("dtype"))
            .and_then(Value::as_str),
    }?;
    Dtype::from_name(name).filter(|d| CONVERSION_DTYPES.contains(d))
}

/// The `(path, spec)` of every quantizable layer (`None`: dense), in traversal order.
pub fn layer_specs(module: &mut dyn Module) -> Result<Vec<(String, Option<QuantSpec>)>> {
    let mut out = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        out.push((path.to_string(), layer.quant_spec()));
        Ok(())
    })?;
    Ok(out)
}

/// mlx-lm's `get_total_parameters`: a quantized layer counts the elements its packed
/// weight unpacks to (plus its bias), other parameters of leaf modules their size.
pub fn total_parameters(params: &[(String, Array)], specs: &[(String, Option<QuantSpec>)]) -> u64 {
    let quantized: BTreeMap<&str, QuantSpec> = specs
        .iter()
        .filter_map(|(p, s)| s.map(|s| (p.as_str(), s)))
        .collect();
    // mlx-lm counts the parameters of leaf modules only: an array held by a module that
    // also has child modules (gpt_oss's attention `sinks`) is not counted.
    let owner = |name: &str| name.rsplit_once('.').map_or("", |(o, _)| o).to_string();
    let inner: std::collections::BTreeSet<String> = params
        .iter()
        .flat_map(|(name, _)| {
            let o = owner(name);
            o.match_indices('.')
                .map(|(i, _)| o[..i].to_string())
                .chain(std::iter::once(String::new()).filter(|_| !o.is_empty()))
                .collect::<Vec<_>>()
        })
        .collect();
    params
        .iter()
        .filter(|(name, _)| !inner.contains(&owner(name)))
        .map(|(name, a)| {
            let (layer, leaf) = name.rsplit_once('.').unwrap_or(("", name));
            match (quantized.get(layer), leaf) {
                (Some(s), "weight") => a.size() as u64 * 32 / s.bits.max(1) as u64,
                (Some(_), "scales" | "biases") => 0,
                _ => a.size() as u64,
            }
        })
        .sum()
}

/// mlx-lm's `get_total_parameters(model)`: [`total_parameters`] of a model's tree.
pub fn model_parameters(module: &mut dyn Module) -> Result<u64> {
    let specs = layer_specs(module)?;
    Ok(total_parameters(&module.parameters(), &specs))
}

/// mlx-lm's `compute_bits_per_weight`: bytes of every parameter * 8 / parameters.
pub fn bits_per_weight(module: &mut dyn Module) -> Result<f64> {
    let specs = layer_specs(module)?;
    let params = module.parameters();
    let bytes: u64 = params.iter().map(|(_, a)| a.nbytes() as u64).sum();
    let n = total_parameters(&params, &specs);
    Ok(if n == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / n as f64
    })
}

/// The `--q-group-size`, `--q-bits` and `--q-mode` of a quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantArgs {
    /// Group size (`None`: the mode's default).
    pub group_size: Option<i32>,
    /// Bits (`None`: the mode's default).
    pub bits: Option<i32>,
    /// Mode.
    pub mode: QuantMode,
}

impl QuantArgs {
    /// The spec with the mode's defaults filled in.
    pub fn spec(&self) -> QuantSpec {
        // Python's `group_size or default`: 0 means the default too.
        QuantSpec::new(
            self.group_size.filter(|g| *g != 0),
            self.bits.filter(|b| *b != 0),
            self.mode,
        )
    }
}

fn spec_json(s: QuantSpec) -> Value {
    let mut m = Map::new();
    m.insert("group_size".into(), s.group_size.into());
    m.insert("bits".into(), s.bits.into());
    m.insert("mode".into(), s.mode.name().into());
    Value::Object(m)
}

/// mlx-lm's `quantize_model`: quantizes every dense quantizable layer whose input
/// dimension the group size divides, as `predicate(path)` decides, and records the
/// `quantization` section (per-layer entries for dict choices, and for every layer when
/// the config already had a section) and its `quantization_config` mirror. Returns the
/// bits per weight.
pub fn quantize_model(
    model: &mut LoadedModel,
    args: QuantArgs,
    predicate: &mut dyn FnMut(&str) -> Result<LayerChoice>,
) -> Result<f64> {
    let default = args.spec();
    let params = spec_json(default);
    let fine_grained = model.config.contains_key("quantization");
    let mut section = match model.config.get("quantization") {
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(QuantError::Json {
                path: "config.json".into(),
                message: "key `quantization` is not an object".into(),
            })
        }
        None => match &params {
            Value::Object(m) => m.clone(),
            _ => Map::new(),
        },
    };
    let module = model.module_mut()?;
    mlx_nn::quantize_module(module, &mut |path, layer| {
        if layer.quant_spec().is_some() {
            return Ok(None);
        }
        let in_dims = layer.dense_weight_shape().last().copied().unwrap_or(0);
        if default.group_size <= 0 || in_dims % default.group_size != 0 {
            return Ok(None);
        }
        let wrap = |e: QuantError| mlx_nn::Error::Quantization {
            path: path.to_string(),
            message: e.to_string(),
        };
        let choice = predicate(path).map_err(wrap)?;
        match &choice {
            LayerChoice::Params(m) => {
                section.insert(path.to_string(), Value::Object(m.clone()));
            }
            LayerChoice::Default if fine_grained => {
                section.insert(path.to_string(), params.clone());
            }
            _ => {}
        }
        choice.spec(default).map_err(wrap)
    })?;
    set_quantization(model, section);
    bits_per_weight(model.module_mut()?)
}

/// Records `section` as the config's `quantization` and its `quantization_config` mirror
/// (what mlx-lm's `save_config` writes).
pub fn set_quantization(model: &mut LoadedModel, section: Map<String, Value>) {
    model
        .config
        .insert("quantization".into(), Value::Object(section.clone()));
    model
        .config
        .insert("quantization_config".into(), Value::Object(section));
}

/// mlx-lm's `dequantize_model` plus convert's config edits: every quantized layer becomes
/// dense (in its scales' dtype) and the `quantization` sections go.
pub fn dequantize_model(model: &mut LoadedModel) -> Result<()> {
    model.config.remove("quantization");
    model.config.remove("quantization_config");
    mlx_nn::dequantize_module(model.module_mut()?, None)?;
    Ok(())
}

/// Casts every floating-point parameter to `dtype` (convert's `set_dtype`), except those
/// the model's `cast_predicate` keeps ([`crate::predicate::model_keeps_dtype`]).
pub fn cast_model(model: &mut LoadedModel, dtype: Dtype) -> Result<()> {
    let model_type = model.model.model_type().to_string();
    let mut err = None;
    model.module_mut()?.visit_params_mut("", &mut |path, p| {
        if err.is_some()
            || crate::predicate::model_keeps_dtype(&model_type, path)
            || !p.dtype().is_floating()
            || p.dtype() == dtype
        {
            return;
        }
        match p.astype(dtype) {
            Ok(a) => p.set(a),
            Err(e) => err = Some(e),
        }
    });
    err.map_or(Ok(()), |e| Err(e.into()))
}

/// Checks a config's `quantization` section parses (what the loader will read back).
pub fn check_quantization(config: &Map<String, Value>) -> Result<()> {
    QuantizationConfig::from_config(&Value::Object(config.clone()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn edited(model_type: &str, config: Value) -> Value {
        let Value::Object(mut m) = config else {
            panic!("not an object")
        };
        args_side_effects(model_type, &mut m);
        Value::Object(m)
    }

    #[test]
    fn the_text_configs_get_mlx_lm_s_edits() {
        let c = edited("mistral3", json!({"text_config": {"model_type": "llama"}}));
        assert_eq!(c["text_config"]["tie_word_embeddings"], json!(false));
        let c = edited(
            "mistral3",
            json!({"text_config": {"tie_word_embeddings": true}}),
        );
        assert_eq!(c["text_config"]["tie_word_embeddings"], json!(true));
        let c = edited(
            "pixtral",
            json!({"text_config": {"tie_word_embeddings": true}}),
        );
        assert_eq!(c["text_config"]["tie_word_embeddings"], json!(false));
        assert_eq!(c["text_config"]["num_attention_heads"], json!(32));
        let c = edited("llama", json!({"text_config": {}}));
        assert_eq!(c["text_config"], json!({}));
    }
}

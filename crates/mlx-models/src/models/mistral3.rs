//! Mistral 3 (the multimodal config), text part only, following
//! `mlx_lm/models/mistral3.py`: the text model lives under `language_model` (Ministral 3,
//! Mistral 4 or Llama by `text_config.model_type`), vision weights are dropped.
use super::{llama, ministral3, mistral4, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, Module};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Mistral 3.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub text_config: serde_json::Map<String, Value>,
}

/// The text model of a Mistral 3 checkpoint.
pub struct Model {
    model_type: String,
    language_model: Box<dyn Architecture>,
}
impl_module!(Model { language_model });

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mistral3::Model")
            .field("model_type", &self.model_type)
            .field("text_model_type", &self.language_model.model_type())
            .finish()
    }
}

/// Registry entry (`__post_init__`: an untied head unless the text config says).
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "mistral3")?;
    let mut text = args.text_config;
    text.entry("tie_word_embeddings").or_insert(false.into());
    let kind = text.get("model_type").and_then(Value::as_str).unwrap_or("");
    let text_model = match kind {
        "ministral3" => ministral3::build(&Value::Object(text))?,
        "mistral4" => mistral4::build(&Value::Object(text))?,
        _ => llama::build(&Value::Object(text))?,
    };
    Ok(Box::new(Model {
        model_type: args.model_type,
        language_model: text_model,
    }))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.language_model.forward(tokens, caches)
    }
    /// mlx-lm's class has no `make_cache`: every layer gets a plain cache (a sliding
    /// Ministral 3 layer too).
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.language_model.num_layers()]
    }
    fn model_type(&self) -> &str {
        &self.model_type
    }
    fn vocab_size(&self) -> i32 {
        self.language_model.vocab_size()
    }
    fn num_layers(&self) -> usize {
        self.language_model.num_layers()
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
    /// The text model's (mlx-lm's AWQ config for mistral3 works on `language_model`).
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        self.language_model.as_awq_mut()
    }
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut lm = Weights::new();
        for (k, v) in weights {
            if k.contains("vision_tower") || k.contains("multi_modal_projector") {
                continue;
            }
            let key = match k.strip_prefix("model.language_model.") {
                Some(rest) => format!("model.{rest}"),
                None => k.strip_prefix("language_model.").unwrap_or(&k).to_string(),
            };
            lm.insert(key, v);
        }
        let lm = self.language_model.sanitize(lm)?;
        Ok(lm
            .into_iter()
            .map(|(k, v)| (format!("language_model.{k}"), v))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.language_model.fuse_projections()
    }
}

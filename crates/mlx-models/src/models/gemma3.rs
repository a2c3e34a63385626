//! Gemma 3 (the multimodal config), text part only, following `mlx_lm/models/gemma3.py`:
//! the text model lives under `language_model`, vision weights are dropped.
use super::{gemma3_text, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, Module};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Gemma 3.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub text_config: serde_json::Map<String, Value>,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
}

fn default_vocab_size() -> i32 {
    262208
}

/// The text model of a Gemma 3 checkpoint.
#[derive(Debug)]
pub struct Model {
    model_type: String,
    language_model: gemma3_text::Model,
}
impl_module!(Model { language_model });

/// Registry entry (`__post_init__` fills the text config's vocabulary and head counts).
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "gemma3")?;
    let mut text = args.text_config;
    text.insert("vocab_size".into(), args.vocab_size.into());
    text.entry("num_attention_heads").or_insert(8.into());
    text.entry("num_key_value_heads").or_insert(4.into());
    let language_model = gemma3_text::Model::from_config(&Value::Object(text))?;
    Ok(Box::new(Model {
        model_type: args.model_type,
        language_model,
    }))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.language_model.forward(tokens, caches)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.language_model.cache_specs()
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
    fn defines_make_cache(&self) -> bool {
        true
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
    /// The text model's (mlx-lm's AWQ configuration for gemma3 works on `language_model`).
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        self.language_model.as_awq_mut()
    }
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut lm = Weights::new();
        let mut rest = Weights::new();
        for (k, v) in weights {
            if k.starts_with("vision_tower.") || k.starts_with("multi_modal_projector.") {
                continue;
            }
            match k.strip_prefix("language_model.") {
                Some(name) => {
                    lm.insert(name.to_string(), v);
                }
                None => {
                    rest.insert(k, v);
                }
            }
        }
        let lm = self.language_model.sanitize(lm)?;
        rest.extend(
            lm.into_iter()
                .map(|(k, v)| (format!("language_model.{k}"), v)),
        );
        Ok(rest)
    }    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.language_model.fuse_projections()
    }
}

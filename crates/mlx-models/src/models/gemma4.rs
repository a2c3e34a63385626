//! Gemma 4 (the multimodal config), text part only, following `mlx_lm/models/gemma4.py`:
//! the text model lives under `language_model`, vision and audio weights are dropped.
use super::{gemma4_text, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, Module};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Gemma 4.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default)]
    pub text_config: Option<serde_json::Map<String, Value>>,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
}

fn default_vocab_size() -> i32 {
    262144
}

/// The text model of a Gemma 4 checkpoint.
#[derive(Debug)]
pub struct Model {
    model_type: String,
    language_model: gemma4_text::Model,
}
impl_module!(Model { language_model });

/// Registry entry (`__post_init__` fills the text config's vocabulary and head counts).
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "gemma4")?;
    let mut text = args.text_config.unwrap_or_default();
    text.insert("vocab_size".into(), args.vocab_size.into());
    text.entry("num_attention_heads").or_insert(8.into());
    text.entry("num_key_value_heads").or_insert(1.into());
    let language_model = gemma4_text::Model::from_config(&Value::Object(text))?;
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
}

/// Multimodal towers whose weights the text model drops.
const DROPPED: [&str; 6] = [
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_audio",
    "embed_vision",
    "vision_embedder",
];

impl Architecture for Model {
    /// mlx-lm's `sanitize`: `model.` stripped, the towers dropped,
    /// `model.language_model.*` moved under `language_model.model.*`, then the text
    /// model's own sanitize.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut out = Weights::new();
        for (k, v) in weights {
            let stripped = k.strip_prefix("model.");
            let name = stripped.unwrap_or(&k);
            if DROPPED.iter().any(|d| name.starts_with(d)) {
                continue;
            }
            let name = if stripped.is_some() && name.starts_with("language_model") {
                name.replace("language_model.", "language_model.model.")
            } else {
                name.to_string()
            };
            out.insert(name, v);
        }
        gemma4_text::sanitize(out, self.language_model.first_kv_shared())
    }
}

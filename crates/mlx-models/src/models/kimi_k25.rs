//! Kimi K2.5 (`kimi_k25`), text part only, following `mlx_lm/models/kimi_k25.py`: the
//! DeepSeek-V3 text model of [`super::deepseek_v3`] (from `text_config`) under
//! `language_model`; vision tower and projector weights are dropped.
use super::deepseek_v3::{self, cast_all_but_bias};
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{KvCache, Module, Param};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Kimi K2.5.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub text_config: serde_json::Map<String, Value>,
}

fn default_model_type() -> String {
    "kimi_k25".into()
}

/// The text model of a Kimi K2.5 checkpoint.
#[derive(Debug)]
pub struct Model {
    model_type: String,
    language_model: deepseek_v3::Model,
}

impl Module for Model {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.language_model
            .visit_params(&join(prefix, "language_model"), f);
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.language_model
            .visit_params_mut(&join(prefix, "language_model"), f);
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.language_model
            .visit_quantizable_mut(&join(prefix, "language_model"), f)
    }
    /// mlx-lm's `cast_predicate`: the routers' `e_score_correction_bias` keeps its dtype.
    fn cast_floating(&mut self, dtype: Dtype) -> mlx_nn::Result<()> {
        cast_all_but_bias(self, dtype)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "kimi_k25")?;
    let language_model = deepseek_v3::Model::from_config(&Value::Object(args.text_config))?;
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
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

/// The top-level modules of the multimodal checkpoint that `sanitize` drops.
const DROPPED: [&str; 4] = [
    "vision_tower",
    "vision_model",
    "multi_modal_projector",
    "mm_projector",
];

impl Architecture for Model {
    /// Drops the vision modules, then DeepSeek-V3's `sanitize` on `language_model.*`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut lm = Weights::new();
        let mut rest = Weights::new();
        for (k, v) in weights {
            let top = k.split('.').next().unwrap_or_default();
            if DROPPED.contains(&top) {
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
        let lm = self.language_model.sanitize_weights(lm)?;
        rest.extend(
            lm.into_iter()
                .map(|(k, v)| (format!("language_model.{k}"), v)),
        );
        Ok(rest)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.language_model.fuse_projections()
    }
}

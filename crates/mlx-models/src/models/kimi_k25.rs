//! Kimi K2.5 (`kimi_k25`), text part only, following `mlx_lm/models/kimi_k25.py`: the
//! DeepSeek-V3 text model of [`super::deepseek_v3`] (from `text_config`) under
//! `language_model`; vision tower and projector weights are dropped. Kimi-VL
//! (`kimi_vl.py`) holds its text model the same way with its own `sanitize`
//! (`Layout::Vl`).
use super::deepseek_v3::{self, cast_all_but_bias};
use super::decoder::{stack_experts, GLU_EXPERT_PROJS, LINEAR_KINDS};
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

/// The text model of a Kimi K2.5 (or Kimi-VL) checkpoint.
#[derive(Debug)]
pub struct Model {
    model_type: String,
    language_model: deepseek_v3::Model,
    layout: Layout,
}

/// Whose `sanitize` a [`Model`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `kimi_k25.py`: see [`Model::sanitize`].
    K25,
    /// `kimi_vl.py`: every key containing `vision_tower`, `rotary_emb` or
    /// `multi_modal_projector` dropped, then each layer's experts stacked
    /// (`language_model.model.layers.{l}.mlp.experts.{e}`); nothing else of DeepSeek-V3's
    /// `sanitize` (no `kv_b_proj` split, no FP8 dequantization).
    Vl,
}

impl Model {
    /// The text model of `text_config` (DeepSeek-V3's arguments and defaults) under
    /// `language_model`.
    pub(crate) fn boxed(
        model_type: String,
        text_config: serde_json::Map<String, Value>,
        layout: Layout,
    ) -> crate::Result<Box<dyn Architecture>> {
        Ok(Box::new(Model {
            model_type,
            language_model: deepseek_v3::Model::from_config(&Value::Object(text_config))?,
            layout,
        }))
    }
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
    Model::boxed(args.model_type, args.text_config, Layout::K25)
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

/// What Kimi-VL's `sanitize` drops: every key containing one of these.
const VL_DROPPED: [&str; 3] = ["vision_tower", "rotary_emb", "multi_modal_projector"];

impl Architecture for Model {
    /// Drops the vision modules, then DeepSeek-V3's `sanitize` on `language_model.*`
    /// (`Layout::Vl`: see there).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        if self.layout == Layout::Vl {
            let mut kept: Weights = weights
                .into_iter()
                .filter(|(k, _)| !VL_DROPPED.iter().any(|d| k.contains(d)))
                .collect();
            let args = &self.language_model.args;
            if let Some(n_experts) = args.n_routed_experts {
                stack_experts(
                    &mut kept,
                    args.num_hidden_layers,
                    |l| format!("language_model.model.layers.{l}.mlp"),
                    GLU_EXPERT_PROJS,
                    LINEAR_KINDS,
                    n_experts,
                )?;
            }
            return Ok(kept);
        }
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

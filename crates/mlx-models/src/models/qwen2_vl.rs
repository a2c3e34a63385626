//! Qwen2-VL (also `qwen2_5_vl`), text part only, following `mlx_lm/models/qwen2_vl.py`:
//! a Qwen2 model under `language_model` built from `text_config` (or from the whole
//! config when it has none); the vision tower's weights are dropped. Qwen3-VL wraps a
//! Qwen3 model the same way ([`VlText`]), and Pixtral and LFM2-VL wrap theirs with
//! `Layout::Towers`.
use super::{qwen2, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, Module};
use serde_json::Value;

/// The text model of a vision-language checkpoint, as mlx-lm's `qwen2_vl` / `qwen3_vl`
/// classes hold it.
pub struct VlText {
    model_type: String,
    language_model: Box<dyn Architecture>,
    layout: Layout,
}

/// How a wrapper's checkpoint is laid out, so what its `sanitize` does and whose caches
/// it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `qwen2_vl` / `qwen3_vl`: see [`VlText::sanitize`]; no `make_cache` of its own.
    QwenVl,
    /// `pixtral` / `lfm2-vl`: the top-level `vision_tower` and `multi_modal_projector`
    /// trees dropped, every other key kept as it is (the text model's `sanitize` not
    /// called). `own_caches`: the class's `make_cache` is the text model's (LFM2-VL);
    /// without it every layer gets a plain cache (Pixtral).
    Towers { own_caches: bool },
}
impl_module!(VlText { language_model });

impl std::fmt::Debug for VlText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VlText")
            .field("model_type", &self.model_type)
            .field("text_model_type", &self.language_model.model_type())
            .finish()
    }
}

impl VlText {
    /// `ModelArgs.from_dict`: the text model of `text_config`, or of the whole config
    /// when it has no `text_config`, built by `build_text`.
    pub(crate) fn build(
        config: &Value,
        what: &str,
        build_text: fn(&Value) -> crate::Result<Box<dyn Architecture>>,
    ) -> crate::Result<Box<dyn Architecture>> {
        let model_type: String = parse_args(&config["model_type"], what)?;
        let text = match config.get("text_config") {
            Some(t) => {
                let t: serde_json::Map<String, Value> = parse_args(t, what)?;
                Value::Object(t)
            }
            None => config.clone(),
        };
        Ok(Box::new(VlText {
            model_type,
            language_model: build_text(&text)?,
            layout: Layout::QwenVl,
        }))
    }

    /// Pixtral's and LFM2-VL's `Model`: `model_type` and `text_config` required, the
    /// text model built by `build_text` from `text_config` once `post_init` edited it
    /// (their `__post_init__`), laid out as `Layout::Towers`.
    pub(crate) fn build_towers(
        config: &Value,
        what: &str,
        own_caches: bool,
        post_init: fn(&mut serde_json::Map<String, Value>),
        build_text: fn(&Value) -> crate::Result<Box<dyn Architecture>>,
    ) -> crate::Result<Box<dyn Architecture>> {
        let args: TowersArgs = parse_args(config, what)?;
        let mut text = args.text_config;
        post_init(&mut text);
        Ok(Box::new(VlText {
            model_type: args.model_type,
            language_model: build_text(&Value::Object(text))?,
            layout: Layout::Towers { own_caches },
        }))
    }
}

/// config.json keys read by Pixtral and LFM2-VL.
#[derive(Debug, Clone, serde::Deserialize)]
struct TowersArgs {
    model_type: String,
    text_config: serde_json::Map<String, Value>,
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    VlText::build(config, "qwen2_vl", qwen2::build)
}

impl LanguageModel for VlText {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.language_model.forward(tokens, caches)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        match self.layout {
            Layout::Towers { own_caches: true } => self.language_model.cache_specs(),
            _ => vec![CacheSpec::Standard; self.language_model.num_layers()],
        }
    }
    fn defines_make_cache(&self) -> bool {
        self.layout == Layout::Towers { own_caches: true }
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

impl Architecture for VlText {
    /// `Layout::Towers`: see there. `Layout::QwenVl`: drops the `visual` /
    /// `vision_tower` trees; where the checkpoint nests the text
    /// model as `model.language_model.*` that tree becomes `model.*` (and the rest of
    /// `model.*` goes); every key then lives under `language_model.`. The text model's
    /// own `sanitize` is not called, as in mlx-lm.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        if let Layout::Towers { .. } = self.layout {
            return Ok(weights
                .into_iter()
                .filter(|(k, _)| {
                    let top = k.split('.').next().unwrap_or_default();
                    top != "vision_tower" && top != "multi_modal_projector"
                })
                .collect());
        }
        let nested = weights
            .keys()
            .any(|k| k.starts_with("model.language_model."));
        let mut out = Weights::new();
        for (k, v) in weights {
            let top = k.split('.').next().unwrap_or("");
            if top == "visual" || top == "vision_tower" {
                continue;
            }
            let key = if nested && top == "model" {
                match k.strip_prefix("model.language_model.") {
                    Some(rest) => format!("model.{rest}"),
                    None => continue,
                }
            } else {
                k
            };
            let key = if key.starts_with("language_model.") {
                key
            } else {
                format!("language_model.{key}")
            };
            out.insert(key, v);
        }
        Ok(out)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.language_model.fuse_projections()
    }
    fn extra_init_key_draws(&self) -> usize {
        self.language_model.extra_init_key_draws()
    }
}

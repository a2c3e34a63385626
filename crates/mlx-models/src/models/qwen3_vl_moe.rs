//! Qwen3-VL-MoE, text part only, following `mlx_lm/models/qwen3_vl_moe.py`: a Qwen3-MoE
//! model under `language_model` built from `text_config` (required), loaded as the
//! other VL text models ([`super::qwen2_vl::VlText`]) but with this file's own
//! `sanitize`: only the text model and `lm_head` are kept, and HF's fused experts
//! (`experts.gate_up_proj` `[E, D, 2I]`, `experts.down_proj` `[E, I, D]`) become
//! `switch_mlp`'s projections.
use super::qwen2_vl::VlText;
use super::{qwen3_moe, Architecture, Weights};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::module::QuantVisitor;
use mlx_nn::{KvCache, Module, Param};
use serde_json::Value;

/// The text model and its layer count (for `sanitize`).
pub struct Model {
    text: Box<dyn Architecture>,
    num_hidden_layers: usize,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen3VlMoe")
            .field("num_hidden_layers", &self.num_hidden_layers)
            .finish()
    }
}

fn weights_error(message: String) -> crate::Error {
    crate::Error::Weights {
        path: "model weights (qwen3_vl_moe)".into(),
        message,
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    if config.get("text_config").is_none_or(Value::is_null) {
        return Err(crate::Error::Config {
            path: "config.json (qwen3_vl_moe)".into(),
            message: "key `text_config` is missing".into(),
        });
    }
    let text = VlText::build(config, "qwen3_vl_moe", qwen3_moe::build)?;
    let num_hidden_layers = text.num_layers();
    Ok(Box::new(Model {
        text,
        num_hidden_layers,
    }))
}

impl Module for Model {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.text.visit_params(prefix, f)
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.text.visit_params_mut(prefix, f)
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        self.text.visit_quantizable_mut(prefix, f)
    }
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.text.forward(tokens, caches)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.text.cache_specs()
    }
    fn model_type(&self) -> &str {
        self.text.model_type()
    }
    fn vocab_size(&self) -> i32 {
        self.text.vocab_size()
    }
    fn num_layers(&self) -> usize {
        self.num_hidden_layers
    }
    fn as_module(&self) -> Option<&dyn Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn Module> {
        Some(self)
    }
}

impl Architecture for Model {
    /// Keeps `model.language_model.*` with the top-level `lm_head.*` (newer files), else
    /// `language_model.model.*` with `language_model.lm_head.*`, as
    /// `language_model.model.*` / `language_model.lm_head.*`; everything else (the
    /// vision tower) goes. Then each layer's fused experts are split.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let nested = weights
            .keys()
            .any(|k| k.starts_with("model.language_model."));
        let (model_prefix, head_prefix) = if nested {
            ("model.language_model.", "lm_head.")
        } else {
            ("language_model.model.", "language_model.lm_head.")
        };
        let mut out = Weights::new();
        for (k, v) in weights {
            if let Some(rest) = k.strip_prefix(model_prefix) {
                out.insert(format!("language_model.model.{rest}"), v);
            } else if let Some(rest) = k.strip_prefix(head_prefix) {
                out.insert(format!("language_model.lm_head.{rest}"), v);
            }
        }
        for (prefix, what) in [
            ("language_model.model.", model_prefix),
            ("language_model.lm_head.", head_prefix),
        ] {
            if !out.keys().any(|k| k.starts_with(prefix)) {
                return Err(weights_error(format!("no `{what}*` tensors")));
            }
        }
        for l in 0..self.num_hidden_layers {
            let prefix = format!("language_model.model.layers.{l}.mlp");
            let Some(gate_up) = out.remove(&format!("{prefix}.experts.gate_up_proj")) else {
                continue;
            };
            let mid = gate_up.dim(-1)? / 2;
            let last = gate_up.dim(-1)?;
            let gate = gate_up.slice_axis(-1, 0, mid)?.swapaxes(-2, -1)?;
            let up = gate_up.slice_axis(-1, mid, last)?.swapaxes(-2, -1)?;
            let down_key = format!("{prefix}.experts.down_proj");
            let down = out
                .remove(&down_key)
                .ok_or_else(|| weights_error(format!("missing tensor `{down_key}`")))?
                .swapaxes(-2, -1)?;
            out.insert(format!("{prefix}.switch_mlp.gate_proj.weight"), gate);
            out.insert(format!("{prefix}.switch_mlp.up_proj.weight"), up);
            out.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
        }
        Ok(out)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.text.fuse_projections()
    }
    fn extra_init_key_draws(&self) -> usize {
        self.text.extra_init_key_draws()
    }
}

//! Qwen3.5 (and Qwen3.5-MoE, `qwen3_5_moe`), the text model of
//! `mlx_lm/models/qwen3_5.py` / `qwen3_5_moe.py`: Qwen3-Next's gated delta-net hybrid
//! (mlx-lm imports its attention, MLP, experts and gated norm from `qwen3_next.py`)
//! with four linear-attention input projections, experts on every layer of MoE
//! checkpoints, and the text model under `language_model` (vision weights dropped).
use super::qwen3_next::{self, Layout};
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, Module};
use serde::Deserialize;
use serde_json::Value;

/// `TextModelArgs`: every key has mlx-lm's default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct TextArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub max_position_embeddings: i32,
    pub linear_num_value_heads: i32,
    pub linear_num_key_heads: i32,
    pub linear_key_head_dim: i32,
    pub linear_value_head_dim: i32,
    pub linear_conv_kernel_dim: i32,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub head_dim: Option<i32>,
    pub full_attention_interval: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub shared_expert_intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub norm_topk_prob: bool,
    pub rope_parameters: Option<serde_json::Map<String, Value>>,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Value>,
}

impl Default for TextArgs {
    fn default() -> TextArgs {
        let rope = serde_json::json!({
            "type": "default", "mrope_section": [11, 11, 10], "rope_theta": 100000,
            "partial_rotary_factor": 0.25,
        });
        TextArgs {
            model_type: String::new(),
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            rms_norm_eps: 1e-6,
            vocab_size: 151936,
            num_key_value_heads: 8,
            max_position_embeddings: 131072,
            linear_num_value_heads: 64,
            linear_num_key_heads: 16,
            linear_key_head_dim: 192,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            tie_word_embeddings: false,
            attention_bias: false,
            head_dim: None,
            full_attention_interval: 4,
            num_experts: 0,
            num_experts_per_tok: 0,
            decoder_sparse_step: 1,
            shared_expert_intermediate_size: 0,
            moe_intermediate_size: 0,
            norm_topk_prob: true,
            rope_parameters: rope.as_object().cloned(),
            partial_rotary_factor: 0.25,
            rope_theta: 100000.0,
            rope_scaling: None,
        }
    }
}

impl TextArgs {
    /// `__post_init__`, then the arguments of the shared Qwen3-Next layers.
    fn into_next_args(mut self, model_type: &str) -> crate::Result<qwen3_next::ModelArgs> {
        let bad = |message: String| crate::Error::Config {
            path: format!("config.json ({model_type})"),
            message,
        };
        if self.num_attention_heads <= 0 {
            return Err(bad("num_attention_heads must be positive".into()));
        }
        let head_dim = self
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads);
        if let Some(mut rp) = self.rope_parameters.take().filter(|p| !p.is_empty()) {
            if !rp.contains_key("type") {
                if let Some(t) = rp.remove("rope_type") {
                    rp.insert("type".into(), t);
                }
            }
            let num = |k: &str, default: f64| -> crate::Result<f64> {
                match rp.get(k) {
                    None => Ok(default),
                    Some(v) => v
                        .as_f64()
                        .ok_or_else(|| bad(format!("key `rope_parameters.{k}` is not a number"))),
                }
            };
            self.partial_rotary_factor = num("partial_rotary_factor", 0.25)?;
            self.rope_theta = num("rope_theta", 100000.0)?;
            self.rope_scaling = Some(Value::Object(rp));
        }
        Ok(qwen3_next::ModelArgs {
            model_type: model_type.to_string(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            linear_num_value_heads: self.linear_num_value_heads,
            linear_num_key_heads: self.linear_num_key_heads,
            linear_key_head_dim: self.linear_key_head_dim,
            linear_value_head_dim: self.linear_value_head_dim,
            linear_conv_kernel_dim: self.linear_conv_kernel_dim,
            num_experts: self.num_experts,
            num_experts_per_tok: self.num_experts_per_tok,
            decoder_sparse_step: self.decoder_sparse_step,
            shared_expert_intermediate_size: self.shared_expert_intermediate_size,
            mlp_only_layers: Vec::new(),
            moe_intermediate_size: self.moe_intermediate_size,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            num_key_value_heads: self.num_key_value_heads,
            rope_theta: self.rope_theta,
            partial_rotary_factor: self.partial_rotary_factor,
            max_position_embeddings: self.max_position_embeddings,
            head_dim,
            norm_topk_prob: self.norm_topk_prob,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: self.attention_bias,
            rope_scaling: self.rope_scaling,
            full_attention_interval: self.full_attention_interval,
        })
    }
}

/// Qwen3.5's text model under `language_model`.
#[derive(Debug)]
pub struct Model {
    language_model: qwen3_next::Model,
    moe_checkpoint: bool,
}
impl_module!(Model { language_model });

fn build_as(config: &Value, moe_checkpoint: bool) -> crate::Result<Box<dyn Architecture>> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("qwen3_5")
        .to_string();
    let text = config.get("text_config").unwrap_or(config);
    let args: TextArgs = parse_args(text, &model_type)?;
    let layout = Layout {
        split_projections: true,
        experts_everywhere: true,
    };
    Ok(Box::new(Model {
        language_model: qwen3_next::Model::with_layout(args.into_next_args(&model_type)?, layout)?,
        moe_checkpoint,
    }))
}

/// Registry entry of `qwen3_5`.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    build_as(config, false)
}

/// Registry entry of `qwen3_5_moe` (the same model; its sanitize also splits the
/// experts' fused `gate_up_proj`).
pub fn build_moe(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    build_as(config, true)
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.language_model.forward(tokens, caches)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.language_model.cache_specs()
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    fn model_type(&self) -> &str {
        self.language_model.model_type()
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

fn weights_error(message: String) -> crate::Error {
    crate::Error::Weights {
        path: "model weights".into(),
        message,
    }
}

impl Architecture for Model {
    fn extra_init_key_draws(&self) -> usize {
        self.language_model.delta_net_key_draws()
    }

    /// `Model.sanitize` (vision weights dropped, text weights under
    /// `language_model.`), for MoE checkpoints the experts' `gate_up_proj` split into
    /// `switch_mlp`, then `TextModel.sanitize`.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut w = Weights::new();
        for (key, value) in weights {
            if key.starts_with("vision_tower") || key.starts_with("model.visual") {
                continue;
            }
            let key = if let Some(rest) = key.strip_prefix("model.language_model") {
                format!("language_model.model{rest}")
            } else if key.starts_with("language_model.") {
                key
            } else {
                format!("language_model.{key}")
            };
            w.insert(key, value);
        }
        if self.moe_checkpoint {
            for l in 0..self.language_model.num_layers() {
                let prefix = format!("language_model.model.layers.{l}.mlp");
                let Some(gate_up) = w.remove(&format!("{prefix}.experts.gate_up_proj")) else {
                    continue;
                };
                let mid = gate_up.dim(-2)? / 2;
                let end = gate_up.dim(-2)?;
                let down_key = format!("{prefix}.experts.down_proj");
                let down = w
                    .remove(&down_key)
                    .ok_or_else(|| weights_error(format!("missing `{down_key}`")))?;
                w.insert(
                    format!("{prefix}.switch_mlp.gate_proj.weight"),
                    gate_up.slice_axis(-2, 0, mid)?,
                );
                w.insert(
                    format!("{prefix}.switch_mlp.up_proj.weight"),
                    gate_up.slice_axis(-2, mid, end)?,
                );
                w.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
            }
        }
        // TextModel.sanitize
        let mut unsanitized_conv = false;
        for (k, v) in &w {
            if k.contains("conv1d.weight") && v.dim(-1)? != 1 {
                unsanitized_conv = true;
            }
        }
        w.retain(|k, _| !k.contains("mtp."));
        if self.language_model_tied() {
            // mlx-lm pops the unprefixed name, which the remapping above never leaves.
            w.remove("lm_head.weight");
        }
        const NORMS: [&str; 5] = [
            ".input_layernorm.weight",
            ".post_attention_layernorm.weight",
            "model.norm.weight",
            ".q_norm.weight",
            ".k_norm.weight",
        ];
        for (k, v) in w.iter_mut() {
            if k.contains("conv1d.weight") && v.dim(-1)? != 1 {
                *v = v.moveaxis(2, 1)?;
            }
            if unsanitized_conv && NORMS.iter().any(|s| k.ends_with(s)) && v.ndim() == 1 {
                *v = v.add(1.0)?;
            }
        }
        Ok(w)
    }
}

impl Model {
    fn language_model_tied(&self) -> bool {
        self.language_model.tied()
    }
}

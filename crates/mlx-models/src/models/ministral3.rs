//! Ministral 3, following `mlx_lm/models/ministral3.py`: Llama's layers (optionally
//! sliding-window) with RoPE from `rope_parameters` and Llama 4's position-dependent
//! query scale, `1 + beta * log(1 + floor(pos / original_max_position_embeddings))`.
use super::attention::{Attention, AttentionDims};
use super::head::{self, LogitScale};
use super::llama::{LlamaModel, TransformerBlock};
use super::mlp::Mlp;
use super::{drop_rotary_inv_freq, Architecture, Weights};
use crate::config::{default_true, parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::RopePosition;
use mlx_nn::{impl_module, initialize_rope, KvCache, LinearLayer};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Ministral 3.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    /// `rope_theta`, the scaling (`rope_type` ...), `llama_4_scaling_beta` and
    /// `original_max_position_embeddings`.
    pub rope_parameters: serde_json::Map<String, Value>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window: Option<i32>,
}

fn config_err(message: String) -> crate::Error {
    crate::Error::Config {
        path: "config.json (ministral3)".into(),
        message,
    }
}

impl ModelArgs {
    fn rope_number(&self, key: &str) -> crate::Result<f64> {
        self.rope_parameters
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| config_err(format!("key `rope_parameters.{key}` is missing")))
    }
}

/// Unbiased projections, RoPE from `rope_parameters`.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = args
        .head_dim
        .filter(|&d| d > 0)
        .unwrap_or(args.hidden_size / n_heads);
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let scaling = Value::Object(args.rope_parameters.clone());
    let rope = initialize_rope(
        head_dim,
        args.rope_number("rope_theta")?,
        false,
        rope_scaling(Some(&scaling))?.as_ref(),
        args.max_position_embeddings,
    )?;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))
}

/// Llama 4's query scale for `size` positions from `offset`: `[size, 1]` for one
/// offset, `[B, 1, size, 1]` for one per row.
pub(crate) fn llama4_attn_scale(size: i32, offset: &RopePosition, beta: f64, max_pos: f64) -> Result<Array> {
    let positions = ops::arange(0.0, size as f64, 1.0, Dtype::Int32)?;
    let positions = match offset {
        RopePosition::Scalar(o) => positions.add(*o)?,
        RopePosition::PerRow(o) => positions.add(&o.expand_dims(&[1])?)?,
    };
    let scaling = positions
        .divide(max_pos)?
        .floor()?
        .add(1.0)?
        .log()?
        .multiply(beta)?
        .add(1.0)?;
    if scaling.ndim() == 2 {
        let b = scaling.dim(0)?;
        scaling.reshape(&[b, 1, size, 1])
    } else {
        scaling.expand_dims(&[1])
    }
}

/// Ministral 3 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: LlamaModel,
    lm_head: Option<LinearLayer>,
    scaling_beta: f64,
    original_max_position_embeddings: f64,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let types = args.layer_types.as_deref();
        let model = LlamaModel::new(
            &lm_dims!(args),
            types,
            args.sliding_window,
            "ministral3",
            |t| {
                let mlp = Mlp::new(dim, args.intermediate_size, false)?;
                TransformerBlock::new(attention(&args)?, mlp, dim, eps, t)
            },
        )?;
        if model.has_sliding() && args.sliding_window.is_none() {
            return Err(config_err(
                "sliding-window layers need the key `sliding_window`".into(),
            ));
        }
        Ok(Model {
            scaling_beta: args.rope_number("llama_4_scaling_beta")?,
            original_max_position_embeddings: args
                .rope_number("original_max_position_embeddings")?,
            lm_head: head::untied(args.tie_word_embeddings, dim, args.vocab_size)?,
            args,
            model,
        })
    }

    /// From a config object (mistral3's `text_config`).
    pub fn from_config(config: &Value) -> crate::Result<Model> {
        Model::new(parse_args(config, "ministral3")?)
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::from_config(config)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let n = tokens.dim(1)?;
        let scale = |h: &Array, cache: Option<&dyn KvCache>| -> Result<Array> {
            let offset = match cache {
                Some(c) => c.rope_offset()?,
                None => RopePosition::Scalar(0),
            };
            let beta = self.scaling_beta;
            llama4_attn_scale(n, &offset, beta, self.original_max_position_embeddings)?
                .astype(h.dtype())
        };
        let out = self.model.forward(tokens, caches, Some(&scale))?;
        let embed = &self.model.embed_tokens;
        head::logits(embed, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        self.model.cache_specs()
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        true
    }
    fn as_awq_mut(&mut self) -> Option<&mut dyn crate::awq::AwqModel> {
        Some(self)
    }
}

/// mlx-lm's AWQ calls each block without `attn_scale` (the queries unscaled).
impl crate::awq::AwqModel for Model {
    fn embed_tokens_mut(&mut self) -> &mut mlx_nn::EmbeddingLayer {
        &mut self.model.embed_tokens
    }
    fn awq_blocks(&mut self) -> Vec<&mut dyn crate::awq::AwqBlock> {
        self.model.awq_blocks()
    }
    fn lm_head_mut(&mut self) -> Option<&mut mlx_nn::LinearLayer> {
        self.lm_head.as_mut()
    }
}

impl Architecture for Model {
    /// Drops the rotary buffers (and a tied head's copy); FP8 weights with a
    /// `weight_scale_inv` are multiplied by it, `activation_scale`s dropped.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let mut weights = drop_rotary_inv_freq(weights);
        if self.args.tie_word_embeddings {
            weights.remove("lm_head.weight");
        }
        let mut out = Weights::new();
        for (k, v) in &weights {
            if k.contains("weight_scale_inv") {
                let wk = k.replace("_scale_inv", "");
                let Some(w) = weights.get(&wk) else {
                    return Err(crate::Error::Config {
                        path: "weights".into(),
                        message: format!("`{k}` has no weight `{wk}`"),
                    });
                };
                out.insert(wk, w.multiply(v)?);
            } else if k.contains("activation_scale") {
                continue;
            } else if !out.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
        Ok(out)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

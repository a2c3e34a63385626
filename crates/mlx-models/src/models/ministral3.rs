//! Ministral 3, following `mlx_lm/models/ministral3.py`: Llama's layers (optionally
//! sliding-window) with RoPE from `rope_parameters` and Llama 4's position-dependent
//! query scale, `1 + beta * log(1 + floor(pos / original_max_position_embeddings))`.
use super::attention::{Attention, AttentionDims, Extras};
use super::mlp::Mlp;
use super::LayerMasks;
use super::{cache_at, drop_rotary_inv_freq, layer_caches, Architecture, Weights};
use super::{layer_type_index, window_cache_specs};
use crate::config::{default_true, parse_args, rope_scaling};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::RopePosition;
use mlx_nn::{
    impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm,
};
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
fn llama4_attn_scale(size: i32, offset: &RopePosition, beta: f64, max_pos: f64) -> Result<Array> {
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

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    use_sliding: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        attn_scale: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let extras = Extras {
            query_scale: Some(attn_scale),
            ..Default::default()
        };
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            extras,
        )?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct Ministral3Model {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    fa_idx: usize,
    swa_idx: Option<usize>,
    sliding_window: Option<i32>,
    scaling_beta: f64,
    original_max_position_embeddings: f64,
}
impl_module!(Ministral3Model {
    embed_tokens,
    layers,
    norm
});

impl Ministral3Model {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        let offset = match cache_at(caches, 0) {
            Some(c) => c.rope_offset()?,
            None => RopePosition::Scalar(0),
        };
        let masks = LayerMasks::new(n, caches, self.fa_idx, self.swa_idx, self.sliding_window)?;
        let attn_scale = llama4_attn_scale(
            inputs.dim(1)?,
            &offset,
            self.scaling_beta,
            self.original_max_position_embeddings,
        )?
        .astype(h.dtype())?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(layer.use_sliding);
            h = layer.forward(&h, &attn_scale, mask, cache)?;
        }
        self.norm.forward(&h)
    }
}

/// Ministral 3 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Ministral3Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let types = args
            .layer_types
            .clone()
            .unwrap_or_else(|| vec!["full_attention".into(); args.num_hidden_layers as usize]);
        let fa_idx = layer_type_index(&types, "full_attention", "ministral3")?;
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = types
            .iter()
            .map(|t| {
                Ok(TransformerBlock {
                    self_attn: attention(&args)?,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    use_sliding: t == "sliding_attention",
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let swa_idx = layers.iter().position(|l| l.use_sliding);
        if swa_idx.is_some() && args.sliding_window.is_none() {
            return Err(config_err(
                "sliding-window layers need the key `sliding_window`".into(),
            ));
        }
        let model = Ministral3Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            fa_idx,
            swa_idx,
            sliding_window: args.sliding_window,
            scaling_beta: args.rope_number("llama_4_scaling_beta")?,
            original_max_position_embeddings: args
                .rope_number("original_max_position_embeddings")?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
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
        let out = self.model.forward(tokens, caches)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.use_sliding);
        window_cache_specs(sliding, self.args.sliding_window.unwrap_or(0))
    }
    decoder_accessors!();
    fn defines_make_cache(&self) -> bool {
        true
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
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

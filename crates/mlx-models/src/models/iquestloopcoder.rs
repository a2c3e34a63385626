//! IQuest-Loop-Coder (`iquestloopcoder`), following `mlx_lm/models/iquestloopcoder.py`:
//! Llama-shaped layers (GQA with `head_dim`, biases by `attention_bias` / `mlp_bias`,
//! `initialize_rope` never traditional, SwiGLU) run twice (`loop_num` 2, the only value
//! mlx-lm accepts). The first run attends globally and keeps each layer's keys and
//! values (its `KVCache`); the second mixes, per head, attention over those first-run
//! keys (global mask) with attention over its own keys in a `RotatingKVCache` of
//! `loop_window_size` (windowed mask), weighted by `sigmoid(q . w + b)` from the layer's
//! `gate_projections` entry; then the final norm and the head (tied or not).
use super::config_error;
use super::attention::{Attention, AttentionDims};
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{cache_at, Architecture};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::activations::call_compiled;
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, EmbeddingLayer, KvCache, KvFetch, LinearLayer, Param, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by IQuest-Loop-Coder.
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
    pub head_dim: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: i32,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_loop_num")]
    pub loop_num: i32,
    #[serde(default = "default_loop_window_size")]
    pub loop_window_size: i32,
}

fn default_max_positions() -> i32 {
    131072
}
fn default_rope_theta() -> f64 {
    500000.0
}
fn default_loop_num() -> i32 {
    2
}
fn default_loop_window_size() -> i32 {
    64
}

/// One layer (its attention and MLP run in both loops).
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    /// `h + o_proj(attn)`, then `+ mlp(post_attention_layernorm(..))`.
    fn finish(&self, attn: &Array, h: &Array) -> Result<Array> {
        let h = self.self_attn.output(attn, Some(h))?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, Some(&h))
    }
}

/// `LoopGateProjection`: a weight `[heads, head_dim]` and a bias `[heads]`.
#[derive(Debug)]
pub struct LoopGateProjection {
    weight: Param,
    bias: Param,
}
impl_module!(LoopGateProjection { weight, bias });

impl LoopGateProjection {
    /// mlx-lm's shapeless-compiled `_compute_gate`:
    /// `sigmoid(query @ weight[:, None, :].swapaxes(-1, -2) + bias[..., None, None])`.
    fn forward(&self, query: &Array) -> Result<Array> {
        call_compiled(
            "iquestloopcoder.compute_gate",
            |a| {
                let w = a[1].expand_dims(&[1])?.swapaxes(-1, -2)?;
                let logits = a[0].matmul(&w)?.add(&a[2].expand_dims(&[-1, -2])?)?;
                Ok(vec![logits.sigmoid()?])
            },
            &[query, &self.weight, &self.bias],
        )
    }
}

/// mlx-lm's shapeless-compiled `_mix_attention`: `gate * global + (1 - gate) * local`.
fn mix_attention(gate: &Array, global: &Array, local: &Array) -> Result<Array> {
    call_compiled(
        "iquestloopcoder.mix_attention",
        |a| {
            let rest = a[0].negative()?.add(1.0)?;
            Ok(vec![a[0].multiply(&a[1])?.add(&rest.multiply(&a[2])?)?])
        },
        &[gate, global, local],
    )
}

/// `IQuestLoopCoderModel`.
#[derive(Debug)]
pub struct LoopModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    gate_projections: Vec<LoopGateProjection>,
}
impl_module!(LoopModel {
    embed_tokens,
    layers,
    norm,
    gate_projections
});

/// IQuest-Loop-Coder with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: LoopModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.loop_num != 2 {
            return Err(config_error("iquestloopcoder", format!(
                "Only loop_num=2 is supported, got {}",
                args.loop_num
            )));
        }
        if args.loop_window_size <= 0 {
            return Err(config_error("iquestloopcoder", "key `loop_window_size` must be positive".into()));
        }
        let (dim, eps, heads) = (args.hidden_size, args.rms_norm_eps, args.num_attention_heads);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let d = AttentionDims {
                    dim,
                    n_heads: heads,
                    n_kv_heads: args.num_key_value_heads,
                    head_dim: args.head_dim,
                    qkv_bias: args.attention_bias,
                    o_bias: args.attention_bias,
                };
                let scaling = args.rope_scaling.as_ref();
                let max_positions = Some(args.max_position_embeddings);
                Ok(TransformerBlock {
                    self_attn: Attention::with_scaled_rope(d, args.rope_theta, scaling, max_positions)?,
                    mlp: Mlp::new(dim, args.intermediate_size, args.mlp_bias)?,
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let gate_projections = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(LoopGateProjection {
                    weight: Param::new(ops::zeros(&[heads, args.head_dim], Dtype::Float32)?),
                    bias: Param::new(ops::zeros(&[heads], Dtype::Float32)?),
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = LoopModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            gate_projections,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "iquestloopcoder")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let n_layers = m.layers.len();
        if !caches.is_empty() && caches.len() != 2 * n_layers {
            return Err(mlx_array::Error::InvalidArgument(format!(
                "iquestloopcoder: {} caches for {n_layers} layers (two loops need {})",
                caches.len(),
                2 * n_layers
            )));
        }
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let mask = create_attention_mask(n, cache_at(caches, 0), None, false)?;
        let window = Some(self.args.loop_window_size);
        let window_mask = create_attention_mask(n, cache_at(caches, n_layers), window, false)?;
        let mut slots: Vec<Option<&mut Box<dyn KvCache>>> = caches.iter_mut().map(Some).collect();
        slots.resize_with(2 * n_layers, || None);
        let (first, second) = slots.split_at_mut(n_layers);
        let mut loop1_kv = Vec::with_capacity(n_layers);
        for (layer, slot) in m.layers.iter().zip(first.iter_mut()) {
            let cache = slot.as_deref_mut();
            let x = layer.input_layernorm.forward(&h)?;
            let [q, k, v] = layer.self_attn.rotated_qkv(&x, cache.as_deref().map(|c| &**c))?;
            let fetch = match cache {
                Some(c) => mlx_nn::pipeline::update_and_fetch(c.as_mut(), &k, &v)?,
                None => KvFetch::Plain { keys: k, values: v },
            };
            let out = layer.self_attn.attend(&q, &fetch, &mask)?;
            loop1_kv.push(fetch);
            h = layer.finish(&out, &h)?;
        }
        for (((layer, gate_proj), slot), kv1) in m
            .layers
            .iter()
            .zip(&m.gate_projections)
            .zip(second.iter_mut())
            .zip(&loop1_kv)
        {
            let cache = slot.as_deref_mut();
            let x = layer.input_layernorm.forward(&h)?;
            let [q, k, v] = layer.self_attn.rotated_qkv(&x, cache.as_deref().map(|c| &**c))?;
            let gate = gate_proj.forward(&q)?;
            let global = layer.self_attn.attend(&q, kv1, &mask)?;
            let fetch = match cache {
                Some(c) => mlx_nn::pipeline::update_and_fetch(c.as_mut(), &k, &v)?,
                None => KvFetch::Plain { keys: k, values: v },
            };
            let local = layer.self_attn.attend(&q, &fetch, &window_mask)?;
            h = layer.finish(&mix_attention(&gate, &global, &local)?, &h)?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: a `KVCache` per layer for the first loop, then a
    /// `RotatingKVCache(loop_window_size)` per layer for the second.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let n = self.model.layers.len();
        let window = self.args.loop_window_size;
        super::window_cache_specs((0..2 * n).map(|i| i >= n), window)
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

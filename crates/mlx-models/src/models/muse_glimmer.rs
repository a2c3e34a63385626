//! Muse Glimmer's language model (`muse_glimmer`), following
//! `mlx_lm/models/muse_glimmer.py`: the token embeddings through a weightless RMS norm;
//! layers `h + post_attention_layernorm(self_attn(input_layernorm(h)))` then
//! `h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))` with Gemma's
//! `1 + weight` norms (the post-norms at `post_norm_eps`); attention whose queries and
//! keys go through weightless per-head RMS norms (the queries then times
//! `qk_scale_factor`), rotated at `rope_theta` only where the layer's
//! `layer_rope_theta` is nonzero (by default the sliding layers; the full ones are
//! NoPE), the merged heads gated by `sigmoid(gate_proj(x))` before `o_proj`;
//! `layer_types` (default three `sliding_attention` then a `full_attention`) choosing a
//! `RotatingKVCache(sliding_window)` and windowed mask or a `KVCache`; a silu MLP; the
//! final `nn.RMSNorm`, the head (tied by `tie_word_embeddings`), `* output_multiplier`
//! and `tanh(logits / cap) * cap`. The keys of a nested `text_config` override the
//! top-level ones; `sanitize` drops the vision weights and lifts the text model out of
//! `language_model`.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt, OutGate};
use super::config_error;
use super::gemma2::RmsNorm as CenteredRmsNorm;
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{layer_caches, Architecture, LayerMasks, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, Array, Result};
use mlx_nn::activations::silu;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::{Map, Value};

const SLIDING: &str = "sliding_attention";

/// config.json keys read by Muse Glimmer (mlx-lm's defaults for the others).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub vocab_size: i32,
    pub rms_norm_eps: f64,
    pub post_norm_eps: f64,
    pub sliding_window: i32,
    pub qk_scale_factor: f64,
    pub rope_theta: f64,
    pub rope_parameters: Option<Map<String, Value>>,
    pub layer_types: Option<Vec<String>>,
    pub layer_rope_theta: Option<Vec<f64>>,
    pub tie_word_embeddings: bool,
    pub final_logit_softcapping: f64,
    pub output_multiplier: f64,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "muse_glimmer".into(),
            hidden_size: 6656,
            num_hidden_layers: 52,
            intermediate_size: 19968,
            num_attention_heads: 32,
            num_key_value_heads: 2,
            head_dim: 128,
            vocab_size: 202048,
            rms_norm_eps: 1e-5,
            post_norm_eps: 1e-8,
            sliding_window: 2048,
            qk_scale_factor: 3.87,
            rope_theta: 500000.0,
            rope_parameters: None,
            layer_types: None,
            layer_rope_theta: None,
            tie_word_embeddings: false,
            final_logit_softcapping: 20.0,
            output_multiplier: 0.19611613513818404,
        }
    }
}

/// `ModelArgs.from_dict` and `__post_init__`: the keys of `text_config` over the
/// top-level ones, `rope_parameters["rope_theta"]` over `rope_theta`, the default layer
/// pattern and per-layer RoPE switch.
fn parse(config: &Value) -> crate::Result<(ModelArgs, Vec<String>, Vec<bool>)> {
    let err = |m: String| config_error("muse_glimmer", m);
    let merged = match (config.as_object(), config.get("text_config")) {
        (Some(top), Some(Value::Object(text))) => {
            let mut merged = top.clone();
            merged.extend(text.iter().map(|(k, v)| (k.clone(), v.clone())));
            Value::Object(merged)
        }
        (_, Some(other)) if !other.is_null() => {
            return Err(err("key `text_config` must be an object".into()));
        }
        _ => config.clone(),
    };
    let mut args: ModelArgs = parse_args(&merged, "muse_glimmer")?;
    if let Some(theta) = args.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")) {
        args.rope_theta = theta
            .as_f64()
            .ok_or_else(|| err(format!("key `rope_parameters.rope_theta` must be a number, got {theta}")))?;
    }
    let n = usize::try_from(args.num_hidden_layers)
        .map_err(|_| err("key `num_hidden_layers` must not be negative".into()))?;
    let layer_types = match &args.layer_types {
        Some(types) if types.len() != n => {
            return Err(err(format!(
                "key `layer_types` has {} entries for {n} layers",
                types.len()
            )))
        }
        Some(types) => types.clone(),
        None => (0..n)
            .map(|i| if i % 4 == 3 { "full_attention" } else { SLIDING }.to_string())
            .collect(),
    };
    let uses_rope = match &args.layer_rope_theta {
        Some(thetas) if thetas.len() < n => {
            return Err(err(format!(
                "key `layer_rope_theta` has {} entries for {n} layers",
                thetas.len()
            )))
        }
        Some(thetas) => thetas[..n].iter().map(|&t| t != 0.0).collect(),
        // `0 if full else rope_theta`, read as a bool.
        None => layer_types
            .iter()
            .map(|t| t != "full_attention" && args.rope_theta != 0.0)
            .collect(),
    };
    let (heads, kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(err(format!(
            "`num_attention_heads` ({heads}) must be a positive multiple of \
             `num_key_value_heads` ({kv_heads})"
        )));
    }
    if args.sliding_window <= 0 && layer_types.iter().any(|t| t == SLIDING) {
        return Err(err(format!(
            "key `sliding_window` ({}) must be positive",
            args.sliding_window
        )));
    }
    Ok((args, layer_types, uses_rope))
}

/// `DecoderLayer`.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: CenteredRmsNorm,
    post_attention_layernorm: CenteredRmsNorm,
    pre_feedforward_layernorm: CenteredRmsNorm,
    post_feedforward_layernorm: CenteredRmsNorm,
    sliding: bool,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    post_feedforward_layernorm
});

impl DecoderLayer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            None,
            Default::default(),
        )?;
        let h = x.add(&self.post_attention_layernorm.forward(&h)?)?;
        let r = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&h)?, None)?;
        h.add(&self.post_feedforward_layernorm.forward(&r)?)
    }
}

/// `MuseGlimmerModel`.
#[derive(Debug)]
pub struct MuseGlimmerModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}
impl_module!(MuseGlimmerModel {
    embed_tokens,
    layers,
    norm
});

/// Muse Glimmer with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: MuseGlimmerModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn from_config(config: &Value) -> crate::Result<Model> {
        let (args, layer_types, uses_rope) = parse(config)?;
        let (dim, eps, head_dim) = (args.hidden_size, args.rms_norm_eps, args.head_dim);
        let (q_eps, factor) = (eps as f32, args.qk_scale_factor);
        let layers = layer_types
            .iter()
            .zip(&uses_rope)
            .map(|(t, &rope)| {
                let d = AttentionDims {
                    dim,
                    n_heads: args.num_attention_heads,
                    n_kv_heads: args.num_key_value_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                let rope = if rope {
                    Rope::new(head_dim, false, args.rope_theta, 1.0)
                } else {
                    Rope::Identity
                };
                let self_attn = Attention::new(d, rope, f64::from(head_dim).powf(-0.5))?
                    .with_qk_norm_pair(
                        NormAt::Heads,
                        HeadNorm::WeightlessTimes(q_eps, factor),
                        HeadNorm::Weightless(q_eps),
                    )
                    .with_output_gate("gate_proj", dim, false, OutGate::PerFeature)?;
                Ok(DecoderLayer {
                    self_attn,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?
                        .up_before_down()
                        .with_activation(silu),
                    input_layernorm: CenteredRmsNorm::new(dim, eps)?,
                    post_attention_layernorm: CenteredRmsNorm::new(dim, args.post_norm_eps)?,
                    pre_feedforward_layernorm: CenteredRmsNorm::new(dim, eps)?,
                    post_feedforward_layernorm: CenteredRmsNorm::new(dim, args.post_norm_eps)?,
                    sliding: t == SLIDING,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = MuseGlimmerModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
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
    Ok(Box::new(Model::from_config(config)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let mut h = fast::rms_norm(&h, None, self.args.rms_norm_eps as f32)?;
        let n = h.dim(1)?;
        // Each kind's mask from the cache of its first layer.
        let full_idx = m.layers.iter().position(|l| !l.sliding).unwrap_or(0);
        let swa_idx = m.layers.iter().position(|l| l.sliding);
        let masks = LayerMasks::new(n, caches, full_idx, swa_idx, Some(self.args.sliding_window))?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            let mask = masks.get(layer.sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        let scale = LogitScale::Times(self.args.output_multiplier);
        let out = head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, scale)?;
        let cap = self.args.final_logit_softcapping;
        out.divide(cap)?.tanh()?.multiply(cap)
    }

    /// `make_cache`: a `RotatingKVCache(sliding_window)` for each sliding layer, a
    /// `KVCache` for the others.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.sliding);
        super::window_cache_specs(sliding, self.args.sliding_window)
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!();
}

impl Architecture for Model {
    /// Drops the vision tower and adapter; the text model's keys under
    /// `language_model.model.`, `language_model.lm_head.` or `model.language_model.` lose
    /// that nesting.
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        let vision = ["vision_tower", "vision_adapter", "vision_projection"];
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !vision.iter().any(|p| k.starts_with(p)))
            .map(|(k, v)| {
                let k = if let Some(rest) = k.strip_prefix("language_model.model.") {
                    format!("model.{rest}")
                } else if let Some(rest) = k.strip_prefix("language_model.lm_head.") {
                    format!("lm_head.{rest}")
                } else if let Some(rest) = k.strip_prefix("model.language_model.") {
                    format!("model.{rest}")
                } else {
                    k
                };
                (k, v)
            })
            .collect())
    }

    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

//! PLaMo 3 (`plamo3`), following `mlx_lm/models/plamo3.py`: layers under
//! `model.layers.layers`, each `h + post_mixer_norm(mixer(pre_mixer_norm(h)))` then
//! `h + post_mlp_norm(mlp(pre_mlp_norm(h)))`, every RMS norm applied as
//! `rms_norm(x, weight + offset)` (offset 1, the post-norms 1/5 and 1/5^1.5); attention
//! from one `qkv_proj` (query, key, value heads in turn) with offset-1 q/k norms per
//! head, `nn.RoPE` at `rope_theta` on the full layers (every `sliding_window_pattern`-th)
//! and `rope_local_theta` on the sliding ones, whose `RotatingKVCache(window_size)` is
//! masked with a window of `window_size + 1` (`sliding_window` replaces `window_size`
//! where set); a SwiGLU MLP from one `gate_up_proj`; the head tied by
//! `tie_word_embeddings` (default), `sanitize` then dropping `lm_head.weight`.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::config_error;
use super::decoder::FeedForward;
use super::gemma2::RmsNorm;
use super::head::{self, LogitScale};
use super::lm::drop_tied_head;
use super::mlp::GateUpMlp;
use super::{layer_caches, Architecture, LayerMasks, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by PLaMo 3 (mlx-lm's defaults for the others).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub window_size: i32,
    pub sliding_window: Option<i32>,
    pub sliding_window_pattern: i32,
    pub rope_theta: f64,
    pub rope_local_theta: f64,
    pub intermediate_size: i32,
    pub vocab_size: i32,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "plamo3".into(),
            hidden_size: 4096,
            num_hidden_layers: 32,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            head_dim: 128,
            window_size: 2048,
            sliding_window: None,
            sliding_window_pattern: 8,
            rope_theta: 1_000_000.0,
            rope_local_theta: 10_000.0,
            intermediate_size: 13312,
            vocab_size: 32000,
        }
    }
}

impl ModelArgs {
    /// `__post_init__`: `sliding_window` replaces `window_size` where set.
    fn window(&self) -> i32 {
        self.sliding_window.unwrap_or(self.window_size)
    }

    /// `is_full_attention`: every `sliding_window_pattern`-th layer attends globally.
    fn is_full(&self, layer: i32) -> bool {
        (layer + 1) % self.sliding_window_pattern == 0
    }
}

/// `Plamo3DecoderLayer`.
#[derive(Debug)]
pub struct DecoderLayer {
    mixer: Attention,
    mlp: GateUpMlp,
    pre_mixer_norm: RmsNorm,
    post_mixer_norm: RmsNorm,
    pre_mlp_norm: RmsNorm,
    post_mlp_norm: RmsNorm,
    full_attn: bool,
}
impl_module!(DecoderLayer {
    mixer,
    mlp,
    pre_mixer_norm,
    post_mixer_norm,
    pre_mlp_norm,
    post_mlp_norm
});

impl DecoderLayer {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let r = self.mixer.forward(
            &self.pre_mixer_norm.forward(x)?,
            mask,
            cache,
            None,
            Default::default(),
        )?;
        let h = x.add(&self.post_mixer_norm.forward(&r)?)?;
        let r = self.mlp.forward(&self.pre_mlp_norm.forward(&h)?, None)?;
        h.add(&self.post_mlp_norm.forward(&r)?)
    }
}

/// `Plamo3Decoder`: the list of layers (`model.layers.layers`).
#[derive(Debug)]
pub struct Decoder {
    layers: Vec<DecoderLayer>,
}
impl_module!(Decoder { layers });

/// `Plamo3Model`.
#[derive(Debug)]
pub struct Plamo3Model {
    embed_tokens: EmbeddingLayer,
    layers: Decoder,
    norm: RmsNorm,
}
impl_module!(Plamo3Model {
    embed_tokens,
    layers,
    norm
});

/// PLaMo 3 with its head (tied unless `tie_word_embeddings` is false).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Plamo3Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |m: String| config_error("plamo3", m);
        let (heads, kv_heads) = (args.num_attention_heads, args.num_key_value_heads);
        if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
            return Err(err(format!(
                "`num_attention_heads` ({heads}) must be a positive multiple of \
                 `num_key_value_heads` ({kv_heads})"
            )));
        }
        if args.sliding_window_pattern <= 0 {
            return Err(err(format!(
                "`sliding_window_pattern` ({}) must be positive",
                args.sliding_window_pattern
            )));
        }
        if args.window() <= 0 {
            return Err(err(format!(
                "the attention window (`sliding_window` or `window_size`: {}) must be positive",
                args.window()
            )));
        }
        let (dim, eps, head_dim) = (args.hidden_size, args.rms_norm_eps, args.head_dim);
        let layers = (0..args.num_hidden_layers)
            .map(|i| {
                let full_attn = args.is_full(i);
                let base = if full_attn {
                    args.rope_theta
                } else {
                    args.rope_local_theta
                };
                let d = AttentionDims {
                    dim,
                    n_heads: heads,
                    n_kv_heads: kv_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                let rope = Rope::new(head_dim, false, base, 1.0);
                let scale = f64::from(head_dim).powf(-0.5);
                let mixer = Attention::new_joint_qkv(d, "qkv_proj", rope, scale)?
                    .with_qk_norms(NormAt::SplitHeads, |n| {
                        Ok(HeadNorm::Gemma(RmsNorm::new(n, eps)?))
                    })?;
                Ok(DecoderLayer {
                    mixer,
                    mlp: GateUpMlp::new(dim, args.intermediate_size, ["gate_up_proj", "down_proj"])?,
                    pre_mixer_norm: RmsNorm::new(dim, eps)?,
                    post_mixer_norm: RmsNorm::with_offset(dim, eps, 1.0 / 5.0)?,
                    pre_mlp_norm: RmsNorm::new(dim, eps)?,
                    post_mlp_norm: RmsNorm::with_offset(dim, eps, 1.0 / 5f64.powf(1.5))?,
                    full_attn,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Plamo3Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers: Decoder { layers },
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
    Ok(Box::new(Model::new(parse_args(config, "plamo3")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let layers = &m.layers.layers;
        let mut h = m.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        // `full_idx` falls back to layer 0 where no layer is full (its mask then unused).
        let full_idx = layers.iter().position(|l| l.full_attn).unwrap_or(0);
        let swa_idx = layers.iter().position(|l| !l.full_attn);
        let window = Some(self.args.window() + 1);
        let masks = LayerMasks::new(n, caches, full_idx, swa_idx, window)?;
        for (layer, cache) in layers.iter().zip(layer_caches(caches, layers.len())?) {
            let mask = masks.get(!layer.full_attn);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        head::logits(&m.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }

    /// `make_cache`: a `KVCache` for each full layer, a `RotatingKVCache(window_size)`
    /// for each sliding one.
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.layers.iter().map(|l| !l.full_attn);
        super::window_cache_specs(sliding, self.args.window())
    }

    fn defines_make_cache(&self) -> bool {
        true
    }

    decoder_accessors!(model.layers.layers);
}

impl Architecture for Model {
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        Ok(weights)
    }
}

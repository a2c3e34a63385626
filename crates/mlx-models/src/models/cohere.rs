//! Cohere (Command R), following `mlx_lm/models/cohere.py`: attention and feed-forward
//! side by side on one layer norm, a traditional RoPE on every layer, optional q/k
//! layer norms with one weight per head, and the tied head scaled by `logit_scale`.
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{layer_caches, Architecture, LayerMasks};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, Param, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Cohere (mlx-lm's defaults are Command R's).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    #[serde(default = "default_hidden")]
    pub hidden_size: i32,
    #[serde(default = "default_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "default_intermediate")]
    pub intermediate_size: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_vocab")]
    pub vocab_size: i32,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_logit_scale")]
    pub logit_scale: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub layer_norm_bias: bool,
    #[serde(default)]
    pub use_qk_norm: bool,
}

fn default_hidden() -> i32 {
    8192
}
fn default_layers() -> i32 {
    40
}
fn default_intermediate() -> i32 {
    22528
}
fn default_heads() -> i32 {
    64
}
fn default_rope_theta() -> f64 {
    8000000.0
}
fn default_vocab() -> i32 {
    256000
}
fn default_eps() -> f64 {
    1e-5
}
fn default_logit_scale() -> f64 {
    0.0625
}

/// mlx-lm's `LayerNorm2D`: `weight * layer_norm(x)` with a `[heads, head_dim]` weight.
#[derive(Debug)]
pub struct LayerNorm2d {
    weight: Param,
    eps: f32,
}
impl_module!(LayerNorm2d { weight });

impl LayerNorm2d {
    fn new(d1: i32, d2: i32, eps: f64) -> crate::Result<LayerNorm2d> {
        Ok(LayerNorm2d {
            weight: Param::new(ops::zeros(&[d1, d2], Dtype::Float32)?),
            eps: eps as f32,
        })
    }

    /// `weight * mx.fast.layer_norm(x, None, None, eps)`.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        self.weight
            .multiply(&fast::layer_norm(x, None, None, self.eps)?)
    }
}

/// One layer: `attn(norm(x)) + mlp(norm(x)) + x`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm,
    /// Whether the layer attends through the sliding window (Cohere 2).
    pub(crate) sliding: bool,
    /// Cohere 2's float16 queries attend in float32.
    f16_queries_in_f32: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    input_layernorm
});

impl TransformerBlock {
    /// A global layer (see [`TransformerBlock::sliding`]).
    pub(crate) fn new(self_attn: Attention, mlp: Mlp, input_layernorm: LayerNorm) -> Self {
        TransformerBlock {
            self_attn,
            mlp,
            input_layernorm,
            sliding: false,
            f16_queries_in_f32: false,
        }
    }

    /// The layer attending through the window where `sliding`, its float16 queries in
    /// float32 (Cohere 2's).
    pub(crate) fn sliding(mut self, sliding: bool) -> Self {
        self.sliding = sliding;
        self.f16_queries_in_f32 = true;
        self
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.input_layernorm.forward(x)?;
        let extras = Extras {
            f16_queries_in_f32: self.f16_queries_in_f32,
            ..Default::default()
        };
        let attn = self.self_attn.forward(&h, mask, cache, None, extras)?;
        let ff = self.mlp.forward(&h, None)?;
        attn.add(&ff)?.add(x)
    }
}

/// The decoder stack: the global mask from the cache of layer `full_idx`, the windowed
/// one (Cohere 2's sliding layers) from that of layer `swa_idx`.
#[derive(Debug)]
pub struct CohereModel {
    embed_tokens: EmbeddingLayer,
    pub(crate) layers: Vec<TransformerBlock>,
    norm: LayerNorm,
    full_idx: usize,
    swa_idx: Option<usize>,
    window: Option<i32>,
}
impl_module!(CohereModel {
    embed_tokens,
    layers,
    norm
});

impl CohereModel {
    /// The stack over `layers` with a `vocab x dim` embedding; the masks as
    /// [`LayerMasks::new`] takes them.
    pub(crate) fn new(
        vocab: i32,
        dim: i32,
        layers: Vec<TransformerBlock>,
        norm: LayerNorm,
        (full_idx, swa_idx, window): (usize, Option<usize>, Option<i32>),
    ) -> crate::Result<CohereModel> {
        Ok(CohereModel {
            embed_tokens: EmbeddingLayer::new(vocab, dim)?,
            layers,
            norm,
            full_idx,
            swa_idx,
            window,
        })
    }

    /// The logits of `tokens` through the tied head, times `logit_scale`.
    pub(crate) fn logits(
        &self,
        tokens: &Array,
        caches: &mut [Box<dyn KvCache>],
        logit_scale: f64,
    ) -> Result<Array> {
        let mut h = self.embed_tokens.forward(tokens)?;
        let n = h.dim(1)?;
        let masks = LayerMasks::new(n, caches, self.full_idx, self.swa_idx, self.window)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(layer.sliding);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, TransformerBlock::forward)?;
        }
        let out = self.norm.forward(&h)?;
        head::logits(
            &self.embed_tokens,
            None,
            &out,
            LogitScale::Times(logit_scale),
        )
    }

    /// Fuses every layer's q/k/v and gate/up projections.
    pub(crate) fn fuse(&mut self) -> crate::Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

/// Cohere (the head is always the tied embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: CohereModel,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        if args.vocab_size <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (cohere)".into(),
                message: "vocab_size must be positive".into(),
            });
        }
        let (dim, n_heads, n_kv) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
        );
        let head_dim = dim / n_heads.max(1);
        let d = AttentionDims {
            dim,
            n_heads,
            n_kv_heads: n_kv,
            head_dim,
            qkv_bias: args.attention_bias,
            o_bias: args.attention_bias,
        };
        let eps = args.layer_norm_eps;
        let norm = || LayerNorm::new(dim, eps, true, args.layer_norm_bias);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let rope = Rope::new(head_dim, true, args.rope_theta, 1.0);
                let mut self_attn = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?;
                if args.use_qk_norm {
                    self_attn = self_attn.with_qk_norm_pair(
                        NormAt::Heads,
                        HeadNorm::PerHead(LayerNorm2d::new(n_heads, head_dim, eps)?),
                        HeadNorm::PerHead(LayerNorm2d::new(n_kv, head_dim, eps)?),
                    );
                }
                let mlp = Mlp::new(dim, args.intermediate_size, false)?.up_before_down();
                Ok(TransformerBlock::new(self_attn, mlp, norm()?))
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = CohereModel::new(args.vocab_size, dim, layers, norm()?, (0, None, None))?;
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "cohere")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.model.logits(tokens, caches, self.args.logit_scale)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

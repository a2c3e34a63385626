//! EXAONE 4, following `mlx_lm/models/exaone4.py`: per-head q/k RMS norms, norms after
//! attention and feed-forward, and with a `sliding_window_pattern` ("LLLG"...) local
//! layers in a sliding window with RoPE and global layers without it.
use super::mlp::Mlp;
use super::window_cache_specs;
use super::LayerMasks;
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::{layer_caches, Architecture};
use crate::config::{parse_args, rope_scaling};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, initialize_rope, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by EXAONE 4.
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
    pub num_key_value_heads: i32,
    pub max_position_embeddings: i32,
    pub rope_theta: f64,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    pub rope_scaling: Option<Value>,
    pub sliding_window: Option<i32>,
    pub sliding_window_pattern: Option<String>,
}

/// EXAONE 4's self-attention, also EXAONE MoE's: no biases, per-head q/k RMS norms
/// (`eps`), scale `head_dim^-0.5`, RoPE (`rope_theta`, `rope_scaling`) where `use_rope`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn exaone_attention(
    hidden_size: i32,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    rope_theta: f64,
    rope_scaling_cfg: Option<&Value>,
    max_position_embeddings: i32,
    eps: f64,
    use_rope: bool,
) -> crate::Result<Attention> {
    let rope = if use_rope {
        initialize_rope(
            head_dim,
            rope_theta,
            false,
            rope_scaling(rope_scaling_cfg)?.as_ref(),
            Some(max_position_embeddings),
        )?
    } else {
        Rope::Identity
    };
    let dims = AttentionDims {
        dim: hidden_size,
        n_heads,
        n_kv_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    Attention::new(dims, rope, (head_dim as f64).powf(-0.5))?
        .with_qk_norms(NormAt::Heads, |n| Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?)))
}

/// A layer's attention: RoPE unless the layer is global in a patterned model
/// (`is_local`: `None` without a pattern).
fn attention(args: &ModelArgs, is_local: Option<bool>) -> crate::Result<Attention> {
    exaone_attention(
        args.hidden_size,
        args.num_attention_heads,
        args.num_key_value_heads,
        args.head_dim,
        args.rope_theta,
        args.rope_scaling.as_ref(),
        args.max_position_embeddings,
        args.rms_norm_eps,
        is_local.unwrap_or(true),
    )
}

/// One decoder layer: `h = x + norm(attn(x))`, `out = h + norm(mlp(h))`.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    post_attention_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    is_local: bool,
}
impl_module!(TransformerBlock {
    self_attn,
    mlp,
    post_attention_layernorm,
    post_feedforward_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self.self_attn.forward(x, mask, cache, None, Extras::default())?;
        let h = x.add(&self.post_attention_layernorm.forward(&r)?)?;
        let r = self.mlp.forward(&h, None)?;
        h.add(&self.post_feedforward_layernorm.forward(&r)?)
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct ExaoneModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
    swa_idx: Option<usize>,
    full_idx: usize,
    window_size: Option<i32>,
}
impl_module!(ExaoneModel {
    embed_tokens,
    layers,
    norm
});

impl ExaoneModel {
    fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let mut h = self.embed_tokens.forward(inputs)?;
        let n = h.dim(1)?;
        let masks = LayerMasks::new(n, caches, self.full_idx, self.swa_idx, self.window_size)?;
        for (layer, cache) in self
            .layers
            .iter()
            .zip(layer_caches(caches, self.layers.len())?)
        {
            let mask = masks.get(layer.is_local);
            h = mlx_nn::checkpoint::layer(layer, &h, mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.norm.forward(&h)
    }
}

/// EXAONE 4 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: ExaoneModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let err = |message: &str| crate::Error::Config {
            path: "config.json (exaone4)".into(),
            message: message.into(),
        };
        let pattern: Option<Vec<char>> = args
            .sliding_window_pattern
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| p.chars().collect());
        let (swa_idx, full_idx) =
            match &pattern {
                Some(p) => (
                    Some(p.iter().position(|&c| c == 'L').ok_or_else(|| {
                        err("key `sliding_window_pattern` has no local (`L`) layer")
                    })?),
                    p.iter().position(|&c| c == 'G').ok_or_else(|| {
                        err("key `sliding_window_pattern` has no global (`G`) layer")
                    })?,
                ),
                None => (None, 0),
            };
        if swa_idx.is_some() && args.sliding_window.is_none() {
            return Err(err("a `sliding_window_pattern` needs `sliding_window`"));
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers as usize)
            .map(|i| {
                let is_local = pattern.as_ref().map(|p| p[i % p.len()] == 'L');
                Ok(TransformerBlock {
                    self_attn: attention(&args, is_local)?,
                    mlp: Mlp::new(dim, args.intermediate_size, false)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                    post_feedforward_layernorm: RmsNorm::new(dim, eps)?,
                    is_local: is_local.unwrap_or(false),
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = ExaoneModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
            swa_idx,
            full_idx,
            window_size: args.sliding_window,
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
    Ok(Box::new(Model::new(parse_args(config, "exaone4")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        let sliding = self.model.layers.iter().map(|l| l.is_local);
        window_cache_specs(sliding, self.args.sliding_window.unwrap_or(0))
    }
    fn defines_make_cache(&self) -> bool {
        true
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

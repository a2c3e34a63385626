//! OLMo (the first release, `model_type` "olmo"), following `mlx_lm/models/olmo.py`:
//! `model.transformer` with a `wte` embedding of `embedding_size` rows, `blocks` whose
//! parameter-free layer norms precede a fused `att_proj` (q, k, v in thirds) and a fused
//! `ff_proj` (its halves feed SwiGLU, the second half as the gate), attention written
//! out with plain ops (softmax in float32), and an untied `ff_out` head or the tied
//! embedding.
//!
//! Two places where mlx-lm 0.32.2's file cannot run and this one does what it was written
//! for (docs/parity.md): its `scores += mask` receives the "causal" string mask for any
//! input of more than one token (a `ValueError`); here the causal mask applies (the
//! masked scores set to the dtype's most negative value, which gives the same bits as
//! the additive masks the file was written against). Its tied head returns
//! `(logits, cache)`; here the logits.
use super::config_error;
use super::head::{self, LogitScale};
use super::lm::even_head_dim;
use super::{batch_len, cache_at, layer_caches, merge_heads, rope_cache, split_heads};
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Dtype, Result};
use mlx_nn::attention::mask_scores;
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, KvFetch, LayerNorm, LinearLayer,
    Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by OLMo (those without a default are required, as in mlx-lm;
/// `mlp_hidden_size` may be null).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub d_model: i32,
    pub n_layers: i32,
    #[serde(deserialize_with = "Option::deserialize")]
    pub mlp_hidden_size: Option<i32>,
    pub n_heads: i32,
    pub vocab_size: i32,
    pub embedding_size: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default = "default_mlp_ratio")]
    pub mlp_ratio: i32,
    #[serde(default)]
    pub weight_tying: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_mlp_ratio() -> i32 {
    4
}

impl ModelArgs {
    /// `__post_init__`: `mlp_hidden_size` defaults to `mlp_ratio * d_model`. It must be
    /// even (mlx-lm splits `ff_proj` in two halves).
    fn mlp_hidden(&self) -> crate::Result<i32> {
        let hidden = self
            .mlp_hidden_size
            .unwrap_or(self.mlp_ratio * self.d_model);
        if hidden < 2 || hidden % 2 != 0 {
            return Err(config_error("olmo", format!(
                "the MLP width (`mlp_hidden_size`, else `mlp_ratio * d_model`) must be a \
                 positive even number (got {hidden}): `ff_proj` is split in two halves"
            )));
        }
        Ok(hidden)
    }
}

/// One OLMo block: attention and SwiGLU feed-forward, each after a layer norm without
/// parameters.
#[derive(Debug)]
pub struct TransformerBlock {
    ff_proj: LinearLayer,
    ff_out: LinearLayer,
    att_norm: LayerNorm,
    ff_norm: LayerNorm,
    att_proj: LinearLayer,
    attn_out: LinearLayer,
    rope: Rope,
    n_heads: i32,
    scale: f64,
}
impl_module!(TransformerBlock {
    ff_proj,
    ff_out,
    att_norm,
    ff_norm,
    att_proj,
    attn_out
});

/// The three equal parts of a fused projection's last axis (`mx.split(x, n, axis=-1)`).
fn split_last<const N: usize>(x: &Array) -> Result<[Array; N]> {
    <[Array; N]>::try_from(x.split_sections(N as i32, -1)?).map_err(|_| {
        mlx_array::Error::InvalidArgument(format!("a fused projection does not split in {N}"))
    })
}

impl TransformerBlock {
    fn new(args: &ModelArgs, head_dim: i32, mlp_hidden: i32) -> crate::Result<TransformerBlock> {
        let dim = args.d_model;
        Ok(TransformerBlock {
            ff_proj: LinearLayer::new(dim, mlp_hidden, false)?,
            ff_out: LinearLayer::new(mlp_hidden / 2, dim, false)?,
            att_norm: LayerNorm::new(dim, 1e-5, false, false)?,
            ff_norm: LayerNorm::new(dim, 1e-5, false, false)?,
            att_proj: LinearLayer::new(dim, 3 * dim, false)?,
            attn_out: LinearLayer::new(dim, dim, false)?,
            rope: Rope::new(head_dim, args.rope_traditional, args.rope_theta, 1.0),
            n_heads: args.n_heads,
            scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// `attend`: `softmax((q * scale) @ k.T + mask)` in float32, cast back, times v.
    fn attend(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let [q, k, v] = split_last::<3>(&self.att_proj.forward(x)?)?;
        let n = self.n_heads;
        let (queries, fetch) = rope_cache(
            &split_heads(&q, b, l, n)?,
            &split_heads(&k, b, l, n)?,
            split_heads(&v, b, l, n)?,
            &self.rope,
            cache,
        )?;
        let KvFetch::Plain { keys, values } = fetch else {
            // mlx-lm's `keys.transpose(...)` fails on the quantized triple.
            return Err(mlx_array::Error::InvalidArgument(
                "olmo attention does not support quantized KV caches (as in mlx-lm)".into(),
            ));
        };
        let scores = queries
            .multiply(self.scale)?
            .matmul(&keys.swapaxes(-1, -2)?)?;
        let scores = match mask {
            AttnMask::None => scores,
            AttnMask::Array(m) | AttnMask::LeftPadded { mask: m, .. } => mask_scores(&scores, m)?,
            AttnMask::Causal => {
                return Err(mlx_array::Error::InvalidArgument(
                    "olmo attention needs an array mask".into(),
                ))
            }
        };
        let dtype = scores.dtype();
        let probs = scores
            .astype(Dtype::Float32)?
            .softmax(Some(&[-1]), false)?
            .astype(dtype)?;
        let out = probs.matmul(&values)?;
        self.attn_out.forward(&merge_heads(&out, b, l)?)
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let h = x.add(&self.attend(&self.att_norm.forward(x)?, mask, cache)?)?;
        let [x1, x2] = split_last::<2>(&self.ff_proj.forward(&self.ff_norm.forward(&h)?)?)?;
        h.add(&self.ff_out.forward(&activations::swiglu(&x2, &x1)?)?)
    }
}

/// `model.transformer`: the embedding, the blocks, the final norm and the untied head.
#[derive(Debug)]
pub struct Transformer {
    wte: EmbeddingLayer,
    blocks: Vec<TransformerBlock>,
    ff_out: Option<LinearLayer>,
    norm: LayerNorm,
}
impl_module!(Transformer {
    wte,
    blocks,
    ff_out,
    norm
});

/// `OlmoModel`: only the transformer.
#[derive(Debug)]
pub struct OlmoModel {
    transformer: Transformer,
}
impl_module!(OlmoModel { transformer });

/// OLMo.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: OlmoModel,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let head_dim = even_head_dim(args.d_model, args.n_heads, "olmo")?;
        let mlp_hidden = args.mlp_hidden()?;
        if args.embedding_size <= 0 {
            return Err(config_error("olmo", format!(
                "`embedding_size` must be positive (got {})",
                args.embedding_size
            )));
        }
        let blocks = (0..args.n_layers)
            .map(|_| TransformerBlock::new(&args, head_dim, mlp_hidden))
            .collect::<crate::Result<Vec<_>>>()?;
        let transformer = Transformer {
            wte: EmbeddingLayer::new(args.embedding_size, args.d_model)?,
            blocks,
            ff_out: head::untied(args.weight_tying, args.d_model, args.embedding_size)?,
            norm: LayerNorm::new(args.d_model, 1e-5, false, false)?,
        };
        Ok(Model {
            args,
            model: OlmoModel { transformer },
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "olmo")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let t = &self.model.transformer;
        let mut h = t.wte.forward(tokens)?;
        // The mask as an array: the scores are masked with plain ops.
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, true)?;
        for (block, cache) in t.blocks.iter().zip(layer_caches(caches, t.blocks.len())?) {
            h = mlx_nn::checkpoint::layer(block, &h, &mask, cache, |b, x, m, c| {
                b.forward(x, m, c)
            })?;
        }
        let h = t.norm.forward(&h)?;
        head::logits(&t.wte, t.ff_out.as_ref(), &h, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.transformer.blocks.len()]
    }
    fn model_type(&self) -> &str {
        &self.args.model_type
    }
    /// `embedding_size`: the rows of `wte` and the width of the logits (the
    /// tokenizer's `vocab_size` may be smaller).
    #[allow(clippy::misnamed_getters)] // on purpose: the logits' width
    fn vocab_size(&self) -> i32 {
        self.args.embedding_size
    }
    fn num_layers(&self) -> usize {
        self.model.transformer.blocks.len()
    }
    fn as_module(&self) -> Option<&dyn mlx_nn::Module> {
        Some(self)
    }
    fn as_module_mut(&mut self) -> Option<&mut dyn mlx_nn::Module> {
        Some(self)
    }
}

/// No `sanitize` in mlx-lm's file: the checkpoint names are the model's.
impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights)
    }
}

//! GPT-2, following `mlx_lm/models/gpt2.py`: learned absolute positions (`wpe`, read
//! at the cache offset) instead of RoPE, one `c_attn` projection split into q, k and v,
//! layer norms, a GELU feed-forward four times the width, and the tied head. The
//! layers are shared with GPT-BigCode (gpt_bigcode.rs).
use super::{cache_at, layer_caches, merge_heads, split_heads, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::cache::{create_attention_mask, RopePosition};
use mlx_nn::{
    activations, impl_module, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache,
    KvFetch, LayerNorm, LinearLayer,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GPT-2.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub n_ctx: i32,
    pub n_embd: i32,
    pub n_head: i32,
    pub n_layer: i32,
    pub n_positions: i32,
    pub layer_norm_epsilon: f64,
    pub vocab_size: i32,
}

/// The positions of `l` new tokens after what `cache` holds (mlx-lm's
/// `mx.arange(L) + cache.offset`): `[L]` for one offset, `[B, L]` for a batch's
/// per-row offsets.
pub(crate) fn positions(l: i32, cache: Option<&dyn KvCache>) -> Result<Array> {
    let offset = match cache {
        Some(c) => c.rope_offset()?,
        None => RopePosition::Scalar(0),
    };
    let steps = ops::arange(0.0, l as f64, 1.0, Dtype::Int32)?;
    match offset {
        RopePosition::Scalar(o) => steps.add(&Array::scalar(o)?),
        RopePosition::PerRow(a) => steps.add(&a.expand_dims(&[-1])?),
    }
}

/// Attention over one `c_attn` projection holding `n_heads` query heads and
/// `n_kv_heads` key and value heads; no positional rotation.
#[derive(Debug)]
pub struct Attention {
    c_attn: LinearLayer,
    c_proj: LinearLayer,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f64,
}
impl_module!(Attention { c_attn, c_proj });

impl Attention {
    /// Zero placeholders for a `dim`-wide model.
    pub(crate) fn new(
        dim: i32,
        n_heads: i32,
        n_kv_heads: i32,
        bias: bool,
    ) -> crate::Result<Attention> {
        let head_dim = dim / n_heads;
        Ok(Attention {
            c_attn: LinearLayer::new(dim, dim + 2 * n_kv_heads * head_dim, bias)?,
            c_proj: LinearLayer::new(dim, dim, bias)?,
            n_heads,
            n_kv_heads,
            head_dim,
            scale: (head_dim as f64).powf(-0.5),
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let qkv = self.c_attn.forward(x)?;
        let dim = self.n_heads * self.head_dim;
        let kv = self.n_kv_heads * self.head_dim;
        let queries = split_heads(&qkv.slice_axis(-1, 0, dim)?, b, l, self.n_heads)?;
        let keys = split_heads(&qkv.slice_axis(-1, dim, dim + kv)?, b, l, self.n_kv_heads)?;
        let values = split_heads(
            &qkv.slice_axis(-1, dim + kv, dim + 2 * kv)?,
            b,
            l,
            self.n_kv_heads,
        )?;
        let fetch = match cache {
            Some(c) => mlx_nn::pipeline::update_and_fetch(c, &keys, &values)?,
            None => KvFetch::Plain { keys, values },
        };
        let out = scaled_dot_product_attention(&queries, &fetch, self.scale, mask, None)?;
        self.c_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// `c_proj(act(c_fc(x)))`: GELU, tanh-approximated (GPT-2) or exact (GPT-BigCode).
#[derive(Debug)]
pub struct Mlp {
    c_fc: LinearLayer,
    c_proj: LinearLayer,
    exact_gelu: bool,
}
impl_module!(Mlp { c_fc, c_proj });

impl Mlp {
    /// Zero placeholders: `dim -> hidden -> dim`.
    pub(crate) fn new(dim: i32, hidden: i32, bias: bool, exact_gelu: bool) -> crate::Result<Mlp> {
        Ok(Mlp {
            c_fc: LinearLayer::new(dim, hidden, bias)?,
            c_proj: LinearLayer::new(hidden, dim, bias)?,
            exact_gelu,
        })
    }
}

/// One pre-norm layer.
#[derive(Debug)]
pub struct TransformerBlock {
    attn: Attention,
    mlp: Mlp,
    ln_1: LayerNorm,
    ln_2: LayerNorm,
}
impl_module!(TransformerBlock {
    attn,
    mlp,
    ln_1,
    ln_2
});

impl TransformerBlock {
    /// A layer of `attn` and `mlp` with layer norms of `dim`.
    pub(crate) fn new(attn: Attention, mlp: Mlp, dim: i32, eps: f64) -> crate::Result<Self> {
        Ok(TransformerBlock {
            attn,
            mlp,
            ln_1: LayerNorm::new(dim, eps, true, true)?,
            ln_2: LayerNorm::new(dim, eps, true, true)?,
        })
    }

    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = x.add(&self.attn.forward(&self.ln_1.forward(x)?, mask, cache)?)?;
        let up = self.mlp.c_fc.forward(&self.ln_2.forward(&h)?)?;
        let act = if self.mlp.exact_gelu {
            activations::gelu(&up)?
        } else {
            activations::gelu_approx(&up)?
        };
        h.add(&self.mlp.c_proj.forward(&act)?)
    }
}

/// Token and position embeddings, the layers and the final norm.
#[derive(Debug)]
pub struct Gpt2Model {
    pub(crate) wte: EmbeddingLayer,
    wpe: EmbeddingLayer,
    pub(crate) h: Vec<TransformerBlock>,
    ln_f: LayerNorm,
}
impl_module!(Gpt2Model { wte, wpe, h, ln_f });

impl Gpt2Model {
    /// The stack over `h`, with `vocab` tokens and `n_positions` positions.
    pub(crate) fn new(
        vocab: i32,
        n_positions: i32,
        dim: i32,
        eps: f64,
        h: Vec<TransformerBlock>,
    ) -> crate::Result<Gpt2Model> {
        Ok(Gpt2Model {
            wte: EmbeddingLayer::new(vocab, dim)?,
            wpe: EmbeddingLayer::new(n_positions, dim)?,
            h,
            ln_f: LayerNorm::new(dim, eps, true, true)?,
        })
    }

    /// The normed hidden states of `inputs` (token plus position embeddings first).
    pub(crate) fn forward(&self, inputs: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let l = inputs.dim(1)?;
        let pos = positions(l, cache_at(caches, 0))?;
        let mut h = self.wte.forward(inputs)?.add(&self.wpe.forward(&pos)?)?;
        let mask = create_attention_mask(l, cache_at(caches, 0), None, false)?;
        for (layer, cache) in self.h.iter().zip(layer_caches(caches, self.h.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        self.ln_f.forward(&h)
    }
}

/// GPT-2 (the head is always the tied embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Gpt2Model,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads, eps) = (args.n_embd, args.n_head, args.layer_norm_epsilon);
        if n_heads < 1 || dim % n_heads != 0 {
            return Err(crate::Error::Config {
                path: "config.json (gpt2)".into(),
                message: "n_embd must be divisible by n_head".into(),
            });
        }
        if args.vocab_size <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (gpt2)".into(),
                message: "vocab_size must be positive".into(),
            });
        }
        let h = (0..args.n_layer)
            .map(|_| {
                let attn = Attention::new(dim, n_heads, n_heads, true)?;
                TransformerBlock::new(attn, Mlp::new(dim, 4 * dim, true, false)?, dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Gpt2Model::new(args.vocab_size, args.n_positions, dim, eps, h)?;
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gpt2")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches)?;
        self.model.wte.as_linear(&out)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.h.len()]
    }
    decoder_accessors!(model.h);
}

impl Architecture for Model {
    /// HF's GPT-2 files (unprefixed `h.{i}.*`, `Conv1D` weights stored `[in, out]`):
    /// drops each layer's `attn.bias` buffer, transposes the four projection weights,
    /// and moves every name under `model.`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        for i in 0..self.args.n_layer {
            weights.remove(&format!("h.{i}.attn.bias"));
            for name in ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"] {
                let key = format!("h.{i}.{name}.weight");
                if let Some(w) = weights.remove(&key) {
                    weights.insert(key, w.transpose(Some(&[1, 0]))?);
                }
            }
        }
        Ok(weights
            .into_iter()
            .map(|(k, v)| {
                if k.starts_with("model.") {
                    (k, v)
                } else {
                    (format!("model.{k}"), v)
                }
            })
            .collect())
    }
}

//! Llama 4 text-only checkpoints (`llama4_text`), following `mlx_lm/models/llama4_text.py`:
//! dense SwiGLU layers (`intermediate_size_mlp`), RoPE only on the layers flagged in
//! `no_rope_layers`, optional weightless q/k rms norms before the rotation, and the head
//! `output` (or the tied embedding).
use super::{batch_len, cache_at, layer_caches, merge_heads, project, split_heads};
use super::{mlp::Mlp, rope_attend, Architecture};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by `llama4_text` (all required, as in mlx-lm's `ModelArgs`).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub vocab_size: i32,
    pub intermediate_size: i32,
    pub intermediate_size_mlp: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    /// One flag per layer: non-zero keeps the rotary embedding.
    pub no_rope_layers: Vec<i64>,
    pub use_qk_norm: bool,
}

/// Self-attention of one layer.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    /// [`Rope::Identity`] on the layers without RoPE.
    rope: Rope,
    use_qk_norm: bool,
    eps: f32,
    n_heads: i32,
    n_kv_heads: i32,
    scale: f64,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj
});

impl Attention {
    fn new(a: &ModelArgs, use_rope: bool) -> crate::Result<Attention> {
        let (dim, n, nkv, hd) = (
            a.hidden_size,
            a.num_attention_heads,
            a.num_key_value_heads,
            a.head_dim,
        );
        Ok(Attention {
            q_proj: LinearLayer::new(dim, n * hd, false)?,
            k_proj: LinearLayer::new(dim, nkv * hd, false)?,
            v_proj: LinearLayer::new(dim, nkv * hd, false)?,
            o_proj: LinearLayer::new(n * hd, dim, false)?,
            rope: if use_rope {
                Rope::new(hd, true, a.rope_theta, 1.0)
            } else {
                Rope::Identity
            },
            use_qk_norm: a.use_qk_norm,
            eps: a.rms_norm_eps as f32,
            n_heads: n,
            n_kv_heads: nkv,
            scale: (hd as f64).powf(-0.5),
        })
    }

    /// `[B, n, L, head_dim]` heads, rms-normalized per head first where asked.
    fn heads(&self, a: &Array, b: i32, l: i32, n: i32) -> Result<Array> {
        if !self.use_qk_norm {
            return split_heads(a, b, l, n);
        }
        fast::rms_norm(&a.reshape(&[b, l, n, -1])?, None, self.eps)?
            .transpose(Some(&[0, 2, 1, 3]))
    }

    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let (b, l) = batch_len(x)?;
        let [q, k, v] = project(None, [&self.q_proj, &self.k_proj, &self.v_proj], x)?;
        let queries = self.heads(&q, b, l, self.n_heads)?;
        let keys = self.heads(&k, b, l, self.n_kv_heads)?;
        let values = split_heads(&v, b, l, self.n_kv_heads)?;
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    feed_forward: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
    feed_forward,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = x.add(&r)?;
        let r = self
            .feed_forward
            .forward(&self.post_attention_layernorm.forward(&h)?, None)?;
        h.add(&r)
    }
}

/// The decoder stack (`model`).
#[derive(Debug)]
pub struct TextModel {
    embed_tokens: EmbeddingLayer,
    layers: Vec<TransformerBlock>,
    norm: RmsNorm,
}
impl_module!(TextModel {
    embed_tokens,
    layers,
    norm
});

/// The model with its head `output` (absent when tied).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: TextModel,
    output: Option<LinearLayer>,
}
impl_module!(Model { model, output });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let n = args.num_hidden_layers.max(0) as usize;
        if args.no_rope_layers.len() < n {
            return Err(crate::Error::Config {
                path: "config.json (llama4_text)".into(),
                message: format!(
                    "key `no_rope_layers` has {} entries for {n} layers",
                    args.no_rope_layers.len()
                ),
            });
        }
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..n)
            .map(|i| {
                Ok(TransformerBlock {
                    self_attn: Attention::new(&args, args.no_rope_layers[i] != 0)?,
                    feed_forward: Mlp::new(dim, args.intermediate_size_mlp, false)?.up_before_down(),
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = TextModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        let output = super::head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            model,
            output,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "llama4_text")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_tokens.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in m.layers.iter().zip(layer_caches(caches, m.layers.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        let out = m.norm.forward(&h)?;
        // mlx-lm: `h @ embed_tokens.weight.T` when tied, else `output(h)`.
        super::head::logits(
            &m.embed_tokens,
            self.output.as_ref(),
            &out,
            super::head::LogitScale::None,
        )
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {}

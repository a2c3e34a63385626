//! GPT-NeoX (Pythia, StableLM-alpha, ...), following `mlx_lm/models/gpt_neox.py`: one
//! `query_key_value` projection split per head into q, k and v, a partial RoPE, layer
//! norms, a GELU feed-forward of four times the width, attention and feed-forward in
//! parallel (or in sequence), and the untied `embed_out` head inside `model`.
use super::{cache_at, layer_caches, merge_heads, rope_attend, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{
    activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GPT-NeoX.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub max_position_embeddings: i32,
    pub hidden_size: i32,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub layer_norm_eps: f64,
    pub vocab_size: i32,
    pub rotary_emb_base: f64,
    pub rotary_pct: f64,
    #[serde(default = "crate::config::default_true")]
    pub use_parallel_residual: bool,
}

/// Attention over the fused, per-head interleaved `query_key_value` projection.
#[derive(Debug)]
pub struct Attention {
    query_key_value: LinearLayer,
    dense: LinearLayer,
    rope: Rope,
    n_heads: i32,
    scale: f64,
}
impl_module!(Attention {
    query_key_value,
    dense
});

impl Attention {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let qkv = self
            .query_key_value
            .forward(x)?
            .reshape(&[b, l, self.n_heads, -1])?;
        let parts = qkv.split_sections(3, -1)?;
        let [q, k, v] = <[Array; 3]>::try_from(parts).map_err(|_| {
            mlx_array::Error::InvalidArgument("query_key_value does not split in three".into())
        })?;
        let t = |a: &Array| a.transpose(Some(&[0, 2, 1, 3]));
        let out = rope_attend(
            &t(&q)?,
            &t(&k)?,
            t(&v)?,
            &self.rope,
            cache,
            self.scale,
            mask,
        )?;
        self.dense.forward(&merge_heads(&out, b, l)?)
    }
}

/// `dense_4h_to_h(gelu_approx(dense_h_to_4h(x)))`.
#[derive(Debug)]
pub struct Mlp {
    dense_h_to_4h: LinearLayer,
    dense_4h_to_h: LinearLayer,
}
impl_module!(Mlp {
    dense_h_to_4h,
    dense_4h_to_h
});

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = activations::gelu_approx(&self.dense_h_to_4h.forward(x)?)?;
        self.dense_4h_to_h.forward(&h)
    }
}

/// One layer (parallel or sequential residual).
#[derive(Debug)]
pub struct TransformerBlock {
    attention: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm,
    post_attention_layernorm: LayerNorm,
    parallel: bool,
}
impl_module!(TransformerBlock {
    attention,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl TransformerBlock {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let attn = self
            .attention
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        if self.parallel {
            let ffn = self
                .mlp
                .forward(&self.post_attention_layernorm.forward(x)?)?;
            attn.add(&ffn)?.add(x)
        } else {
            let h = x.add(&attn)?;
            let ffn = self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&h)?)?;
            h.add(&ffn)
        }
    }
}

/// The decoder stack and its head.
#[derive(Debug)]
pub struct GptNeoXModel {
    embed_in: EmbeddingLayer,
    embed_out: LinearLayer,
    h: Vec<TransformerBlock>,
    final_layer_norm: LayerNorm,
}
impl_module!(GptNeoXModel {
    embed_in,
    embed_out,
    h,
    final_layer_norm
});

/// GPT-NeoX.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GptNeoXModel,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads, eps) = (
            args.hidden_size,
            args.num_attention_heads,
            args.layer_norm_eps,
        );
        if n_heads < 1 || dim % n_heads != 0 {
            return Err(crate::Error::Config {
                path: "config.json (gpt_neox)".into(),
                message: "hidden_size must be divisible by num_attention_heads".into(),
            });
        }
        if args.vocab_size <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (gpt_neox)".into(),
                message: "vocab_size must be positive".into(),
            });
        }
        let head_dim = dim / n_heads;
        let rotary = (head_dim as f64 * args.rotary_pct) as i32;
        let h = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    attention: Attention {
                        query_key_value: LinearLayer::new(dim, 3 * dim, true)?,
                        dense: LinearLayer::new(dim, dim, true)?,
                        rope: Rope::new(rotary, false, args.rotary_emb_base, 1.0),
                        n_heads,
                        scale: (head_dim as f64).powf(-0.5),
                    },
                    mlp: Mlp {
                        dense_h_to_4h: LinearLayer::new(dim, 4 * dim, true)?,
                        dense_4h_to_h: LinearLayer::new(4 * dim, dim, true)?,
                    },
                    input_layernorm: LayerNorm::new(dim, eps, true, true)?,
                    post_attention_layernorm: LayerNorm::new(dim, eps, true, true)?,
                    parallel: args.use_parallel_residual,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GptNeoXModel {
            embed_in: EmbeddingLayer::new(args.vocab_size, dim)?,
            embed_out: LinearLayer::new(dim, args.vocab_size, false)?,
            h,
            final_layer_norm: LayerNorm::new(dim, eps, true, true)?,
        };
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gpt_neox")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let mut h = m.embed_in.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in m.h.iter().zip(layer_caches(caches, m.h.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |l, x, m, c| l.forward(x, m, c))?;
        }
        m.embed_out.forward(&m.final_layer_norm.forward(&h)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.h.len()]
    }
    decoder_accessors!(model.h);
}

impl Architecture for Model {
    /// Drops HF's attention buffers (`attention.bias`, `attention.masked_bias`,
    /// `attention.rotary_emb.inv_freq`) and moves HF names under `model.`
    /// (`gpt_neox.layers.` -> `model.h.`, `gpt_neox.` -> `model.`).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        const IGNORED: [&str; 3] = [
            ".attention.bias",
            ".attention.masked_bias",
            ".attention.rotary_emb.inv_freq",
        ];
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !IGNORED.iter().any(|s| k.ends_with(s)))
            .map(|(k, v)| {
                let k = if k.starts_with("model.") {
                    k
                } else {
                    format!("model.{k}")
                };
                let k = k
                    .replace(".gpt_neox.layers.", ".h.")
                    .replace(".gpt_neox.", ".");
                (k, v)
            })
            .collect())
    }
}

//! StableLM (StableLM 2, StableLM-3B-4E1T, StableCode), following
//! `mlx_lm/models/stablelm.py`: a partial RoPE, optional q/k layer norms with one norm
//! per head, attention over float32 queries and keys, layer norms, a SwiGLU
//! feed-forward, and an optionally parallel residual.
use super::lm::{causal_layers, even_head_dim};
use super::mlp::Mlp;
use super::{merge_heads, rope_cache, Architecture};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{
    impl_module, scaled_dot_product_attention, AttnMask, EmbeddingLayer, KvCache, KvFetch,
    LayerNorm, LinearLayer, Module, Param, Rope,
};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by StableLM.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub intermediate_size: i32,
    pub rope_theta: f64,
    pub use_qkv_bias: bool,
    pub partial_rotary_factor: f64,
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub use_parallel_residual: bool,
    #[serde(default)]
    pub qk_layernorm: bool,
}

/// mlx-lm's `LayerNormPerHead`: one bias-free layer norm per head (`norms.{i}`),
/// applied as `stack(weights) * layer_norm(x)`.
#[derive(Debug)]
pub struct LayerNormPerHead {
    weights: Vec<Param>,
    eps: f32,
}

impl Module for LayerNormPerHead {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        for (i, w) in self.weights.iter().enumerate() {
            f(
                &join(&join(&join(prefix, "norms"), &i.to_string()), "weight"),
                w,
            );
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        for (i, w) in self.weights.iter_mut().enumerate() {
            f(
                &join(&join(&join(prefix, "norms"), &i.to_string()), "weight"),
                w,
            );
        }
    }
    fn visit_quantizable_mut(&mut self, _: &str, _: &mut QuantVisitor<'_>) -> mlx_nn::Result<()> {
        Ok(())
    }
}

impl LayerNormPerHead {
    fn new(head_dim: i32, heads: i32, eps: f64) -> crate::Result<LayerNormPerHead> {
        let weights = (0..heads)
            .map(|_| Ok(Param::new(ops::ones(&[head_dim], Dtype::Float32)?)))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(LayerNormPerHead {
            weights,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let w: Vec<&Array> = self.weights.iter().map(|p| &**p).collect();
        ops::stack(&w, 0)?.multiply(&fast::layer_norm(x, None, None, self.eps)?)
    }
}

/// Self-attention on float32 queries and keys.
#[derive(Debug)]
pub struct Attention {
    q_proj: LinearLayer,
    k_proj: LinearLayer,
    v_proj: LinearLayer,
    o_proj: LinearLayer,
    q_layernorm: Option<LayerNormPerHead>,
    k_layernorm: Option<LayerNormPerHead>,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
}
impl_module!(Attention {
    q_proj,
    k_proj,
    v_proj,
    o_proj,
    q_layernorm,
    k_layernorm
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
        let heads =
            |proj: &LinearLayer, n: i32, norm: Option<&LayerNormPerHead>| -> Result<Array> {
                let mut a = proj.forward(x)?.reshape(&[b, l, n, -1])?;
                if let Some(norm) = norm {
                    a = norm.forward(&a)?;
                }
                a.transpose(Some(&[0, 2, 1, 3]))
            };
        let queries = heads(&self.q_proj, self.n_heads, self.q_layernorm.as_ref())?;
        let keys = heads(&self.k_proj, self.n_kv_heads, self.k_layernorm.as_ref())?;
        let values = heads(&self.v_proj, self.n_kv_heads, None)?;
        let (queries, fetch) = rope_cache(&queries, &keys, values, &self.rope, cache)?;
        let KvFetch::Plain { keys, values } = fetch else {
            return Err(mlx_array::Error::InvalidArgument(
                "stablelm casts the cached keys to float32, which a quantized KV cache does \
                 not allow (mlx-lm fails the same way)"
                    .into(),
            ));
        };
        let queries = queries.astype(Dtype::Float32)?;
        let keys = keys.astype(Dtype::Float32)?;
        let dtype = values.dtype();
        let scale = (1.0 / queries.dim(-1)? as f64).sqrt();
        let fetch = KvFetch::Plain { keys, values };
        let out =
            scaled_dot_product_attention(&queries, &fetch, scale, mask, None)?.astype(dtype)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// One layer; without a parallel residual it has a second norm.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: LayerNorm,
    post_attention_layernorm: Option<LayerNorm>,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    input_layernorm,
    post_attention_layernorm
});

impl DecoderLayer {
    fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = self.input_layernorm.forward(x)?;
        let r = self.self_attn.forward(&h, mask, cache)?;
        match &self.post_attention_layernorm {
            None => x.add(&r)?.add(&self.mlp.forward(&h, None)?),
            Some(norm) => {
                let h = x.add(&r)?;
                self.mlp.forward(&norm.forward(&h)?, Some(&h))
            }
        }
    }
}

/// The decoder stack.
#[derive(Debug)]
pub struct StableLm {
    embed_tokens: EmbeddingLayer,
    layers: Vec<DecoderLayer>,
    norm: LayerNorm,
}
impl_module!(StableLm {
    embed_tokens,
    layers,
    norm
});

/// StableLM with its (never tied) head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: StableLm,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads, n_kv) = (
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
        );
        let head_dim = even_head_dim(dim, n_heads, "stablelm")?;
        let eps = args.layer_norm_eps;
        let rotary = (args.partial_rotary_factor * head_dim as f64) as i32;
        let qkv_bias = args.use_qkv_bias;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let (q_layernorm, k_layernorm) = if args.qk_layernorm {
                    (
                        Some(LayerNormPerHead::new(head_dim, n_heads, eps)?),
                        Some(LayerNormPerHead::new(head_dim, n_kv, eps)?),
                    )
                } else {
                    (None, None)
                };
                Ok(DecoderLayer {
                    self_attn: Attention {
                        q_proj: LinearLayer::new(dim, n_heads * head_dim, qkv_bias)?,
                        k_proj: LinearLayer::new(dim, n_kv * head_dim, qkv_bias)?,
                        v_proj: LinearLayer::new(dim, n_kv * head_dim, qkv_bias)?,
                        o_proj: LinearLayer::new(n_heads * head_dim, dim, false)?,
                        q_layernorm,
                        k_layernorm,
                        rope: Rope::new(rotary, false, args.rope_theta, 1.0),
                        n_heads,
                        n_kv_heads: n_kv,
                    },
                    mlp: Mlp::new(dim, args.intermediate_size, false)?,
                    input_layernorm: LayerNorm::new(dim, eps, true, true)?,
                    post_attention_layernorm: if args.use_parallel_residual {
                        None
                    } else {
                        Some(LayerNorm::new(dim, eps, true, true)?)
                    },
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = StableLm {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: LayerNorm::new(dim, eps, true, true)?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "stablelm")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let h = causal_layers(&m.layers, h, caches, DecoderLayer::forward)?;
        self.lm_head.forward(&m.norm.forward(&h)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers {
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

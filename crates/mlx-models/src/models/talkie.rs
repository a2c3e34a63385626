//! Talkie (`talkie`), following `mlx_lm/models/talkie.py`: weightless RMS norms (eps
//! `rms_norm_eps`, float32's epsilon by default) after the embedding, before each
//! sub-block and at the end; attention without biases (`attn_query`, `attn_key`,
//! `attn_value`, `attn_resid`, as many key-value heads as query heads) rotated by RoPE
//! with negated frequencies `-(rope_theta ** (arange(0, head_dim, 2) / head_dim))`,
//! then the queries and keys RMS-normed and the queries scaled per head (`head_gain`);
//! a `mlp_resid(silu(mlp_gate(x)) * mlp_linear(x))` MLP; each sub-block's output
//! scaled by a learned gain before its residual, and every block adding the normed
//! embeddings times its `embed_skip` gain; logits `out @ lm_head.T` (a bare parameter,
//! never quantized) times `lm_head_gain`. `sanitize` drops rotary buffers.
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::mlp::Mlp;
use super::nanochat::freqs_rope;
use super::{layer_caches, Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::activations::silu;
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, EmbeddingLayer, KvCache, Param, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Talkie, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub intermediate_size: i32,
    pub vocab_size: i32,
    pub rope_theta: f64,
    pub max_position_embeddings: i32,
    pub rms_norm_eps: f64,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: "talkie".into(),
            hidden_size: 5120,
            num_hidden_layers: 40,
            num_attention_heads: 40,
            head_dim: 128,
            intermediate_size: 13696,
            vocab_size: 65540,
            rope_theta: 1_000_000.0,
            max_position_embeddings: 2048,
            rms_norm_eps: f64::from(f32::EPSILON),
        }
    }
}

/// `ActGain`: `x * a_g` (`a_g` of one element, cast to x's dtype).
#[derive(Debug)]
pub struct ActGain {
    a_g: Param,
}
impl_module!(ActGain { a_g });

impl ActGain {
    fn new() -> Result<ActGain> {
        Ok(ActGain {
            a_g: Param::new(ops::ones(&[1], Dtype::Float32)?),
        })
    }
    fn forward(&self, x: &Array) -> Result<Array> {
        x.multiply(&self.a_g.astype(x.dtype())?)
    }
}

/// `WeightGain`: `x * w_g`.
#[derive(Debug)]
pub struct WeightGain {
    w_g: Param,
}
impl_module!(WeightGain { w_g });

/// One block (see the module docs).
#[derive(Debug)]
pub struct TransformerBlock {
    attn: Attention,
    attn_gain: ActGain,
    mlp: Mlp,
    mlp_gain: ActGain,
    embed_skip: ActGain,
    eps: f32,
}
impl_module!(TransformerBlock {
    attn,
    attn_gain,
    mlp,
    mlp_gain,
    embed_skip
});

impl TransformerBlock {
    fn forward(
        &self,
        e_x: &Array,
        x: &Array,
        mask: &mlx_nn::AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let r = self.attn.forward(
            &fast::rms_norm(x, None, self.eps)?,
            mask,
            cache,
            None,
            Extras::default(),
        )?;
        let x = x.add(&self.attn_gain.forward(&r)?)?;
        let r = self.mlp.forward(&fast::rms_norm(&x, None, self.eps)?, None)?;
        let x = x.add(&self.mlp_gain.forward(&r)?)?;
        x.add(&self.embed_skip.forward(e_x)?)
    }
}

/// The embedding and the blocks.
#[derive(Debug)]
pub struct TalkieModel {
    embed: EmbeddingLayer,
    blocks: Vec<TransformerBlock>,
}
impl_module!(TalkieModel { embed, blocks });

/// Talkie with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: TalkieModel,
    lm_head: Param,
    lm_head_gain: WeightGain,
}
impl_module!(Model {
    model,
    lm_head,
    lm_head_gain
});

/// RoPE with Talkie's negated frequencies `-(theta ** (arange(0, d, 2) / d))` (float32).
fn negated_rope(head_dim: i32, theta: f64) -> crate::Result<Rope> {
    let exponents = ops::arange(0.0, f64::from(head_dim), 2.0, Dtype::Float32)?
        .divide(f64::from(head_dim))?;
    let freqs = Array::scalar_f64(theta, Dtype::Float32)?
        .power(&exponents)?
        .negative()?;
    freqs_rope(head_dim, freqs)
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads, head_dim) = (args.hidden_size, args.num_attention_heads, args.head_dim);
        if n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 {
            return Err(crate::Error::Config {
                path: "config.json (talkie)".into(),
                message: format!(
                    "keys `num_attention_heads` ({n_heads}) and `head_dim` ({head_dim}) must \
                     be positive, `head_dim` even"
                ),
            });
        }
        let eps = args.rms_norm_eps as f32;
        let blocks = (0..args.num_hidden_layers)
            .map(|_| {
                let d = AttentionDims {
                    dim,
                    n_heads,
                    n_kv_heads: n_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                let rope = negated_rope(head_dim, args.rope_theta)?;
                let gain = Param::new(ops::ones(&[n_heads], Dtype::Float32)?);
                let attn = Attention::new(d, rope, f64::from(head_dim).powf(-0.5))?
                    .with_qk_norm_pair(
                        NormAt::AfterRope,
                        HeadNorm::WeightlessGain(eps, gain),
                        HeadNorm::Weightless(eps),
                    )
                    .with_norm_names("head_gain", "k_norm")
                    .with_qkv_names("attn_query", "attn_key", "attn_value")
                    .with_out_name("attn_resid");
                let mlp = Mlp::new(dim, args.intermediate_size, false)?
                    .with_names("mlp_gate", "mlp_linear", "mlp_resid")
                    .up_before_down()
                    .with_activation(silu);
                Ok(TransformerBlock {
                    attn,
                    attn_gain: ActGain::new()?,
                    mlp,
                    mlp_gain: ActGain::new()?,
                    embed_skip: ActGain::new()?,
                    eps,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(Model {
            model: TalkieModel {
                embed: EmbeddingLayer::new(args.vocab_size, dim)?,
                blocks,
            },
            lm_head: Param::new(ops::zeros(&[args.vocab_size, dim], Dtype::Float32)?),
            lm_head_gain: WeightGain {
                w_g: Param::new(ops::ones(&[1], Dtype::Float32)?),
            },
            args,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "talkie")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let eps = self.args.rms_norm_eps as f32;
        let m = &self.model;
        let e_x = fast::rms_norm(&m.embed.forward(tokens)?, None, eps)?;
        let mask = create_attention_mask(e_x.dim(1)?, super::cache_at(caches, 0), None, false)?;
        let mut h = e_x.clone();
        for (block, cache) in m.blocks.iter().zip(layer_caches(caches, m.blocks.len())?) {
            let mask = mask.clone();
            let out = mlx_nn::checkpoint::call(block, &[&e_x, &h], cache, move |b, a, c| {
                Ok(vec![b.forward(&a[0], &a[1], &mask, c)?])
            })?;
            h = mlx_nn::checkpoint::first(out)?;
        }
        let out = fast::rms_norm(&h, None, eps)?;
        let logits = out.matmul(&self.lm_head.transpose(None)?)?;
        logits.multiply(&self.lm_head_gain.w_g.astype(logits.dtype())?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.blocks.len()]
    }
    decoder_accessors!(model.blocks);
}

impl Architecture for Model {
    /// Drops rotary buffers (`rotary` in the name, or a name ending in `cos` / `sin`).
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights
            .into_iter()
            .filter(|(k, _)| !k.contains("rotary") && !k.ends_with("cos") && !k.ends_with("sin"))
            .collect())
    }
}

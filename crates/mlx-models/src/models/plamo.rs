//! PLaMo (`plamo`), following `mlx_lm/models/plamo.py`: parallel layers (`h + attn(n) +
//! mlp(n)` over one RMS pre-norm `norm`) under `model.layers.layers`, attention without
//! biases whose `ceil(num_attention_heads / n_shared_head)` key-value heads are tiled
//! `n_shared_head` times after the cache (query head `i` reads key head `i % k_heads`),
//! `nn.RoPE` at `rope_theta` (traditional by `rope_traditional`), a SwiGLU MLP, an
//! untied `lm_head`. No `sanitize`, as in mlx-lm.
use super::config_error;
use super::attention::{Attention, AttentionDims, Extras};
use super::lm::causal_layers;
use super::mlp::Mlp;
use super::Architecture;
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by PLaMo.
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
    #[serde(default = "default_n_shared_head")]
    pub n_shared_head: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
}

fn default_n_shared_head() -> i32 {
    8
}
fn default_rope_theta() -> f64 {
    10000.0
}

/// `PlamoDecoderLayer`.
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    norm: RmsNorm,
}
impl_module!(DecoderLayer {
    self_attn,
    mlp,
    norm
});

impl DecoderLayer {
    /// `residual + self_attn(norm(x)) + mlp(norm(x))`.
    fn forward(
        layer: &Self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut dyn KvCache>,
    ) -> Result<Array> {
        let h = layer.norm.forward(x)?;
        let with_attn = layer
            .self_attn
            .forward(&h, mask, cache, Some(x), Extras::default())?;
        layer.mlp.forward(&h, Some(&with_attn))
    }
}

/// `PlamoDecoder`: the list of layers (`model.layers.layers`).
#[derive(Debug)]
pub struct Decoder {
    layers: Vec<DecoderLayer>,
}
impl_module!(Decoder { layers });

/// `PlamoModel`.
#[derive(Debug)]
pub struct PlamoModel {
    embed_tokens: EmbeddingLayer,
    layers: Decoder,
    norm: RmsNorm,
}
impl_module!(PlamoModel {
    embed_tokens,
    layers,
    norm
});

/// PLaMo with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: PlamoModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, q_heads, shared) = (args.hidden_size, args.num_attention_heads, args.n_shared_head);
        if q_heads <= 0 || shared <= 0 || dim % q_heads != 0 {
            return Err(config_error("plamo", format!(
                "`num_attention_heads` ({q_heads}) and `n_shared_head` ({shared}) must be \
                 positive, the heads dividing `hidden_size` ({dim})"
            )));
        }
        // The tiled key heads must match the query heads for the attention to run.
        if q_heads % shared != 0 {
            return Err(config_error("plamo", format!(
                "`num_attention_heads` ({q_heads}) must be a multiple of `n_shared_head` \
                 ({shared}): mlx-lm's attention of the tiled heads fails otherwise"
            )));
        }
        let head_dim = dim / q_heads;
        let kv_heads = q_heads / shared;
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                let d = AttentionDims {
                    dim,
                    n_heads: q_heads,
                    n_kv_heads: kv_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                let rope = Rope::new(head_dim, args.rope_traditional, args.rope_theta, 1.0);
                let scale = f64::from(head_dim).powf(-0.5);
                Ok(DecoderLayer {
                    self_attn: Attention::new(d, rope, scale)?.with_tiled_kv(shared),
                    mlp: Mlp::new(dim, args.intermediate_size, false)?.up_before_down(),
                    norm: RmsNorm::new(dim, args.rms_norm_eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = PlamoModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers: Decoder { layers },
            norm: RmsNorm::new(dim, args.rms_norm_eps)?,
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
    Ok(Box::new(Model::new(parse_args(config, "plamo")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let h = causal_layers(&m.layers.layers, h, caches, DecoderLayer::forward)?;
        self.lm_head.forward(&m.norm.forward(&h)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.layers.len()]
    }
    decoder_accessors!(model.layers.layers);
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.layers.layers {
            layer.self_attn.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

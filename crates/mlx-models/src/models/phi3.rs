//! Phi-3, following `mlx_lm/models/phi3.py` (fused qkv and gate/up projections).
use super::lm::Stack;
use super::{batch_len, merge_heads, rope_attend, split_heads};
use super::{Architecture, Weights};
use crate::config::{parse_args, rope_scaling};
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::activations::swiglu;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, RmsNorm, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Phi-3.
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
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "one")]
    pub partial_rotary_factor: f64,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: i32,
    #[serde(default = "default_original_max_position_embeddings")]
    pub original_max_position_embeddings: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn one() -> f64 {
    1.0
}
fn default_max_position_embeddings() -> i32 {
    131072
}
fn default_original_max_position_embeddings() -> i32 {
    4096
}

/// `__post_init__`'s rope choice: su/longrope, linear, or plain.
fn make_rope(args: &ModelArgs, rope_dim: i32) -> crate::Result<Rope> {
    let cfg_err = |m: &str| crate::Error::Config {
        path: "config.json (phi3)".into(),
        message: m.into(),
    };
    let scaling = match rope_scaling(args.rope_scaling.as_ref())? {
        Some(s) => {
            let typed = args
                .rope_scaling
                .as_ref()
                .and_then(|v| v.get("type"))
                .is_some();
            if s.long_factor.is_none() || !typed {
                return Err(cfg_err(
                    "key `rope_scaling` must contain `long_factor` and `type`",
                ));
            }
            // Other types are dropped with a warning in mlx-lm.
            Some(s).filter(|s| matches!(s.rope_type.as_str(), "longrope" | "su" | "linear"))
        }
        None => None,
    };
    match scaling {
        Some(s) if s.rope_type != "linear" => Ok(Rope::su_scaled(
            rope_dim,
            args.rope_theta,
            args.max_position_embeddings as f64,
            args.original_max_position_embeddings as f64,
            s.long_factor.as_deref().unwrap_or(&[1.0]),
        )?),
        Some(s) => {
            let factor = s
                .factor
                .ok_or_else(|| cfg_err("key `rope_scaling.factor` is missing"))?;
            Ok(Rope::new(
                rope_dim,
                args.rope_traditional,
                args.rope_theta,
                1.0 / factor,
            ))
        }
        None => Ok(Rope::new(
            rope_dim,
            args.rope_traditional,
            args.rope_theta,
            1.0,
        )),
    }
}

/// Self-attention with one fused qkv projection.
#[derive(Debug)]
pub struct Attention {
    qkv_proj: LinearLayer,
    o_proj: LinearLayer,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f64,
}
impl_module!(Attention { qkv_proj, o_proj });

impl Attention {
    fn new(args: &ModelArgs) -> crate::Result<Attention> {
        let dim = args.hidden_size;
        let n_heads = args.num_attention_heads;
        let n_kv_heads = args.num_key_value_heads.unwrap_or(n_heads);
        let head_dim = dim / n_heads;
        let op_size = n_heads * head_dim + 2 * (n_kv_heads * head_dim);
        let rope_dim = (head_dim as f64 * args.partial_rotary_factor) as i32;
        Ok(Attention {
            qkv_proj: LinearLayer::new(dim, op_size, false)?,
            o_proj: LinearLayer::new(n_heads * head_dim, dim, false)?,
            rope: make_rope(args, rope_dim)?,
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
        let (b, l) = batch_len(x)?;
        let qkv = self.qkv_proj.forward(x)?;
        let query_pos = self.n_heads * self.head_dim;
        let parts = qkv.split_at(
            &[query_pos, query_pos + self.n_kv_heads * self.head_dim],
            -1,
        )?;
        let queries = split_heads(&parts[0], b, l, self.n_heads)?;
        let keys = split_heads(&parts[1], b, l, self.n_kv_heads)?;
        let values = split_heads(&parts[2], b, l, self.n_kv_heads)?;
        let out = rope_attend(&queries, &keys, values, &self.rope, cache, self.scale, mask)?;
        self.o_proj.forward(&merge_heads(&out, b, l)?)
    }
}

/// The SwiGLU block with a fused gate/up projection.
#[derive(Debug)]
pub struct Mlp {
    gate_up_proj: LinearLayer,
    down_proj: LinearLayer,
}
impl_module!(Mlp {
    gate_up_proj,
    down_proj
});

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let x = self.gate_up_proj.forward(x)?;
        let parts = x.split_sections(2, -1)?;
        self.down_proj.forward(&swiglu(&parts[0], &parts[1])?)
    }
}

/// One decoder layer.
#[derive(Debug)]
pub struct TransformerBlock {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}
impl_module!(TransformerBlock {
    self_attn,
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
        let r = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, mask, cache)?;
        let h = x.add(&r)?;
        let r = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        h.add(&r)
    }
}

/// The decoder stack.
pub type Phi3Model = Stack<TransformerBlock, RmsNorm>;

/// Phi-3 with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: Phi3Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: Attention::new(&args)?,
                    mlp: Mlp {
                        gate_up_proj: LinearLayer::new(dim, 2 * args.intermediate_size, false)?,
                        down_proj: LinearLayer::new(args.intermediate_size, dim, false)?,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = Phi3Model {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
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
    Ok(Box::new(Model::new(parse_args(config, "phi3")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.model.forward(tokens, caches, TransformerBlock::forward, RmsNorm::forward)?;
        head::logits(&self.model.embed_tokens, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.layers.len()]
    }
    decoder_accessors!();
}

impl Architecture for Model {
    fn sanitize(&mut self, weights: Weights) -> crate::Result<Weights> {
        Ok(weights)
    }
}

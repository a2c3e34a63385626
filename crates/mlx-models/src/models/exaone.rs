//! EXAONE 3 / 3.5, following `mlx_lm/models/exaone.py`: Llama-shaped layers under GPT-2
//! style names (`transformer.wte`, `h.{i}.ln_1`, `attn.attention.out_proj`,
//! `mlp.c_fc_0` / `c_fc_1` / `c_proj`, `ln_f`).
use super::attention::{Attention, AttentionDims, Extras};
use super::head::{self, LogitScale};
use super::mlp::Mlp;
use super::{cache_at, layer_caches, Architecture};
use crate::config::{default_true, parse_args, rope_scaling};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::cache::create_attention_mask;
use mlx_nn::{impl_module, initialize_rope, EmbeddingLayer, KvCache, LinearLayer, RmsNorm};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by EXAONE.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub vocab_size: i32,
    pub rope_theta: f64,
    pub layer_norm_epsilon: f64,
    pub num_key_value_heads: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

/// `attn.attention`: the attention module one level down.
#[derive(Debug)]
pub struct AttnWrapper {
    attention: Attention,
}
impl_module!(AttnWrapper { attention });

/// One pre-norm layer.
#[derive(Debug)]
pub struct TransformerBlock {
    ln_1: RmsNorm,
    attn: AttnWrapper,
    ln_2: RmsNorm,
    mlp: Mlp,
}
impl_module!(TransformerBlock {
    ln_1,
    attn,
    ln_2,
    mlp
});

/// The decoder stack.
#[derive(Debug)]
pub struct ExaoneModel {
    wte: EmbeddingLayer,
    h: Vec<TransformerBlock>,
    ln_f: RmsNorm,
}
impl_module!(ExaoneModel { wte, h, ln_f });

/// EXAONE with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    transformer: ExaoneModel,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model {
    transformer,
    lm_head
});

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.layer_norm_epsilon);
        let n_heads = args.num_attention_heads;
        let head_dim = args
            .head_dim
            .filter(|&d| d != 0)
            .unwrap_or(dim / n_heads.max(1));
        let d = AttentionDims {
            dim,
            n_heads,
            n_kv_heads: args.num_key_value_heads,
            head_dim,
            qkv_bias: args.attention_bias,
            o_bias: args.attention_bias,
        };
        let h = (0..args.num_layers)
            .map(|_| {
                let rope = initialize_rope(
                    head_dim,
                    args.rope_theta,
                    args.rope_traditional,
                    rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
                    args.max_position_embeddings,
                )?;
                let attention = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?
                    .with_out_name("out_proj");
                Ok(TransformerBlock {
                    ln_1: RmsNorm::new(dim, eps)?,
                    attn: AttnWrapper { attention },
                    ln_2: RmsNorm::new(dim, eps)?,
                    mlp: Mlp::new(dim, args.intermediate_size, args.mlp_bias)?
                        .with_names("c_fc_0", "c_fc_1", "c_proj")
                        .up_before_down(),
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let transformer = ExaoneModel {
            wte: EmbeddingLayer::new(args.vocab_size, dim)?,
            h,
            ln_f: RmsNorm::new(dim, eps)?,
        };
        let lm_head = head::untied(args.tie_word_embeddings, dim, args.vocab_size)?;
        Ok(Model {
            args,
            transformer,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "exaone")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let t = &self.transformer;
        let mut h = t.wte.forward(tokens)?;
        let mask = create_attention_mask(h.dim(1)?, cache_at(caches, 0), None, false)?;
        for (layer, cache) in t.h.iter().zip(layer_caches(caches, t.h.len())?) {
            h = mlx_nn::checkpoint::layer(layer, &h, &mask, cache, |layer, h, mask, cache| {
                let x = layer.ln_1.forward(h)?;
                let hh = layer
                    .attn
                    .attention
                    .forward(&x, mask, cache, Some(h), Extras::default())?;
                layer.mlp.forward(&layer.ln_2.forward(&hh)?, Some(&hh))
            })?;
        }
        let out = t.ln_f.forward(&h)?;
        head::logits(&t.wte, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.transformer.h.len()]
    }
    decoder_accessors!(transformer.h);
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.transformer.h {
            layer.attn.attention.fuse()?;
            layer.mlp.fuse()?;
        }
        Ok(())
    }
}

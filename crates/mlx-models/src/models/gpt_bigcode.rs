//! GPT-BigCode (StarCoder 1, SantaCoder), following `mlx_lm/models/gpt_bigcode.py`:
//! GPT-2's layers (gpt2.rs) under `transformer.`, with multi-query attention (one key
//! and value head unless `multi_query` is false), an exact-GELU feed-forward of
//! `n_inner`, optional biases and an optionally untied head.
use super::gpt2::{Attention, Gpt2Model, Mlp, TransformerBlock};
use super::head::{self, LogitScale};
use super::Architecture;
use crate::config::{default_true, parse_args};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, KvCache, LinearLayer};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GPT-BigCode.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub n_embd: i32,
    pub n_layer: i32,
    pub n_inner: i32,
    pub n_head: i32,
    pub n_positions: i32,
    pub layer_norm_epsilon: f64,
    pub vocab_size: i32,
    #[serde(default = "default_true")]
    pub multi_query: bool,
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    #[serde(default = "default_true")]
    pub mlp_bias: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

/// GPT-BigCode with its output head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    transformer: Gpt2Model,
    lm_head: Option<LinearLayer>,
}
impl_module!(Model {
    transformer,
    lm_head
});

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads, eps) = (args.n_embd, args.n_head, args.layer_norm_epsilon);
        if n_heads < 1 || args.vocab_size <= 0 {
            return Err(crate::Error::Config {
                path: "config.json (gpt_bigcode)".into(),
                message: "n_head and vocab_size must be positive".into(),
            });
        }
        let n_kv = if args.multi_query { 1 } else { n_heads };
        let h = (0..args.n_layer)
            .map(|_| {
                let attn = Attention::new(dim, n_heads, n_kv, args.attention_bias)?;
                let mlp = Mlp::new(dim, args.n_inner, args.mlp_bias, true)?;
                TransformerBlock::new(attn, mlp, dim, eps)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let transformer = Gpt2Model::new(args.vocab_size, args.n_positions, dim, eps, h)?;
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
    Ok(Box::new(Model::new(parse_args(config, "gpt_bigcode")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let out = self.transformer.forward(tokens, caches)?;
        let t = &self.transformer;
        head::logits(&t.wte, self.lm_head.as_ref(), &out, LogitScale::None)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.transformer.h.len()]
    }
    decoder_accessors!(transformer.h);
}

/// mlx-lm's class has no `sanitize`: the checkpoint's tensors load as they are.
impl Architecture for Model {}

//! GPT-J (`gptj`), following `mlx_lm/models/gptj.py`: one layer norm per layer read by
//! attention and feed-forward in parallel (`x + attn(ln_1(x)) + mlp(ln_1(x))`), attention
//! without biases whose first `rotary_dim` dimensions of each head rotate traditionally
//! (interleaved pairs, base 10000), a biased GELU (tanh) feed-forward four times the
//! width, and a biased `lm_head`. `sanitize` drops HF's `attn.bias` / `attn.masked_bias`
//! buffers and moves `transformer.*` to `model.*`.
use super::attention::{Attention, AttentionDims, Extras};
use super::lm::{causal_layers, even_head_dim};
use super::{Architecture, Weights};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::{activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LayerNorm, LinearLayer, Rope};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by GPT-J (all defaulted, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default = "default_n_embd")]
    pub n_embd: i32,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
    #[serde(default = "default_layer_norm_epsilon")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_n_positions")]
    pub n_positions: i32,
    #[serde(default = "default_n_head")]
    pub n_head: i32,
    /// `null` or 0 rotates the whole head.
    #[serde(default = "default_rotary_dim")]
    pub rotary_dim: Option<i32>,
    #[serde(default = "default_n_layer")]
    pub n_layer: i32,
}

fn default_model_type() -> String {
    "gptj".into()
}
fn default_n_embd() -> i32 {
    4096
}
fn default_vocab_size() -> i32 {
    50400
}
fn default_layer_norm_epsilon() -> f64 {
    1e-5
}
fn default_n_positions() -> i32 {
    2048
}
fn default_n_head() -> i32 {
    16
}
fn default_rotary_dim() -> Option<i32> {
    Some(64)
}
fn default_n_layer() -> i32 {
    28
}

/// `fc_out(gelu_approx(fc_in(x)))`, both biased.
#[derive(Debug)]
pub struct Mlp {
    fc_in: LinearLayer,
    fc_out: LinearLayer,
}
impl_module!(Mlp { fc_in, fc_out });

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        self.fc_out
            .forward(&activations::gelu_approx(&self.fc_in.forward(x)?)?)
    }
}

/// One layer: attention and feed-forward in parallel over one norm.
#[derive(Debug)]
pub struct GptjBlock {
    ln_1: LayerNorm,
    attn: Attention,
    mlp: Mlp,
}
impl_module!(GptjBlock { ln_1, attn, mlp });

impl GptjBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let h = self.ln_1.forward(x)?;
        let attn = self
            .attn
            .forward(&h, mask, cache, None, Extras::default())?;
        attn.add(&self.mlp.forward(&h)?)?.add(x)
    }
}

/// The token embedding, the layers and the final norm.
#[derive(Debug)]
pub struct GptjModel {
    wte: EmbeddingLayer,
    h: Vec<GptjBlock>,
    ln_f: LayerNorm,
}
impl_module!(GptjModel { wte, h, ln_f });

/// GPT-J with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GptjModel,
    lm_head: LinearLayer,
}
impl_module!(Model { model, lm_head });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, n_heads, eps) = (args.n_embd, args.n_head, args.layer_norm_epsilon);
        let head_dim = even_head_dim(dim, n_heads, "gptj")?;
        let rotary_dim = args.rotary_dim.filter(|&r| r != 0).unwrap_or(head_dim);
        let h = (0..args.n_layer)
            .map(|_| {
                let d = AttentionDims {
                    dim,
                    n_heads,
                    n_kv_heads: n_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                // mlx-lm rotates `key[..., :rotary_dim]` and concatenates the rest back:
                // RoPE over the first `rotary_dim` dimensions of the whole head.
                let rope = Rope::new(rotary_dim, true, 10000.0, 1.0);
                let attn = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?
                    .with_out_name("out_proj");
                Ok(GptjBlock {
                    ln_1: LayerNorm::new(dim, eps, true, true)?,
                    attn,
                    mlp: Mlp {
                        fc_in: LinearLayer::new(dim, 4 * dim, true)?,
                        fc_out: LinearLayer::new(4 * dim, dim, true)?,
                    },
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GptjModel {
            wte: EmbeddingLayer::new(args.vocab_size, dim)?,
            h,
            ln_f: LayerNorm::new(dim, eps, true, true)?,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, true)?;
        Ok(Model {
            args,
            model,
            lm_head,
        })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gptj")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = causal_layers(&m.h, m.wte.forward(tokens)?, caches, GptjBlock::forward)?;
        self.lm_head.forward(&m.ln_f.forward(&h)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.model.h.len()]
    }
    decoder_accessors!(model.h);
}

impl Architecture for Model {
    /// HF's per-layer `transformer.h.{i}.attn.masked_bias` / `attn.bias` buffers dropped,
    /// every `transformer.` in a name replaced by `model.`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        for i in 0..self.args.n_layer {
            weights.remove(&format!("transformer.h.{i}.attn.masked_bias"));
            weights.remove(&format!("transformer.h.{i}.attn.bias"));
        }
        Ok(weights
            .into_iter()
            .map(|(k, v)| (k.replace("transformer.", "model."), v))
            .collect())
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.model.h {
            layer.attn.fuse()?;
        }
        Ok(())
    }
}

//! nanochat (`nanochat`), following `mlx_lm/models/nanochat.py`: parameter-free RMS
//! norms (eps 1e-5) after the token embedding, before each block and at the end; attention
//! without biases (`c_q`, `c_k`, `c_v`, `c_proj`) rotated by RoPE with negated
//! frequencies (`-rope_theta^(i / (head_dim / 2))`, non-traditional), the rotated queries
//! and keys RMS-normed (no weight) before the cache update; a `c_proj(relu2(c_fc(x)))`
//! MLP; an untied `lm_head` whose logits are soft-capped at 15 (`15 * tanh(x / 15)`,
//! shapeless-compiled as in mlx-lm). No `sanitize`, as in mlx-lm.
use super::attention::{Attention, AttentionDims, Extras, HeadNorm, NormAt};
use super::lm::{causal_layers, even_head_dim};
use super::{project_out, Architecture};
use crate::config::parse_args;
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{fast, ops, Array, Dtype, Result};
use mlx_nn::{activations, impl_module, AttnMask, EmbeddingLayer, KvCache, LinearLayer, Rope};
use serde::Deserialize;
use serde_json::Value;

/// The eps of nanochat's parameter-free RMS norm.
const NORM_EPS: f32 = 1e-5;

/// config.json keys read by nanochat (all defaulted, as in mlx-lm).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    #[serde(default = "default_hidden_size")]
    pub hidden_size: i32,
    #[serde(default = "default_num_hidden_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "default_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "default_heads")]
    pub num_key_value_heads: i32,
    #[serde(default = "default_vocab_size")]
    pub vocab_size: i32,
    #[serde(default = "default_intermediate_size")]
    pub intermediate_size: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
}

fn default_model_type() -> String {
    "nanochat".into()
}
fn default_hidden_size() -> i32 {
    1280
}
fn default_num_hidden_layers() -> i32 {
    20
}
fn default_heads() -> i32 {
    10
}
fn default_vocab_size() -> i32 {
    65536
}
fn default_intermediate_size() -> i32 {
    5120
}
fn default_rope_theta() -> f64 {
    10000.0
}

/// `mx.fast.rms_norm(x, None, 1e-5)`.
fn rms_norm(x: &Array) -> Result<Array> {
    fast::rms_norm(x, None, NORM_EPS)
}

/// `c_proj(relu2(c_fc(x)))`, bias-free.
#[derive(Debug)]
pub struct Mlp {
    c_fc: LinearLayer,
    c_proj: LinearLayer,
}
impl_module!(Mlp { c_fc, c_proj });

/// One block: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`.
#[derive(Debug)]
pub struct TransformerBlock {
    attn: Attention,
    mlp: Mlp,
}
impl_module!(TransformerBlock { attn, mlp });

impl TransformerBlock {
    fn forward(&self, x: &Array, mask: &AttnMask, cache: Option<&mut dyn KvCache>) -> Result<Array> {
        let h = self
            .attn
            .forward(&rms_norm(x)?, mask, cache, Some(x), Extras::default())?;
        let up = activations::relu2(&self.mlp.c_fc.forward(&rms_norm(&h)?)?)?;
        project_out(&self.mlp.c_proj, &up, Some(&h))
    }
}

/// The token embedding and the blocks (no final norm weights).
#[derive(Debug)]
pub struct NanoChatModel {
    wte: EmbeddingLayer,
    h: Vec<TransformerBlock>,
}
impl_module!(NanoChatModel { wte, h });

/// nanochat with its head.
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    transformer: NanoChatModel,
    lm_head: LinearLayer,
}
impl_module!(Model {
    transformer,
    lm_head
});

/// RoPE over the whole head with mlx-lm's negated frequencies
/// `-exp(arange(head_dim / 2) * (log(theta) / (head_dim / 2)))` (float32).
fn negated_rope(head_dim: i32, theta: f64) -> crate::Result<Rope> {
    let half = head_dim / 2;
    let freqs = ops::arange(0.0, half as f64, 1.0, Dtype::Float32)?
        .multiply(theta.ln() / half as f64)?
        .exp()?
        .negative()?;
    freqs_rope(head_dim, freqs)
}

/// Non-traditional RoPE over `head_dim` with the frequency table `freqs` (mlx's
/// `fast.rope(..., base=None, freqs=freqs)`), evaluated now as mlx-nn's own tables are
/// (see `Rope::Freqs`); nanochat's and Talkie's negated tables.
pub(crate) fn freqs_rope(head_dim: i32, freqs: Array) -> crate::Result<Rope> {
    mlx_array::transforms::eval(&[&freqs])?;
    Ok(Rope::Freqs {
        dims: head_dim,
        traditional: false,
        freqs,
        input_scale: None,
    })
}

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let dim = args.hidden_size;
        let head_dim = even_head_dim(dim, args.num_attention_heads, "nanochat")?;
        if head_dim % 2 != 0 {
            return Err(crate::Error::Config {
                path: "config.json (nanochat)".into(),
                message: format!("the head size {head_dim} must be even for RoPE"),
            });
        }
        let h = (0..args.num_hidden_layers)
            .map(|_| {
                let d = AttentionDims {
                    dim,
                    n_heads: args.num_attention_heads,
                    n_kv_heads: args.num_key_value_heads,
                    head_dim,
                    qkv_bias: false,
                    o_bias: false,
                };
                let rope = negated_rope(head_dim, args.rope_theta)?;
                let weightless = || HeadNorm::Weightless(NORM_EPS);
                let attn = Attention::new(d, rope, (head_dim as f64).powf(-0.5))?
                    .with_qkv_names("c_q", "c_k", "c_v")
                    .with_out_name("c_proj")
                    .with_qk_norm_pair(NormAt::AfterRope, weightless(), weightless());
                let mlp = Mlp {
                    c_fc: LinearLayer::new(dim, args.intermediate_size, false)?,
                    c_proj: LinearLayer::new(args.intermediate_size, dim, false)?,
                };
                Ok(TransformerBlock { attn, mlp })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let transformer = NanoChatModel {
            wte: EmbeddingLayer::new(args.vocab_size, dim)?,
            h,
        };
        let lm_head = LinearLayer::new(dim, args.vocab_size, false)?;
        Ok(Model {
            args,
            transformer,
            lm_head,
        })
    }
}

/// mlx-lm's `softcap(logits, cap=15.0)`, compiled shapeless: `cap * tanh(logits / cap)`.
fn softcap(logits: &Array) -> Result<Array> {
    activations::call_compiled(
        "nanochat.softcap",
        |a| {
            let cap = 15.0;
            Ok(vec![a[0].divide(cap)?.tanh()?.multiply(cap)?])
        },
        &[logits],
    )
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "nanochat")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.transformer;
        let h = rms_norm(&m.wte.forward(tokens)?)?;
        let h = causal_layers(&m.h, h, caches, TransformerBlock::forward)?;
        softcap(&self.lm_head.forward(&rms_norm(&h)?)?)
    }
    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard; self.transformer.h.len()]
    }
    decoder_accessors!(transformer.h);
}

impl Architecture for Model {
    fn fuse_projections(&mut self) -> crate::Result<()> {
        for layer in &mut self.transformer.h {
            layer.attn.fuse()?;
        }
        Ok(())
    }
}

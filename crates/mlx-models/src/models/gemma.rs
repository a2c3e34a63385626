//! Gemma (the first generation), following `mlx_lm/models/gemma.py`: `1 + weight` RMS
//! norms, a scaled embedding, a GELU-gated feed-forward and the tied head.
use super::lm::Stack;
use super::attention::{Attention, AttentionDims, Extras};
use super::gemma2::RmsNorm;
use super::{fuse, project, project_out, Architecture};
use crate::config::parse_args;
use super::head::{self, LogitScale};
use crate::model::{CacheSpec, LanguageModel};
use mlx_array::{Array, Result};
use mlx_nn::activations::gelu;
use mlx_nn::{impl_module, AttnMask, EmbeddingLayer, FusedLinears, KvCache, LinearLayer, Rope};

fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads: args.num_attention_heads,
        n_kv_heads: args.num_key_value_heads,
        head_dim: args.head_dim,
        qkv_bias: false,
        o_bias: false,
    };
    let rope = Rope::new(args.head_dim, args.rope_traditional, args.rope_theta, 1.0);
    Attention::new(d, rope, (args.head_dim as f64).powf(-0.5))
}
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Gemma.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}

/// `down(gelu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: LinearLayer,
    down_proj: LinearLayer,
    up_proj: LinearLayer,
    /// gate/up as one matmul for decoding steps (set by the loader).
    gate_up: Option<Box<FusedLinears>>,
}
impl_module!(Mlp {
    gate_proj,
    down_proj,
    up_proj
});

impl Mlp {
    fn forward(&self, x: &Array, residual: &Array) -> Result<Array> {
        let [g, u] = project(self.gate_up.as_deref(), [&self.gate_proj, &self.up_proj], x)?;
        project_out(&self.down_proj, &gelu(&g)?.multiply(&u)?, Some(residual))
    }
}

/// One decoder layer (pre-norm).
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
        let h = self.self_attn.forward(
            &self.input_layernorm.forward(x)?,
            mask,
            cache,
            Some(x),
            Extras::default(),
        )?;
        self.mlp
            .forward(&self.post_attention_layernorm.forward(&h)?, &h)
    }
}

/// The decoder stack.
pub type GemmaModel = Stack<TransformerBlock, RmsNorm>;

/// Gemma (the head is always the tied embedding).
#[derive(Debug)]
pub struct Model {
    args: ModelArgs,
    model: GemmaModel,
}
impl_module!(Model { model });

impl Model {
    /// Builds the model (zero placeholders) from config.json.
    pub fn new(args: ModelArgs) -> crate::Result<Model> {
        let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
        let layers = (0..args.num_hidden_layers)
            .map(|_| {
                Ok(TransformerBlock {
                    self_attn: attention(&args)?,
                    mlp: Mlp {
                        gate_proj: LinearLayer::new(dim, args.intermediate_size, false)?,
                        down_proj: LinearLayer::new(args.intermediate_size, dim, false)?,
                        up_proj: LinearLayer::new(dim, args.intermediate_size, false)?,
                        gate_up: None,
                    },
                    input_layernorm: RmsNorm::new(dim, eps)?,
                    post_attention_layernorm: RmsNorm::new(dim, eps)?,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let model = GemmaModel {
            embed_tokens: EmbeddingLayer::new(args.vocab_size, dim)?,
            layers,
            norm: RmsNorm::new(dim, eps)?,
        };
        Ok(Model { args, model })
    }
}

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    Ok(Box::new(Model::new(parse_args(config, "gemma")?)?))
}

impl LanguageModel for Model {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> Result<Array> {
        let m = &self.model;
        let h = m.embed_tokens.forward(tokens)?;
        let h = h.multiply((self.args.hidden_size as f64).powf(0.5))?;
        let out = m.run(h, caches, TransformerBlock::forward, RmsNorm::forward)?;
        head::logits(&m.embed_tokens, None, &out, LogitScale::None)
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
            layer.self_attn.fuse()?;
            let mlp = &mut layer.mlp;
            mlp.gate_up = fuse([&mut mlp.gate_proj, &mut mlp.up_proj])?;
        }
        Ok(())
    }
}

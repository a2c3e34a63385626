//! OLMoE, following `mlx_lm/models/olmoe.py`: OLMo 2's attention (RMS norms over the
//! whole q and k projections) in pre-norm layers whose feed-forward is softmax-routed
//! top-k SwitchGLU experts.
use super::attention::{Attention, AttentionDims, HeadNorm, NormAt};
use super::decoder::{add_residual, stack_mlp_experts, DecoderLayer, FeedForward};
use super::lm::DecoderLm;
use super::{top_k_indices_of_negated, Architecture, Weights};
use crate::config::{default_true, parse_args, rope_scaling};
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, initialize_rope, LinearLayer, RmsNorm, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by OLMoE.
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
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    10000.0
}

/// Self-attention with RMS norms over the whole q and k projections.
fn attention(args: &ModelArgs) -> crate::Result<Attention> {
    let n_heads = args.num_attention_heads;
    let head_dim = args
        .head_dim
        .filter(|&d| d > 0)
        .unwrap_or(args.hidden_size / n_heads);
    let d = AttentionDims {
        dim: args.hidden_size,
        n_heads,
        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        qkv_bias: args.attention_bias,
        o_bias: args.attention_bias,
    };
    let rope = initialize_rope(
        head_dim,
        args.rope_theta,
        args.rope_traditional,
        rope_scaling(args.rope_scaling.as_ref())?.as_ref(),
        args.max_position_embeddings,
    )?;
    let eps = args.rms_norm_eps;
    Attention::new(d, rope, (head_dim as f64).powf(-0.5))?.with_qk_norms(NormAt::Projection, |n| {
        Ok(HeadNorm::Rms(RmsNorm::new(n, eps)?))
    })
}

/// Softmax router over experts, top-k, optionally renormalized.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    top_k: i32,
    norm_topk_prob: bool,
}
impl_module!(SparseMoeBlock { gate, switch_mlp });

impl FeedForward for SparseMoeBlock {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let shape = x.shape();
        let d = x.dim(-1)?;
        let x_flat = x.reshape(&[-1, d])?;
        let routing = self.gate.forward(&x_flat)?.softmax(Some(&[1]), true)?;
        let k = self.top_k;
        let indices = top_k_indices_of_negated(&routing, k)?;
        let mut scores = routing.take_along_axis(&indices, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(&scores.sum(Some(&[-1]), true)?)?;
        }
        let y = self.switch_mlp.forward(&x_flat, &indices)?;
        let y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?
            .reshape(&shape)?;
        add_residual(y, residual)
    }
}

/// OLMoE with its output head.
pub type Model = DecoderLm<ModelArgs, SparseMoeBlock>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "olmoe")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let moe = SparseMoeBlock {
            gate: LinearLayer::new(dim, args.num_experts, false)?,
            switch_mlp: SwitchGlu::new(
                dim,
                args.intermediate_size,
                args.num_experts,
                args.mlp_bias,
            )?,
            top_k: args.num_experts_per_tok,
            norm_topk_prob: args.norm_topk_prob,
        };
        DecoderLayer::new(attention(args)?, moe, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Stacks per-expert weights into `switch_mlp` (a tied head's `lm_head.weight` stays,
    /// and loading refuses it, as mlx-lm does).
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        if !weights.contains_key("model.layers.0.mlp.experts.0.up_proj.weight") {
            return Ok(weights);
        }
        stack_mlp_experts(&mut weights, self.args.num_hidden_layers, self.args.num_experts)?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

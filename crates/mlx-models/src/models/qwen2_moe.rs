//! Qwen2-MoE, following `mlx_lm/models/qwen2_moe.py`: Qwen2 attention (plain RoPE),
//! softmax-routed SwitchGLU experts plus a sigmoid-gated shared expert in every layer.
use super::attention::{Attention, AttentionDims};
use super::decoder::{add_residual, stack_mlp_experts, DecoderLayer, FeedForward};
use super::lm::{DecoderLm, LmDims};
use super::mlp::Mlp;
use super::top_k_indices_of_negated;
use super::{Architecture, Weights};
use crate::config::parse_args;
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, LinearLayer, Rope, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen2-MoE.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_experts: i32,
    pub moe_intermediate_size: i32,
    pub shared_expert_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    1_000_000.0
}

impl ModelArgs {
    /// `__post_init__`'s checks: a `rope_scaling` must be `linear` with a `factor`
    /// (mlx-lm then does not apply it).
    fn validate(self) -> crate::Result<ModelArgs> {
        if let Some(s) = self.rope_scaling.as_ref().filter(|s| !s.is_empty()) {
            let err = |message: &str| crate::Error::Config {
                path: "config.json (qwen2_moe)".into(),
                message: message.into(),
            };
            if !s.contains_key("factor") || !s.contains_key("type") {
                return Err(err("key `rope_scaling` must contain `factor` and `type`"));
            }
            if s.get("type").and_then(Value::as_str) != Some("linear") {
                return Err(err("key `rope_scaling.type`: only `linear` is supported"));
            }
        }
        Ok(self)
    }
}

/// The experts (top-k of the softmax, unnormalized) and the gated shared expert.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    shared_expert: Mlp,
    shared_expert_gate: LinearLayer,
    top_k: i32,
}
impl_module!(SparseMoeBlock {
    gate,
    switch_mlp,
    shared_expert,
    shared_expert_gate
});

impl FeedForward for SparseMoeBlock {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let gates = self.gate.forward(x)?.softmax(Some(&[-1]), true)?;
        let k = self.top_k;
        let inds = top_k_indices_of_negated(&gates, k)?;
        let scores = gates.take_along_axis(&inds, -1)?;
        let y = self
            .switch_mlp
            .forward(x, &inds)?
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?;
        let shared = self.shared_expert.forward(x, None)?;
        let gated = self
            .shared_expert_gate
            .forward(x)?
            .sigmoid()?
            .multiply(&shared)?;
        add_residual(y.add(&gated)?, residual)
    }
    /// The shared expert's gate and up projections (the routed experts stay apart).
    fn fuse(&mut self) -> crate::Result<()> {
        self.shared_expert.fuse()
    }
}

/// Qwen2-MoE with its output head (always its own, as in mlx-lm).
pub type Model = DecoderLm<ModelArgs, SparseMoeBlock>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "qwen2_moe")?;
    let args = args.validate()?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let n_heads = args.num_attention_heads;
    let head_dim = dim / n_heads;
    let dims = AttentionDims {
        dim,
        n_heads,
        n_kv_heads: args.num_key_value_heads.unwrap_or(n_heads),
        head_dim,
        qkv_bias: true,
        o_bias: false,
    };
    let d = LmDims {
        model_type: args.model_type.clone(),
        vocab: args.vocab_size,
        dim,
        eps,
        layers: args.num_hidden_layers,
        tied: false,
    };
    let model = Model::new(d, args, |args, _| {
        let rope = Rope::new(head_dim, args.rope_traditional, args.rope_theta, 1.0);
        let attn = Attention::new(dims, rope, (head_dim as f64).powf(-0.5))?;
        let moe = SparseMoeBlock {
            gate: LinearLayer::new(dim, args.num_experts, false)?,
            switch_mlp: SwitchGlu::new(dim, args.moe_intermediate_size, args.num_experts, false)?,
            shared_expert: Mlp::new(dim, args.shared_expert_intermediate_size, false)?,
            shared_expert_gate: LinearLayer::new(dim, 1, false)?,
            top_k: args.num_experts_per_tok,
        };
        DecoderLayer::new(attn, moe, "mlp", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Per-expert tensors (`mlp.experts.{e}.{proj}.{weight,scales,biases}`) stacked into
    /// `mlp.switch_mlp`, when the checkpoint has them.
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

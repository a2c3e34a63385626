//! Mixtral, following `mlx_lm/models/mixtral.py` (Llama attention, top-k routed
//! SwitchGLU experts with softmax over the chosen logits).
use super::decoder::{add_residual, stack_experts, DecoderLayer, FeedForward};
use super::llama;
use super::lm::{drop_tied_head, DecoderLm};
use super::top_k_indices_of_negated;
use super::{Architecture, Weights};
use crate::config::parse_args;
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, LinearLayer, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Mixtral (every key has mlx-lm's default).
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
#[serde(default)]
pub struct ModelArgs {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_key_value_heads: Option<i32>,
    pub num_local_experts: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_traditional: bool,
    pub tie_word_embeddings: bool,
}

impl Default for ModelArgs {
    fn default() -> ModelArgs {
        ModelArgs {
            model_type: String::new(),
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_experts_per_tok: 2,
            num_key_value_heads: Some(8),
            num_local_experts: 8,
            rms_norm_eps: 1e-5,
            rope_theta: 1e6,
            rope_traditional: false,
            tie_word_embeddings: false,
        }
    }
}

impl ModelArgs {
    /// Llama attention arguments with a plain RoPE, as `MixtralAttention` builds it.
    fn attention_args(&self) -> super::llama::ModelArgs {
        super::llama::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            head_dim: None,
            max_position_embeddings: None,
            num_key_value_heads: Some(self.num_key_value_heads.unwrap_or(self.num_attention_heads)),
            attention_bias: false,
            mlp_bias: false,
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling: None,
            tie_word_embeddings: self.tie_word_embeddings,
            layer_types: None,
            sliding_window: None,
        }
    }
}

/// Top-k router and experts.
#[derive(Debug)]
pub struct SparseMoeBlock {
    gate: LinearLayer,
    switch_mlp: SwitchGlu,
    top_k: i32,
}
impl_module!(SparseMoeBlock { gate, switch_mlp });

impl FeedForward for SparseMoeBlock {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let gates = self.gate.forward(x)?;
        let k = self.top_k;
        let inds = top_k_indices_of_negated(&gates, k)?;
        let scores = gates
            .take_along_axis(&inds, -1)?
            .softmax(Some(&[-1]), true)?;
        let y = self.switch_mlp.forward(x, &inds)?;
        let y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?;
        add_residual(y, residual)
    }
}

/// Mixtral with its output head.
pub type Model = DecoderLm<ModelArgs, SparseMoeBlock>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "mixtral")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let attn_args = args.attention_args();
    let model = Model::new(lm_dims!(args), args, |args, _| {
        let moe = SparseMoeBlock {
            gate: LinearLayer::new(dim, args.num_local_experts, false)?,
            switch_mlp: SwitchGlu::new(dim, args.intermediate_size, args.num_local_experts, false)?,
            top_k: args.num_experts_per_tok,
        };
        let attn = llama::attention(&attn_args, None, None)?;
        DecoderLayer::new(attn, moe, "block_sparse_moe", dim, eps)
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Drops a tied head and stacks `experts.{e}.w1/w2/w3` into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        drop_tied_head(self.args.tie_word_embeddings, &mut weights);
        if !weights.contains_key("model.layers.0.block_sparse_moe.experts.0.w1.weight") {
            return Ok(weights);
        }
        stack_experts(
            &mut weights,
            self.args.num_hidden_layers,
            |l| format!("model.layers.{l}.block_sparse_moe"),
            &[("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")],
            &["weight", "scales", "biases"],
            self.args.num_local_experts,
        )?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

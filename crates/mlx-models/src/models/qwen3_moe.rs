//! Qwen3-MoE, following `mlx_lm/models/qwen3_moe.py` (Qwen3 attention, softmax-routed
//! SwitchGLU experts on sparse layers, dense MLPs on `mlp_only_layers`).
use super::decoder::{
    add_residual, stack_experts, DecoderLayer, DenseOrMoe, FeedForward, GLU_EXPERT_PROJS,
};
use super::lm::{drop_tied_head, DecoderLm};
use super::mlp::Mlp;
use super::qwen3::attention;
use super::top_k_indices;
use super::{Architecture, Weights};
use crate::config::parse_args;
use mlx_array::{Array, Result};
use mlx_nn::{impl_module, LinearLayer, SwitchGlu};
use serde::Deserialize;
use serde_json::Value;

/// config.json keys read by Qwen3-MoE.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct ModelArgs {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i32,
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
}

impl ModelArgs {
    /// The attention arguments (Qwen3's, with plain RoPE as qwen3_moe.py builds it).
    fn attention_args(&self) -> super::qwen3::ModelArgs {
        super::qwen3::ModelArgs {
            model_type: self.model_type.clone(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            num_attention_heads: self.num_attention_heads,
            rms_norm_eps: self.rms_norm_eps,
            vocab_size: self.vocab_size,
            num_key_value_heads: self.num_key_value_heads,
            max_position_embeddings: self.max_position_embeddings,
            head_dim: self.head_dim,
            tie_word_embeddings: self.tie_word_embeddings,
            rope_theta: Some(self.rope_theta),
            rope_scaling: None,
            rope_parameters: None,
        }
    }
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

impl SparseMoeBlock {
    /// `num_experts` SwitchGLU experts of `moe_dim` hidden units behind a bias-free
    /// `gate`, the top `top_k` of their softmax scores used (renormalized when
    /// `norm_topk_prob`).
    pub(crate) fn new(
        dim: i32,
        moe_dim: i32,
        num_experts: i32,
        top_k: i32,
        norm_topk_prob: bool,
    ) -> crate::Result<SparseMoeBlock> {
        Ok(SparseMoeBlock {
            gate: LinearLayer::new(dim, num_experts, false)?,
            switch_mlp: SwitchGlu::new(dim, moe_dim, num_experts, false)?,
            top_k,
            norm_topk_prob,
        })
    }
}

impl FeedForward for SparseMoeBlock {
    fn forward(&self, x: &Array, residual: Option<&Array>) -> Result<Array> {
        let gates = self.gate.forward(x)?.softmax(Some(&[-1]), true)?;
        let k = self.top_k;
        let inds = top_k_indices(&gates, k)?;
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(&scores.sum(Some(&[-1]), true)?)?;
        }
        let y = self.switch_mlp.forward(x, &inds)?;
        let dtype = y.dtype();
        let y = y
            .multiply(&scores.expand_dims(&[-1])?)?
            .sum(Some(&[-2]), false)?
            .astype(dtype)?;
        add_residual(y, residual)
    }
}

/// Drops `lm_head.weight` when `tied`, then stacks the first `layers` layers'
/// `model.layers.{l}.mlp.experts.{e}.{proj}.weight` into `switch_mlp` (Qwen3-MoE's and
/// Mellum's `sanitize`).
pub(crate) fn drop_head_stack_experts(
    weights: &mut Weights,
    tied: bool,
    layers: i32,
    n_experts: i32,
) -> crate::Result<()> {
    drop_tied_head(tied, weights);
    stack_experts(
        weights,
        layers,
        |l| format!("model.layers.{l}.mlp"),
        GLU_EXPERT_PROJS,
        &["weight"],
        n_experts,
    )
}

/// Qwen3-MoE with its output head.
pub type Model = DecoderLm<ModelArgs, DenseOrMoe<SparseMoeBlock>>;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    let args: ModelArgs = parse_args(config, "qwen3_moe")?;
    let (dim, eps) = (args.hidden_size, args.rms_norm_eps);
    let attn_args = args.attention_args();
    let model = Model::new(lm_dims!(args), args, |args, i| {
        let sparse = !args.mlp_only_layers.contains(&i)
            && args.num_experts > 0
            && args.decoder_sparse_step > 0
            && (i + 1) % args.decoder_sparse_step == 0;
        let mlp = if sparse {
            DenseOrMoe::Moe(Box::new(SparseMoeBlock::new(
                dim,
                args.moe_intermediate_size,
                args.num_experts,
                args.num_experts_per_tok,
                args.norm_topk_prob,
            )?))
        } else {
            DenseOrMoe::Dense(Box::new(Mlp::new(dim, args.intermediate_size, false)?))
        };
        Ok(DecoderLayer::new(attention(&attn_args)?, mlp, "mlp", dim, eps)?.norms_before_mlp())
    })?;
    Ok(Box::new(model))
}

impl Architecture for Model {
    /// Drops a tied head and stacks per-expert weights into `switch_mlp`.
    fn sanitize(&mut self, mut weights: Weights) -> crate::Result<Weights> {
        let a = &self.args;
        let (tied, layers) = (a.tie_word_embeddings, a.num_hidden_layers);
        drop_head_stack_experts(&mut weights, tied, layers, a.num_experts)?;
        Ok(weights)
    }
    fn fuse_projections(&mut self) -> crate::Result<()> {
        self.model.fuse()
    }
}

//! What mlx-lm's activation-aware weight quantization (`mlx_lm.awq`) reaches into a model
//! for: the embedding and the head, each transformer block run alone on given hidden
//! states, its attention and feed-forward parts run alone, and the block's norms and
//! projections. Implemented by the Llama-shaped architectures mlx-lm's AWQ supports
//! (Llama / Mistral, Ministral 3 and Mistral 3's text model, Qwen2, Qwen3, Gemma 3's text
//! model); the algorithm
//! is `mlx_quant::awq`.
use mlx_array::{Array, Result};
use mlx_nn::{AttnMask, EmbeddingLayer, LinearLayer, Module, Param};

/// A block's norms and projections, mutably (mlx-lm's names).
pub struct AwqParts<'a> {
    /// The weight of `input_layernorm` (before attention).
    pub input_norm: &'a mut Param,
    /// The weight of the norm before the feed-forward (`post_attention_layernorm`;
    /// Gemma 3's `pre_feedforward_layernorm`).
    pub ff_norm: &'a mut Param,
    /// The norms multiply by `1 + weight` (Gemma's `RMSNorm`) rather than by `weight`.
    pub norm_offset: bool,
    /// `self_attn.q_proj`, `k_proj`, `v_proj`, `o_proj`.
    pub q: &'a mut LinearLayer,
    #[allow(missing_docs)]
    pub k: &'a mut LinearLayer,
    #[allow(missing_docs)]
    pub v: &'a mut LinearLayer,
    #[allow(missing_docs)]
    pub o: &'a mut LinearLayer,
    /// `mlp.gate_proj`, `up_proj`, `down_proj`.
    pub gate: &'a mut LinearLayer,
    #[allow(missing_docs)]
    pub up: &'a mut LinearLayer,
    #[allow(missing_docs)]
    pub down: &'a mut LinearLayer,
}

/// One transformer block, as mlx-lm's AWQ calls it.
pub trait AwqBlock: Module {
    /// `block(x, mask=mask)`: the whole block, residuals included, no cache.
    fn forward_block(&self, x: &Array, mask: &AttnMask) -> Result<Array>;
    /// `block.self_attn(x, mask=mask)`: the attention alone (no residual).
    fn attention(&self, x: &Array, mask: &AttnMask) -> Result<Array>;
    /// `block.mlp(x)`: the feed-forward alone (no residual).
    fn feed_forward(&self, x: &Array) -> Result<Array>;
    /// The norms and projections; `None` where the block is not Llama-shaped (a joint
    /// q/k/v projection, another feed-forward).
    fn parts(&mut self) -> Option<AwqParts<'_>>;
}

/// A model's AWQ access.
pub trait AwqModel {
    /// `model.embed_tokens`.
    fn embed_tokens_mut(&mut self) -> &mut EmbeddingLayer;
    /// The blocks in order.
    fn awq_blocks(&mut self) -> Vec<&mut dyn AwqBlock>;
    /// `lm_head`, where the model has its own (an untied head).
    fn lm_head_mut(&mut self) -> Option<&mut LinearLayer>;
}

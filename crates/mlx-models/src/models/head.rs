//! The output head every decoder ends with: the checkpoint's `lm_head`, or the token
//! embedding read as a linear layer when the two are tied, then the scaling some models
//! put on the logits.
use mlx_array::{Array, Result};
use mlx_nn::{EmbeddingLayer, LinearLayer};

/// What a model does to the head's output.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LogitScale {
    /// The logits as they are.
    None,
    /// `logits * s` (Cohere's `logit_scale`).
    Times(f64),
    /// `logits / s` (Granite's `logits_scaling`).
    Over(f64),
    /// `tanh(logits / cap) * cap` (Gemma 2's final soft-capping).
    SoftCap(f64),
}

/// The untied head's placeholder: `None` when `tied` (the embedding serves), else a
/// bias-free `Linear(dim, vocab)`.
pub(crate) fn untied(tied: bool, dim: i32, vocab: i32) -> crate::Result<Option<LinearLayer>> {
    Ok(if tied {
        None
    } else {
        Some(LinearLayer::new(dim, vocab, false)?)
    })
}

/// `lm_head(x)`, or `embed_tokens.as_linear(x)` without one, scaled by `scale`.
pub(crate) fn logits(
    embed: &EmbeddingLayer,
    lm_head: Option<&LinearLayer>,
    x: &Array,
    scale: LogitScale,
) -> Result<Array> {
    let out = match lm_head {
        Some(head) => head.forward(x)?,
        None => embed.as_linear(x)?,
    };
    match scale {
        LogitScale::None => Ok(out),
        LogitScale::Times(s) => out.multiply(s),
        LogitScale::Over(s) => out.divide(s),
        LogitScale::SoftCap(cap) => out.divide(cap)?.tanh()?.multiply(cap),
    }
}

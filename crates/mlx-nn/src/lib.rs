//! Neural-network layers over `mlx-array`, shaped like `mlx.nn` and mlx-lm's model code.
//!
//! - [`Module`] / [`Param`]: parameter trees with dotted checkpoint names, strict
//!   loading, freezing ([`impl_module!`] implements it for a struct of layers).
//! - Layers: [`Linear`], [`QuantizedLinear`], [`Embedding`], [`QuantizedEmbedding`]
//!   (and the dense-or-quantized [`LinearLayer`], [`EmbeddingLayer`]), [`RmsNorm`],
//!   [`LayerNorm`], [`Rope`] ([`initialize_rope`]), [`SwitchGlu`].
//! - [`activations`] compiled like mlx.nn, [`attention::scaled_dot_product_attention`],
//!   [`quantize::quantize_module`].
//! - [`cache`]: the KV-cache contract models call (with [`ArraysState`] for recurrent
//!   layers); [`gated_delta`]: the gated delta rule of linear-attention layers; [`ssm`]:
//!   the SSD scan of Mamba-2 layers.
#![warn(missing_docs)]

#[macro_use]
mod variants;
pub mod activations;
pub mod attention;
pub mod cache;
pub mod checkpoint;
pub mod embedding;
mod error;
pub mod fused;
pub mod gated_delta;
pub mod linear;
pub mod lora;
pub mod losses;
pub mod module;
pub mod norm;
pub mod pipeline;
pub mod quantize;
pub mod rope;
pub mod ssm;
pub mod switch;
pub mod tap;

pub use attention::scaled_dot_product_attention;
pub use cache::{ArraysState, AttnMask, KvCache, KvFetch};
pub use embedding::{Embedding, EmbeddingLayer, QuantizedEmbedding};
pub use error::{Error, Result};
pub use fused::FusedLinears;
pub use linear::{quantized_params_matmul, Linear, LinearLayer, QuantizedLinear};
pub use module::{Module, Param};
pub use norm::{LayerNorm, RmsNorm};
pub use quantize::{dequantize_module, quantize_module, QuantSpec, Quantizable};
pub use rope::{initialize_rope, Rope, RopeScaling};
pub use switch::{
    GluActivation, QuantizedSwitchLinear, SwitchGlu, SwitchLinear, SwitchLinearLayer, SwitchMlp,
};

//! Fine-tuning adapters as mlx-lm writes them (`mlx_lm.lora`'s `adapters.safetensors`
//! and `adapter_config.json`) and fusing them into the base model (`mlx_lm.fuse`).
//!
//! - [`adapters`]: reading an adapter directory: the fine-tune type (`lora`, `dora`,
//!   `full`), the LoRA parameters, the weights, with errors naming what is wrong.
//! - [`apply`]: adapters applied at inference, unfused, as mlx-lm's `load` does with an
//!   `adapter_path` (LoRA and DoRA on linear layers, full fine-tunes).
//! - [`fuse`]: every adapted layer's weight becomes `W + scale * (B^T A^T)` (DoRA: then
//!   rescaled row by row to the learned magnitude), computed with mlx-lm's ops in its
//!   order, re-quantized with the layer's own quantization unless the model is
//!   dequantized; full fine-tunes replace the weights they hold.
#![warn(missing_docs)]

pub mod adapters;
pub mod apply;
pub mod batches;
pub mod config;
mod error;
pub mod fuse;
pub mod lora_layers;
pub mod optim;
pub mod pyval;
pub mod run;
pub mod schedule;
pub mod trainer;
pub mod ui;

pub use adapters::{AdapterConfig, Adapters, FineTuneType};
pub use apply::{apply_adapters, lora_init_key_draws};
pub use error::{Result, TrainError};
pub use fuse::{fuse_adapters, FuseReport};

//! Fine-tuning as `mlx_lm.lora` does it, and its adapters (`adapters.safetensors` and
//! `adapter_config.json`) applied at inference or fused into the base model
//! (`mlx_lm.fuse`).
//!
//! Training:
//! - [`config`]: the flags, `-c/--config` YAML and `CONFIG_DEFAULTS` merged as mlx-lm
//!   merges them, written back as `adapter_config.json` ([`pyval`]: Python's values and
//!   formats).
//! - [`lora_layers`]: `linear_to_lora_layers` (LoRA / DoRA on linear, quantized and
//!   expert layers, mlx-lm's random initial weights) and the full fine-tune's unfreezing.
//! - [`batches`]: `iterate_batches` (length sort, NumPy's seeded permutation, padding).
//! - [`trainer`]: the masked loss, `value_and_grad` over the trainable parameters,
//!   `evaluate` and the training loop; [`optim`] and [`schedule`]: MLX's optimizers and
//!   learning-rate schedules; [`ui`]: the printed report and the metrics file.
//! - [`run`]: `mlx_lm.lora`'s `run` after loading (datasets, training, testing).
//!
//! Distillation: [`dwq`]: `mlx_lm.dwq` (a quantized student's scales and biases trained
//! on the teacher's output distribution, live or precomputed top-1024 targets).
//!
//! Adapters:
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
pub mod dwq;
mod error;
pub mod fuse;
pub mod hf;
pub mod lora_layers;
pub mod membound;
pub mod optim;
pub mod pyval;
pub mod run;
pub mod schedule;
pub mod trainer;
pub mod ui;

pub use adapters::{AdapterConfig, Adapters, FineTuneType};
pub use apply::{
    apply_adapters, apply_resident_adapters, lora_init_key_draws, remove_resident_adapters,
};
pub use error::{Result, TrainError};
pub use fuse::{fuse_adapters, FuseReport};

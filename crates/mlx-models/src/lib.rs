//! Model architectures and loading.
//!
//! One module per architecture under [`models`] (each follows one mlx-lm file), a
//! [`registry`] from `model_type` to architecture, and [`load_model`] for checkpoint
//! directories (HF or mlx-community, quantized or not).
//!
//! ```no_run
//! let (model, config) = mlx_models::load_model("path/to/model")?;
//! let tokens = mlx_array::Array::from_slice(&[1i32, 2, 3], &[1, 3])?;
//! let logits = model.forward(&tokens, &mut [])?; // [1, 3, vocab]
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod awq;
pub mod config;
mod error;
pub mod loader;
pub mod model;
pub mod models;
pub mod parity;
pub mod quantization;
pub mod registry;

pub use error::{Error, Result};
pub use loader::{load_model, load_model_with, LoadOptions, ModelConfig};
pub use model::{CacheSpec, LanguageModel};
pub use models::Architecture;
pub use quantization::QuantizationConfig;
pub use registry::{build_model, supported_model_types};

//! Model conversion and quantization, interchangeable with mlx-lm's.
//!
//! - [`convert()`]: `mlx_lm.convert` (HF directory, HF-cache repo id or GGUF in; MLX model
//!   directory out; `--dtype`, `-q` with every mode and mixed recipe, `-d`).
//! - [`model`]: the model-level steps (`quantize_model`, `dequantize_model`, bits per
//!   weight); [`predicate`]: mixed-bit recipes and per-layer choices; [`save`]: sharded
//!   safetensors, index, config, side files, model card.
//! - [`dynamic`]: `mlx_lm.dynamic_quant` (per-layer sensitivities from calibration text,
//!   bit allocation for a target bits-per-weight, perplexity).
//! - [`gptq`]: `mlx_lm.gptq` (GPTQ on calibration rows, fallback bits for the rest).
#![warn(missing_docs)]

pub mod awq;
pub mod convert;
pub mod dynamic;
mod error;
pub mod gptq;
pub mod model;
pub mod predicate;
pub mod save;

pub use convert::{
    convert, resolve_source, save_model_over, ConvertOptions, ConvertReport, Source,
};
pub use error::{QuantError, Result};
pub use model::{LoadedModel, QuantArgs};
pub use predicate::{LayerChoice, MixedPredicate, Recipe};

//! The crate's error type.
use std::path::PathBuf;

/// What can go wrong building or loading a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// A layer-level failure (strict loading, quantization, RoPE settings).
    #[error(transparent)]
    Nn(#[from] mlx_nn::Error),
    /// config.json (or one of its keys) is missing or malformed.
    #[error("{path}: {message}")]
    Config {
        /// The file, or the section, that is wrong.
        path: String,
        /// What is wrong, naming the key.
        message: String,
    },
    /// No architecture is registered for this `model_type`.
    #[error("model type `{model_type}` is not supported; supported: {}", supported.join(", "))]
    UnknownModelType {
        /// The requested type.
        model_type: String,
        /// Every supported type and alias.
        supported: Vec<String>,
    },
    /// A weight file is missing, truncated or corrupt.
    #[error("{path}: {message}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the tensor where one is at fault.
        message: String,
    },
    /// A quantization setting the loader cannot honour.
    #[error("quantization: {0}")]
    Quantization(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The error type of this crate.
use std::path::PathBuf;

/// Everything that can go wrong reading or fusing adapters.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The adapter directory or its config is malformed.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The adapter weights do not fit the model.
    #[error("the adapters do not fit the model:\n{0}")]
    Mismatch(String),
    /// What mlx-lm does not support either, or the model does not expose.
    #[error("{0}")]
    Unsupported(String),
    /// Loading, converting or saving the model failed.
    #[error(transparent)]
    Quant(#[from] mlx_quant::QuantError),
    /// A layer-level failure (updating parameters).
    #[error(transparent)]
    Nn(#[from] mlx_nn::Error),
    /// A bad argument or option value.
    #[error("{0}")]
    Invalid(String),
    /// The training data are unusable.
    #[error("{0}")]
    Data(String),
    /// The loss stopped being a number.
    #[error("{0}")]
    Diverged(String),
    /// Reading or tokenizing a dataset failed.
    #[error(transparent)]
    Eval(#[from] mlx_eval::EvalError),
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
}

/// Result alias of this crate.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

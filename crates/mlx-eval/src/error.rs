//! The crate's error type.

/// What can go wrong loading data or evaluating a model.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// A KV cache could not be built.
    #[error(transparent)]
    Cache(#[from] mlx_cache::CacheError),
    /// A layer function refused its arguments.
    #[error(transparent)]
    Nn(#[from] mlx_nn::Error),
    /// Tokenizing or rendering a chat template failed.
    #[error("{context}: {source}")]
    Tokenizer {
        /// Which row.
        context: String,
        /// The tokenizer's error.
        source: mlx_tokenizer::TokenizerError,
    },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Data that is not in a supported format, or too little of it.
    #[error("{0}")]
    Data(String),
    /// The lm-evaluation-harness bridge failed (Python, lm_eval or the pipe).
    #[error("{0}")]
    Harness(String),
    /// Arguments that cannot work together.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias of this crate.
pub type Result<T, E = EvalError> = std::result::Result<T, E>;

//! Errors of the generation engine.

/// What can go wrong while generating.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// A KV-cache operation failed.
    #[error(transparent)]
    Cache(#[from] mlx_cache::CacheError),
    /// A sampler or logits processor failed.
    #[error(transparent)]
    Sample(#[from] mlx_sample::SampleError),
    /// The tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] mlx_tokenizer::TokenizerError),
    /// The request itself is invalid.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias of this crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

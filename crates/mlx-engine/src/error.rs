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
    /// The request itself is invalid (bad parameters, empty prompt, ...).
    #[error("{0}")]
    Invalid(String),
    /// The scheduler's queue is full: try again later.
    #[error("{0}")]
    Busy(String),
    /// The engine could not run the request (an MLX failure such as running out of
    /// memory, a shutdown): the request fails, the engine keeps serving.
    #[error("{0}")]
    Unavailable(String),
    /// A bug: an internal invariant did not hold.
    #[error("{0}")]
    Internal(String),
}

impl EngineError {
    /// Whether the request was at fault (as opposed to the engine).
    pub fn is_invalid_request(&self) -> bool {
        matches!(
            self,
            EngineError::Invalid(_)
                | EngineError::Sample(
                    mlx_sample::SampleError::InvalidParameter { .. }
                        | mlx_sample::SampleError::Constraint(_)
                )
        )
    }
}

/// A copy for every sequence a failure concerns: the message is kept; errors of the
/// lower crates (which cannot be cloned) become [`EngineError::Invalid`] when the
/// request was at fault and [`EngineError::Unavailable`] otherwise.
impl Clone for EngineError {
    fn clone(&self) -> Self {
        match self {
            EngineError::Invalid(m) => EngineError::Invalid(m.clone()),
            EngineError::Busy(m) => EngineError::Busy(m.clone()),
            EngineError::Unavailable(m) => EngineError::Unavailable(m.clone()),
            EngineError::Internal(m) => EngineError::Internal(m.clone()),
            other if other.is_invalid_request() => EngineError::Invalid(other.to_string()),
            other => EngineError::Unavailable(other.to_string()),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

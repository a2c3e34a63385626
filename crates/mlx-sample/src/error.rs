//! The crate's error type.

/// Everything that can go wrong when building or running a sampler or processor.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// MLX refused an operation (bad shape or dtype of the logits, ...).
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// A parameter outside the range mlx-lm accepts (mlx-lm raises `ValueError`).
    #[error("`{name}` {message}, but is {value}")]
    InvalidParameter {
        /// The parameter, as mlx-lm names it.
        name: &'static str,
        /// The accepted range.
        message: String,
        /// The value given.
        value: String,
    },
    /// A constraint on the output (a grammar, a JSON schema) cannot go on: it allows
    /// no token, or the sequence left it. The message says where.
    #[error("{0}")]
    Constraint(String),
}

impl SampleError {
    pub(crate) fn param(name: &'static str, message: &str, value: impl ToString) -> SampleError {
        SampleError::InvalidParameter {
            name,
            message: message.to_string(),
            value: value.to_string(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = SampleError> = std::result::Result<T, E>;

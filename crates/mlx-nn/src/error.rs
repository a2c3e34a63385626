//! The crate's error type.
use mlx_array::Dtype;

/// What can go wrong when building, loading or transforming layers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// Parameters the module has but the weights lack.
    #[error("missing {} parameter(s): {}", .0.len(), some(.0))]
    MissingParameters(Vec<String>),
    /// Weights the module has no parameter for.
    #[error("{} parameter(s) not in the model: {}", .0.len(), some(.0))]
    UnexpectedParameters(Vec<String>),
    /// A weight whose shape differs from the parameter's.
    #[error("parameter {name}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// Dotted parameter name.
        name: String,
        /// The module's shape.
        expected: Vec<i32>,
        /// The weight's shape.
        got: Vec<i32>,
    },
    /// A quantization setting MLX cannot use for this layer.
    #[error("cannot quantize {path}: {message}")]
    Quantization {
        /// Dotted module path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A layer asked for an unsupported dtype.
    #[error("{what}: unsupported dtype {dtype}")]
    Dtype {
        /// Which layer or value.
        what: String,
        /// The dtype.
        dtype: Dtype,
    },
    /// A RoPE scaling configuration that is incomplete or unknown.
    #[error("rope_scaling: {0}")]
    RopeConfig(String),
    /// Arguments a function cannot take together (shapes, dtypes).
    #[error("{0}")]
    Invalid(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The first few of a list of parameter names, and how many more there are (a model of
/// another depth lists hundreds).
fn some(names: &[String]) -> String {
    const SHOWN: usize = 12;
    if names.len() <= SHOWN {
        return names.join(", ");
    }
    format!(
        "{}, and {} more",
        names[..SHOWN].join(", "),
        names.len() - SHOWN
    )
}

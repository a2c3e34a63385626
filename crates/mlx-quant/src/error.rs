//! The error type of this crate.
use std::path::PathBuf;

/// Everything that can go wrong converting, quantizing or measuring a model.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The output path exists (mlx-lm refuses to overwrite too).
    #[error(
        "cannot save to the path {} as it already exists; delete it or specify a new path to save to",
        path.display()
    )]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },
    /// The input holds PyTorch pickle weights only.
    #[error(
        "{} holds PyTorch pickle weights ({files}) but no safetensors: pickle files can run \
         arbitrary code and are not read; convert them to safetensors first (for example with \
         transformers' `save_pretrained(..., safe_serialization=True)`)",
        dir.display()
    )]
    PickleWeights {
        /// The model directory.
        dir: PathBuf,
        /// The pickle files found.
        files: String,
    },
    /// Incompatible or invalid options.
    #[error("{0}")]
    Options(String),
    /// The model could not be resolved (not a directory, GGUF or cached repo id).
    #[error(transparent)]
    Hub(#[from] mlx_hub::HubError),
    /// Importing a GGUF file failed.
    #[error(transparent)]
    Gguf(#[from] mlx_gguf::GgufError),
    /// Loading the model failed (config, weights, architecture).
    #[error(transparent)]
    Model(#[from] mlx_models::Error),
    /// A layer-level failure (quantizing a layer, updating parameters).
    #[error(transparent)]
    Nn(#[from] mlx_nn::Error),
    /// An MLX operation failed.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// The model does not expose what an operation needs.
    #[error("{0}")]
    Unsupported(String),
    /// A JSON file (config, sensitivities) is malformed.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = QuantError> = std::result::Result<T, E>;

/// Maps an I/O error to [`QuantError::Io`] for `path`.
pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> QuantError {
    let path = path.into();
    move |source| QuantError::Io { path, source }
}

//! The crate's error type.
use std::path::PathBuf;

/// Everything that can go wrong with a cache or a prompt-cache file.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// MLX refused an operation (shape mismatch, bad dtype, file I/O, ...).
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// The operation does not exist for this cache class (mlx-lm raises too).
    #[error("{class}: {op} is not supported")]
    Unsupported {
        /// mlx-lm's class name.
        class: &'static str,
        /// What was asked.
        op: &'static str,
    },
    /// A cache of a type this crate cannot serialize.
    #[error("cache {index} of class {class} cannot be saved to a prompt-cache file")]
    NotSerializable {
        /// Position of the cache in the list.
        index: usize,
        /// Its class name.
        class: &'static str,
    },
    /// A prompt-cache file names a cache class this crate does not know.
    #[error("{path}: cache {index} has unknown class `{class}`")]
    UnknownClass {
        /// The file.
        path: PathBuf,
        /// Position of the cache in the file.
        index: usize,
        /// The class name found.
        class: String,
    },
    /// A prompt-cache file whose metadata or tensors do not follow mlx-lm's layout.
    #[error("{path}: not a valid mlx-lm prompt cache: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key or tensor.
        message: String,
    },
    /// An invalid argument (for example a non-positive cache size).
    #[error("{0}")]
    InvalidArgument(String),
}

/// Result alias for this crate.
pub type Result<T, E = CacheError> = std::result::Result<T, E>;

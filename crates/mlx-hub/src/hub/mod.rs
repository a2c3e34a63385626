//! The Hugging Face Hub: downloads into its cache (huggingface_hub's layout, shared with
//! mlx-lm and transformers both ways), uploads through its commit API, and the checks that
//! keep what a user or a server sends inside the cache.
//!
//! Written on `reqwest` rather than the `hf-hub` crate: `hf-hub` has no uploads (no commit
//! API, no LFS batch), no `HF_HUB_OFFLINE`, no tree listing cache (`trees/<commit>.json`,
//! which huggingface_hub uses to tell a complete snapshot from an interrupted one), and
//! does not check the downloaded bytes against the sha256 / git blob id the Hub announces.
pub mod client;
mod disk;
pub mod download;
pub mod repo;
pub mod upload;

pub use client::HubClient;
pub use download::{snapshot_download, CacheRepo, MODEL_ALLOW_PATTERNS};
pub use repo::{is_repo_id, RepoId, RepoType};

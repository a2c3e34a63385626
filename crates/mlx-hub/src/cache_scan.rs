//! The Hugging Face hub cache as `huggingface_hub.scan_cache_dir` sees it (what
//! `mlx_lm.manage` lists and deletes): one repo per `models--org--name` (or `datasets--`,
//! `spaces--`) directory, its size the sum of its distinct blobs, its times the newest
//! blob access and modification, and the human-readable forms of those numbers.
use crate::error::io_err;
use crate::{HubError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Operating-system helper files, skipped wherever they are.
const OS_FILES: &[&str] = &[".DS_Store", "Thumbs.db", "desktop.ini"];
/// Entries of a cache directory that are not repos (besides [`OS_FILES`]).
const NOT_REPOS: &[&str] = &[".locks", "CACHEDIR.TAG"];

/// One cached repo.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRepo {
    /// `org/name`.
    pub repo_id: String,
    /// `model`, `dataset` or `space`.
    pub repo_type: &'static str,
    /// Its directory (absolute).
    pub repo_path: PathBuf,
    /// Bytes of its distinct blobs.
    pub size_on_disk: u64,
    /// Its distinct blobs.
    pub nb_files: usize,
    /// The newest blob access, in seconds since the epoch.
    pub last_accessed: f64,
    /// The newest blob modification, in seconds since the epoch.
    pub last_modified: f64,
    /// Commit hashes of its snapshots.
    pub revisions: Vec<String>,
}

/// A scanned cache: its repos (sorted by path) and the entries that are not valid repos.
#[derive(Debug, Clone, Default)]
pub struct CacheScan {
    /// Valid repos, sorted by `repo_path`.
    pub repos: Vec<CachedRepo>,
    /// Why each invalid entry was skipped.
    pub warnings: Vec<String>,
}

/// Scans `cache_dir` (see the module docs). A missing or non-directory cache is an error;
/// a malformed repo is a warning and is skipped, like `huggingface_hub` does.
pub fn scan_cache_dir(cache_dir: &Path) -> Result<CacheScan> {
    if !cache_dir.is_dir() {
        return Err(HubError::Cache(format!(
            "Hugging Face cache directory not found: {} (set HF_HUB_CACHE or HF_HOME)",
            cache_dir.display()
        )));
    }
    let cache_dir = cache_dir.canonicalize().map_err(io_err(cache_dir))?;
    let mut scan = CacheScan::default();
    for entry in std::fs::read_dir(&cache_dir).map_err(io_err(&cache_dir))? {
        let path = entry.map_err(io_err(&cache_dir))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if OS_FILES.contains(&name) || NOT_REPOS.contains(&name) {
            continue;
        }
        match scan_repo(&path) {
            Ok(r) => scan.repos.push(r),
            Err(why) => scan.warnings.push(why),
        }
    }
    scan.repos.sort_by(|a, b| a.repo_path.cmp(&b.repo_path));
    Ok(scan)
}

fn secs(t: std::io::Result<SystemTime>) -> f64 {
    t.ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        // `is_dir` follows links, as Python's `Path.is_dir` does.
        if p.is_dir() {
            files_under(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

fn scan_repo(path: &Path) -> std::result::Result<CachedRepo, String> {
    let shown = path.display();
    if !path.is_dir() {
        return Err(format!("not a directory: {shown}"));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let Some((prefix, id)) = name.split_once("--") else {
        return Err(format!("not a Hugging Face cache repo: {shown}"));
    };
    let repo_type = match prefix {
        "models" => "model",
        "datasets" => "dataset",
        "spaces" => "space",
        _ => return Err(format!("unknown repo type `{prefix}`: {shown}")),
    };
    let snapshots = path.join("snapshots");
    if !snapshots.is_dir() {
        return Err(format!("no snapshots directory: {}", snapshots.display()));
    }
    // blob -> (size, atime, mtime)
    let mut blobs: BTreeMap<PathBuf, (u64, f64, f64)> = BTreeMap::new();
    let mut revisions = Vec::new();
    let entries = std::fs::read_dir(&snapshots).map_err(|e| format!("{shown}: {e}"))?;
    for rev in entries {
        let rev = rev.map_err(|e| format!("{shown}: {e}"))?.path();
        let rev_name = rev.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if OS_FILES.contains(&rev_name) {
            continue;
        }
        if !rev.is_dir() {
            return Err(format!("a file in snapshots: {}", rev.display()));
        }
        let mut files = Vec::new();
        files_under(&rev, &mut files).map_err(|e| format!("{}: {e}", rev.display()))?;
        for f in files {
            // The first link hop is the blob (a relative link resolves against the file's
            // directory, without resolving `..` through other links).
            let blob = match std::fs::read_link(&f) {
                Ok(target) => normalize(&f.parent().unwrap_or(Path::new("/")).join(target)),
                Err(_) => f.clone(),
            };
            let meta = std::fs::metadata(&blob)
                .map_err(|_| format!("blob missing (broken symlink): {}", blob.display()))?;
            blobs
                .entry(blob)
                .or_insert((meta.len(), secs(meta.accessed()), secs(meta.modified())));
        }
        revisions.push(rev_name.to_string());
    }
    let (last_accessed, last_modified) = if blobs.is_empty() {
        let m = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
        (secs(m.accessed()), secs(m.modified()))
    } else {
        blobs
            .values()
            .fold((f64::MIN, f64::MIN), |(a, m), &(_, ba, bm)| {
                (a.max(ba), m.max(bm))
            })
    };
    revisions.sort();
    Ok(CachedRepo {
        repo_id: id.replace("--", "/"),
        repo_type,
        repo_path: path.to_path_buf(),
        size_on_disk: blobs.values().map(|b| b.0).sum(),
        nb_files: blobs.len(),
        last_accessed,
        last_modified,
        revisions,
    })
}

/// `os.path.abspath`: `.` and `..` removed lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `huggingface_hub`'s `_format_size`: `42.2K`, `3.2G` (powers of 1000).
pub fn format_size(bytes: u64) -> String {
    let mut n = bytes as f64;
    for unit in ["", "K", "M", "G", "T", "P", "E", "Z"] {
        if n.abs() < 1000.0 {
            return format!("{n:3.1}{unit}");
        }
        n /= 1000.0;
    }
    format!("{n:.1}Y")
}

/// `huggingface_hub`'s `format_timesince`: `a few seconds ago`, `3 days ago`, ...
/// (`delta` rounded half to even in each unit, rolling over at each unit's maximum).
pub fn format_timesince(ts: f64, now: f64) -> String {
    const CHUNKS: &[(&str, f64, Option<f64>)] = &[
        ("second", 1.0, Some(59.0)),
        ("minute", 60.0, Some(59.0)),
        ("hour", 3600.0, Some(23.0)),
        ("day", 86400.0, Some(6.0)),
        ("week", 604_800.0, Some(6.0)),
        ("month", 2_592_000.0, Some(11.0)),
        ("year", 31_536_000.0, None),
    ];
    let delta = now - ts;
    if delta < 20.0 {
        return "a few seconds ago".into();
    }
    let (mut label, mut value) = ("year", 0.0);
    for &(l, div, max) in CHUNKS {
        label = l;
        value = (delta / div).round_ties_even();
        if max.is_some_and(|m| value <= m) {
            break;
        }
    }
    format!("{value} {label}{} ago", if value > 1.0 { "s" } else { "" })
}

/// Now, in seconds since the epoch.
pub fn now() -> f64 {
    secs(Ok(SystemTime::now()))
}

/// Deletes a cached repo: its whole directory (every revision, ref and blob).
pub fn delete_repo(repo: &CachedRepo) -> Result<()> {
    std::fs::remove_dir_all(&repo.repo_path).map_err(io_err(&repo.repo_path))
}

/// A cell of [`tabulate`]: text is left-aligned, numbers right-aligned (Python's
/// `format` defaults).
#[derive(Debug, Clone)]
pub enum Cell {
    /// Left-aligned.
    Text(String),
    /// Right-aligned.
    Int(u64),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(n) => n.to_string(),
        }
    }
}

/// `mlx_lm.manage`'s table: columns as wide as their widest cell or header, each cell
/// followed by one space, a dashed rule under the headers.
pub fn tabulate(rows: &[Vec<Cell>], headers: &[&str]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.text().chars().count())
                .chain(std::iter::once(h.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<Cell>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| match c {
                Cell::Text(s) => format!("{s:<w$} "),
                Cell::Int(n) => format!("{n:>w$} "),
            })
            .collect::<String>()
    };
    let mut out = vec![
        line(headers.iter().map(|h| Cell::Text(h.to_string())).collect()),
        line(widths.iter().map(|&w| Cell::Text("-".repeat(w))).collect()),
    ];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_like_huggingface_hub() {
        assert_eq!(format_size(0), "0.0");
        assert_eq!(format_size(999), "999.0");
        assert_eq!(format_size(42_200), "42.2K");
        assert_eq!(format_size(3_200_000_000), "3.2G");
        assert_eq!(format_size(1_000_000), "1.0M");
        let now = 1_000_000_000.0;
        assert_eq!(format_timesince(now - 5.0, now), "a few seconds ago");
        assert_eq!(format_timesince(now - 30.0, now), "30 seconds ago");
        assert_eq!(format_timesince(now - 60.0, now), "1 minute ago");
        // 59.5 rounds to 60 (even): past the maximum, so minutes.
        assert_eq!(format_timesince(now - 59.5, now), "1 minute ago");
        assert_eq!(format_timesince(now - 90.0, now), "2 minutes ago");
        assert_eq!(format_timesince(now - 3.0 * 86400.0, now), "3 days ago");
        assert_eq!(format_timesince(now - 10.0 * 86400.0, now), "1 week ago");
        assert_eq!(format_timesince(now - 400.0 * 86400.0, now), "1 year ago");
    }

    #[test]
    fn tables_align_like_mlx_lm() {
        let t = tabulate(
            &[
                vec![Cell::Text("ab".into()), Cell::Int(3)],
                vec![Cell::Text("a".into()), Cell::Int(12)],
            ],
            &["ID", "N"],
        );
        assert_eq!(t, "ID N  \n-- -- \nab  3 \na  12 ");
    }
}

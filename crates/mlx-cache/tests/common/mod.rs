//! Helpers shared by the parity tests.
#![allow(dead_code)]
use mlx_array::{io, Array};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `goldens/cache/` of the workspace.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/cache")
}

/// Loads a golden file, failing with a hint on how to regenerate it.
pub fn load_golden(name: &str) -> (BTreeMap<String, Array>, BTreeMap<String, String>) {
    let path = golden_dir().join(name);
    io::load_safetensors(&path).unwrap_or_else(|e| {
        panic!("{e}: regenerate with `/work/venv/mlx/bin/python xtask/py/cache_oracle.py goldens`")
    })
}

/// Asserts two arrays have the same shape, dtype and bytes.
pub fn assert_bits_eq(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (
        got.to_bytes().expect("read got"),
        want.to_bytes().expect("read want"),
    );
    assert!(g == w, "{what}: values differ\n got: {got}\nwant: {want}");
}

/// The Python interpreter with mlx_lm: `$MLX_PYTHON`, else `/work/venv/mlx/bin/python`.
/// Panics with setup instructions when none can import mlx_lm.
pub fn mlx_python() -> String {
    let candidates: Vec<String> = std::env::var("MLX_PYTHON")
        .into_iter()
        .chain(std::iter::once("/work/venv/mlx/bin/python".to_string()))
        .collect();
    for py in &candidates {
        let ok = std::process::Command::new(py)
            .args(["-c", "import mlx_lm.models.cache"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return py.clone();
        }
    }
    panic!(
        "this test needs Python with mlx-lm 0.32.2 (tried {candidates:?}); create one with \
         `python3 -m venv /work/venv/mlx && /work/venv/mlx/bin/pip install mlx==0.32.4 \
         mlx-lm==0.32.2` or point MLX_PYTHON at an interpreter that has mlx_lm"
    )
}

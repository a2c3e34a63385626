//! Project automation, run as `cargo xtask <command>`.
use anyhow::{bail, Result};
use std::path::PathBuf;

mod bindgen;
mod goldens;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

const USAGE: &str = "usage: cargo xtask <command>
  bindgen [--check]   regenerate (or verify) crates/mlx-sys/src/bindings.rs";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    match args.first().map(String::as_str) {
        Some("bindgen") => bindgen::run(&root, args.iter().any(|a| a == "--check")),
        Some("goldens") => goldens::run(&root),
        Some("-h") | Some("--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown xtask command `{other}`\n{USAGE}"),
    }
}

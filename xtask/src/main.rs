//! Project automation, run as `cargo xtask <command>`.
use anyhow::{bail, Result};
use std::path::PathBuf;

mod bench;
mod bindgen;
mod convert_parity;
mod gen_parity;
mod goldens;
mod install;
mod parity;
mod test;
mod train_parity;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

const USAGE: &str = "usage: cargo xtask <command>
  test [--quick]      fmt, clippy, bindings check, rustdoc, device code, parity, doc tests, all tests
  bench [--model M] [-p N] [-g N] [-n N] [--out F]   ours vs mlx_lm.benchmark
  bindgen [--check]   regenerate (or verify) crates/mlx-sys/src/bindings.rs
  install [--prefix]  install release binaries and their mlx_lm.* aliases
  goldens             regenerate goldens/ops with Python MLX
  parity [--only a,b] [--regen] [--goldens] [--no-gen | --gen-only | --spec-only]
         [--gen-filter S] [--no-build]
                      logits of tiny models vs mlx-lm, bit for bit, then the
                      text of mlx-generate vs mlx_lm generate (then with
                      --draft-model / prompt lookup; --spec-only: those alone)
                      --convert-only / --no-convert: mlx-convert vs mlx_lm.convert;
                      --train-only / --no-train: mlx-lora vs mlx_lm lora
                      (MLX_SWEEP_ALL=1: the config sweep over every architecture)";

/// `parity`'s flags, and those that take a value; anything else is refused (a typo or
/// `--help` would otherwise start the whole run).
const PARITY_FLAGS: &[&str] = &[
    "--regen",
    "--goldens",
    "--no-gen",
    "--gen-only",
    "--spec-only",
    "--no-build",
    "--convert-only",
    "--no-convert",
    "--train-only",
    "--no-train",
];
const PARITY_VALUED: &[&str] = &["--only", "--gen-filter"];

fn check_parity_args(rest: &[String]) -> Result<()> {
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if PARITY_VALUED.contains(&a.as_str()) {
            if it.next().is_none() {
                bail!("`parity {a}` needs a value\n{USAGE}");
            }
        } else if !PARITY_FLAGS.contains(&a.as_str()) {
            bail!("unknown `parity` argument `{a}`\n{USAGE}");
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    let rest = args.get(1..).unwrap_or(&[]);
    if rest.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    if args.first().map(String::as_str) == Some("parity") {
        check_parity_args(rest)?;
    }
    match args.first().map(String::as_str) {
        Some("test") => test::run(&root, rest),
        Some("bench") => bench::run(&root, rest),
        Some("bindgen") => bindgen::run(&root, args.iter().any(|a| a == "--check")),
        Some("install") => install::run(&root, rest),
        Some("goldens") => goldens::run(&root),
        Some("parity") if rest.iter().any(|a| a == "--convert-only") => {
            convert_parity::run_section(&root)
        }
        Some("parity") if rest.iter().any(|a| a == "--train-only") => train_parity::run(&root),
        Some("parity") => {
            parity::run_parity(&root, rest)?;
            convert_parity::after_parity(&root, rest)?;
            if parity::section_skipped(rest, "--no-train") {
                return Ok(());
            }
            train_parity::run(&root)
        }
        Some("-h") | Some("--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown xtask command `{other}`\n{USAGE}"),
    }
}

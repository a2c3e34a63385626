//! `cargo xtask test`: everything CI checks, in one command (run through
//! `scripts/test.sh`, which installs the Python oracle and test material first).
use anyhow::{bail, Result};
use std::path::Path;
use std::process::Command;

fn step(root: &Path, name: &str, program: &str, args: &[&str]) -> Result<()> {
    step_env(root, name, &[], program, args)
}

fn step_env(
    root: &Path,
    name: &str,
    env: &[(&str, &str)],
    program: &str,
    args: &[&str],
) -> Result<()> {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!(
        "\n==> {name}: {}{program} {}",
        shown.concat(),
        args.join(" ")
    );
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("step `{name}` failed ({status})");
    }
    Ok(())
}

/// Runs formatting, lint, bindings, rustdoc, parity, doc tests and the workspace tests. The
/// nextest run comes last so its summary is the closing line.
pub fn run(root: &Path, extra: &[String]) -> Result<()> {
    let quick = extra.iter().any(|a| a == "--quick");
    step(root, "format", "cargo", &["fmt", "--all", "--check"])?;
    eprintln!("\n==> bindings: cargo xtask bindgen --check");
    crate::bindgen::run(root, true)?;
    step(
        root,
        "clippy",
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // The library crates' API documentation builds without warnings (broken or private
    // links, stray HTML).
    step_env(
        root,
        "rustdoc",
        &[("RUSTDOCFLAGS", "-D warnings")],
        "cargo",
        &["doc", "--workspace", "--no-deps"],
    )?;
    // Our CUDA device code (crates/mlx-sys/shim/fast_*.cpp) compiles with NVRTC for the
    // H100 / H200 as MLX's JIT would, and every kernel fits the registers its block may
    // have: on a CPU machine, with the CUDA wheels fetched once (~150 MB, cached).
    let python = std::env::var("MLX_PYTHON").unwrap_or_else(|_| "python3".to_string());
    step(
        root,
        "device code",
        &python,
        &["benchmarks/kernel_offline.py", "--quick"],
    )?;
    if !quick {
        // Logits, generation and convert parity gate CI (generation ~3.5 min and
        // convert ~3.5 min from a cold cache on 2 cores). The training section's default
        // cases run in the nextest run below; its slow sweep is for `cargo xtask parity`.
        step(root, "parity", "cargo", &["xtask", "parity", "--no-train"])?;
    }
    step(
        root,
        "doc tests",
        "cargo",
        &["test", "--workspace", "--doc"],
    )?;
    step(
        root,
        "tests",
        "cargo",
        &[
            "nextest",
            "run",
            "--workspace",
            "--no-fail-fast",
            "--profile",
            "ci",
        ],
    )
}

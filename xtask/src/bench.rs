//! `cargo xtask bench`: mlx-benchmark vs mlx_lm.benchmark, side by side.
use anyhow::{bail, Result};
use std::path::Path;

/// Runs the command.
pub fn run(_root: &Path, _args: &[String]) -> Result<()> {
    bail!("bench: not implemented yet")
}

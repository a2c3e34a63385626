//! `cargo xtask goldens`: regenerate the op goldens in `goldens/ops/` by running
//! `xtask/py/gen_op_goldens.py` with a Python that has MLX 0.32.4.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The generator script, relative to the repository root.
pub const SCRIPT: &str = "xtask/py/gen_op_goldens.py";
/// Where the goldens go, relative to the repository root.
pub const OUT_DIR: &str = "goldens/ops";

/// The Python interpreter that runs the golden scripts: `MLX_PYTHON` when set, else
/// `<repo>/.venv/bin/python` when it exists, else `/work/venv/mlx/bin/python`.
pub fn python(root: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("MLX_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let local = root.join(".venv/bin/python");
    if local.exists() {
        return local;
    }
    PathBuf::from("/work/venv/mlx/bin/python")
}

/// Runs the generator, writing `goldens/ops/*`.
pub fn run(root: &Path) -> Result<()> {
    let py = python(root);
    let out = root.join(OUT_DIR);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let status = Command::new(&py)
        .arg(root.join(SCRIPT))
        .arg(&out)
        .current_dir(root)
        .status()
        .with_context(|| {
            format!(
                "running {} (set MLX_PYTHON to a Python with mlx)",
                py.display()
            )
        })?;
    if !status.success() {
        bail!("{SCRIPT} failed ({status}) with {}", py.display());
    }
    println!("wrote {OUT_DIR}/");
    Ok(())
}

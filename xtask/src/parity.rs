//! `cargo xtask parity`: logits of our models against mlx-lm's, bit for bit.
//!
//! Generates seeded tiny checkpoints for every registered architecture and variant
//! (`xtask/py/make_tiny_models.py`, into `.cache/parity/models`), has mlx-lm write
//! its logits (`xtask/py/oracle_logits.py`), runs our forward (full sequence, batch,
//! step-by-step decode with mlx-cache's caches) and prints a table. Exits non-zero if
//! any model differs.
//!
//! Options: `--only a,b` (variants), `--regen` (rewrite models and oracle),
//! `--goldens` (rewrite the small committed set in `goldens/models/` instead).
//! Python: `MLX_PYTHON`, else `.venv` (created with the pinned mlx and mlx-lm when
//! missing).
use anyhow::{bail, Context, Result};
use mlx_models::parity::{check_model_dir, summarize, Decoding};
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use std::path::{Path, PathBuf};
use std::process::Command;

const MAKE: &str = "xtask/py/make_tiny_models.py";
const ORACLE: &str = "xtask/py/oracle_logits.py";
const MLX: &str = "mlx[cpu]==0.32.4";
const MLX_LM: &str = "mlx-lm==0.32.2";

/// Whether a section that runs after the logits and generation (convert, training) is
/// left out: by its own `--no-...` flag, or by a run limited to other parts.
pub(crate) fn section_skipped(args: &[String], no_flag: &str) -> bool {
    let limited = ["--only", "--goldens", "--gen-only", "--spec-only"];
    args.iter()
        .any(|a| a == no_flag || limited.contains(&a.as_str()))
}

pub(crate) fn python(root: &Path) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("MLX_PYTHON").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let py = root.join(".venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import mlx_lm, mlx.core"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("parity: creating .venv with {MLX} {MLX_LM}");
        run(Command::new("python3")
            .args(["-m", "venv"])
            .arg(root.join(".venv")))?;
        run(Command::new(root.join(".venv/bin/pip")).args(["install", "--quiet", MLX, MLX_LM]))?;
    }
    Ok(py)
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn caches(model: &dyn LanguageModel) -> Result<Vec<Box<dyn KvCache>>, String> {
    mlx_cache::make_prompt_cache(&model.cache_specs(), None).map_err(|e| e.to_string())
}

/// mlx-lm's `maybe_quantize_kv_cache(cache, 0, 32, 8)` (the oracle's qdecode cases).
fn quantize(caches: &mut [Box<dyn KvCache>]) -> Result<(), String> {
    mlx_cache::maybe_quantize_kv_cache(caches, 0, 32, Some(8)).map_err(|e| e.to_string())
}

/// Runs the command (see the module docs).
pub fn run_parity(root: &Path, args: &[String]) -> Result<()> {
    let flag = |f: &str| args.iter().any(|a| a == f);
    if flag("--gen-only") || flag("--spec-only") {
        return crate::gen_parity::run_gen_parity(root, &python(root)?, args);
    }
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let goldens = flag("--goldens");
    let out = if goldens {
        root.join("goldens/models")
    } else {
        root.join(".cache/parity/models")
    };
    let stamp = out.join(".stamp");
    let script_hash = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for script in [MAKE, ORACLE] {
            std::fs::read(root.join(script))
                .unwrap_or_default()
                .hash(&mut h);
        }
        format!("{:016x}", h.finish())
    };
    let fresh = std::fs::read_to_string(&stamp).is_ok_and(|s| s == script_hash);
    if goldens || flag("--regen") || !fresh || !only.is_empty() {
        let py = python(root)?;
        if only.is_empty() && out.is_dir() {
            // A full run rewrites the whole set, so variants dropped from the script go.
            std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
        }
        let mut make = Command::new(&py);
        make.arg(root.join(MAKE)).arg(&out);
        if goldens {
            make.arg("--goldens");
        }
        if !only.is_empty() {
            make.args(["--only", &only]);
        }
        run(&mut make)?;
        let dirs = model_dirs(&out, &only)?;
        let mut oracle = Command::new(&py);
        oracle.arg(root.join(ORACLE)).args(&dirs);
        run(&mut oracle)?;
        if only.is_empty() && !goldens {
            std::fs::write(&stamp, script_hash)?;
        }
    }
    let dirs = model_dirs(&out, &only)?;
    let width = dirs
        .iter()
        .filter_map(|d| d.file_name())
        .map(|n| n.len())
        .max()
        .unwrap_or(10);
    let mut failed = 0;
    println!("{:width$}  result", "model");
    for dir in &dirs {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let (ok, line) = match check_model_dir(
            dir,
            Some(Decoding {
                make_caches: &caches,
                quantize_caches: Some(&quantize),
            }),
        ) {
            Ok(cases) => summarize(&cases),
            Err(e) => (false, format!("FAILED: {e}")),
        };
        if !ok {
            failed += 1;
        }
        println!("{name:width$}  {line}");
    }
    let generation = if flag("--no-gen") || goldens {
        Ok(())
    } else {
        python(root).and_then(|py| crate::gen_parity::run_gen_parity(root, &py, args))
    };
    if failed > 0 {
        bail!("{failed} of {} models differ from mlx-lm", dirs.len());
    }
    println!("parity: all {} models identical to mlx-lm", dirs.len());
    generation
}

fn model_dirs(out: &Path, only: &str) -> Result<Vec<PathBuf>> {
    let wanted: Vec<&str> = only.split(',').filter(|s| !s.is_empty()).collect();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            wanted.is_empty() || wanted.contains(&n)
        })
        .collect();
    dirs.sort();
    Ok(dirs)
}

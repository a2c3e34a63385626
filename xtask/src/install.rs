//! `cargo xtask install [--prefix DIR]`: builds the release binaries and installs each
//! with its dotted mlx-lm alias (`mlx_lm.generate` -> `mlx-generate`), plus the libmlx
//! they were linked against, so they run without environment variables.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin_names(root: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(root.join("bins/src/bin"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "rs") {
            if let Some(stem) = p.file_stem() {
                names.push(stem.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    Ok(names)
}

fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let from = e.path();
        let to = dst.join(e.file_name());
        if from.is_dir() {
            copy_dir(&from, &to)?;
        } else {
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    Ok(())
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let mut prefix = dirs_home().join(".local");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = PathBuf::from(it.next().context("--prefix needs a directory")?),
            other => bail!("install: unknown argument `{other}`"),
        }
    }
    let status = Command::new("cargo")
        .args(["build", "--release", "-p", "mlx-bins"])
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("cargo build --release failed");
    }
    let release = root.join("target/release");
    let bin_dir = prefix.join("bin");
    let lib_dir = prefix.join("lib");
    std::fs::create_dir_all(&bin_dir)?;
    // libmlx: binaries look in $ORIGIN/../lib/mlx-prefix/lib.
    let mlx = std::fs::canonicalize(release.join("mlx-prefix"))
        .context("target/release/mlx-prefix missing: did mlx-sys build?")?;
    copy_dir(&mlx.join("lib"), &lib_dir.join("mlx-prefix/lib"))?;
    if let Some(libs) = mlx
        .parent()
        .map(|p| p.join("mlx_cpu.libs"))
        .filter(|p| p.is_dir())
    {
        copy_dir(&libs, &lib_dir.join("mlx_cpu.libs"))?;
    }
    for name in bin_names(root)? {
        let src = release.join(&name);
        let dst = bin_dir.join(&name);
        std::fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
        if let Some(verb) = name.strip_prefix("mlx-") {
            let alias = bin_dir.join(format!("mlx_lm.{}", verb.replace('-', "_")));
            let _ = std::fs::remove_file(&alias);
            #[cfg(unix)]
            std::os::unix::fs::symlink(&name, &alias)?;
            println!("installed {} (alias {})", dst.display(), alias.display());
        }
    }
    Ok(())
}

fn dirs_home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local"))
}

//! Finds MLX, compiles our C++ shim against it and links `libmlx`.
//!
//! Search order (the first that has `include/mlx/mlx.h` and `lib/libmlx.*` wins):
//! 1. `MLX_DIR` (a prefix with `include/` and `lib/`);
//! 2. the `mlx` package of a Python interpreter (`MLX_PYTHON`, else the workspace `.venv`, else `python3`);
//! 3. the pinned `mlx-cpu` wheel (Linux) / `mlx-metal` wheel (macOS), fetched with pip
//!    into the build directory.
//!
//! Binaries carry an rpath to the directory it was found in, so they run without any
//! environment variable; `LD_LIBRARY_PATH` still points the same binary at another libmlx.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_VERSION: &str = "0.32.4";

fn is_prefix(p: &Path) -> bool {
    let lib = p.join("lib");
    p.join("include/mlx/mlx.h").is_file()
        && (lib.join("libmlx.so").is_file() || lib.join("libmlx.dylib").is_file())
}

/// The interpreter to ask: `MLX_PYTHON`, else the workspace's `.venv` (made by
/// `scripts/setup.sh`), else `python3`.
fn python() -> String {
    if let Ok(p) = env::var("MLX_PYTHON") {
        return p;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    if let Some(ws) = manifest.ancestors().nth(2) {
        let venv = ws.join(".venv/bin/python");
        if venv.is_file() {
            return venv.to_string_lossy().into_owned();
        }
    }
    "python3".to_string()
}

fn from_python(tried: &mut Vec<String>) -> Option<PathBuf> {
    let python = python();
    let out = Command::new(&python)
        .args([
            "-c",
            "import mlx, sys; sys.stdout.write(list(mlx.__path__)[0])",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string());
            if is_prefix(&p) {
                return Some(p);
            }
            tried.push(format!(
                "{python}: mlx package at {} has no include/ and lib/",
                p.display()
            ));
        }
        _ => tried.push(format!("{python}: no importable `mlx` package")),
    }
    None
}

fn from_wheel(tried: &mut Vec<String>) -> Option<PathBuf> {
    let out_dir = PathBuf::from(env::var("OUT_DIR").ok()?);
    let dest = out_dir.join("mlx-wheel");
    let prefix = dest.join("mlx");
    if is_prefix(&prefix) {
        return Some(prefix);
    }
    let pkg = if cfg!(target_os = "macos") {
        "mlx-metal"
    } else {
        "mlx-cpu"
    };
    let spec = format!("{pkg}=={MLX_VERSION}");
    let wheels = out_dir.join("wheels");
    let python = python();
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&wheels)
        .arg(&spec)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        tried.push(format!("`{python} -m pip download {spec}` failed"));
        return None;
    }
    // Unpack with Python's zipfile so no `unzip` binary is needed.
    let script = "import sys, zipfile, glob\nfor w in glob.glob(sys.argv[1] + '/*.whl'):\n    zipfile.ZipFile(w).extractall(sys.argv[2])\n";
    let status = Command::new(&python)
        .args(["-c", script])
        .arg(&wheels)
        .arg(&dest)
        .status();
    if !matches!(status, Ok(s) if s.success()) || !is_prefix(&prefix) {
        tried.push(format!(
            "unpacking the {spec} wheel into {} failed",
            dest.display()
        ));
        return None;
    }
    Some(prefix)
}

/// `OUT_DIR/mlx-prefix`, a link to `prefix`; `None` if it could not be made.
fn out_dir_link(prefix: &Path) -> Option<PathBuf> {
    let link = PathBuf::from(env::var_os("OUT_DIR")?).join("mlx-prefix");
    if std::fs::read_link(&link).ok().as_deref() != Some(prefix) {
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        std::os::unix::fs::symlink(prefix, &link).ok()?;
        #[cfg(not(unix))]
        return None;
    }
    Some(link)
}

fn link_prefix(prefix: &Path) {
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(profile_dir) = out_dir.ancestors().nth(3) else {
        return;
    };
    let link = profile_dir.join("mlx-prefix");
    if std::fs::read_link(&link).ok().as_deref() == Some(prefix) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    if let Err(e) = std::os::unix::fs::symlink(prefix, &link) {
        println!(
            "cargo:warning=mlx-sys: could not link {}: {e}",
            link.display()
        );
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLX_PYTHON");
    println!("cargo:rerun-if-changed=shim/mlx_shim.cpp");
    println!("cargo:rerun-if-changed=shim/mlx_shim.h");
    println!("cargo:rerun-if-changed=shim/fast_qmv.cpp");
    println!("cargo:rerun-if-changed=shim/fast_qmv.h");
    println!("cargo:rerun-if-changed=shim/fast_gemv.cpp");
    println!("cargo:rerun-if-changed=shim/fast_gemv.h");
    println!("cargo:rerun-if-changed=shim/fast_sdpa.cpp");
    println!("cargo:rerun-if-changed=shim/fast_sdpa.h");
    println!("cargo:rerun-if-changed=shim/fast_mask.cpp");
    println!("cargo:rerun-if-changed=shim/fast_mask.h");
    println!("cargo:rerun-if-changed=shim/fast_qmm.cpp");
    println!("cargo:rerun-if-changed=shim/fast_qmm.h");
    println!("cargo:rerun-if-changed=shim/cpu_gemv.cpp");
    println!("cargo:rerun-if-changed=shim/cpu_gemv.h");
    println!("cargo:rerun-if-changed=shim/kernel_switch.h");
    println!("cargo:rerun-if-changed=shim/affine_operands.h");
    println!("cargo:rerun-if-changed=shim/kernel_cache.cpp");
    println!("cargo:rerun-if-changed=shim/kernel_cache.h");

    let mut tried = Vec::new();
    let prefix = match env::var("MLX_DIR") {
        Ok(d) if is_prefix(Path::new(&d)) => Some(PathBuf::from(d)),
        Ok(d) => {
            tried.push(format!(
                "MLX_DIR={d}: no include/mlx/mlx.h with lib/libmlx.*"
            ));
            None
        }
        Err(_) => {
            tried.push("MLX_DIR: not set".to_string());
            None
        }
    }
    .or_else(|| from_python(&mut tried))
    .or_else(|| from_wheel(&mut tried));

    let Some(prefix) = prefix else {
        panic!(
            "\n\nmlx-sys: could not find MLX {MLX_VERSION}. Tried, in order:\n  - {}\n\
             Set MLX_DIR to a prefix holding include/mlx/mlx.h and lib/libmlx.so, or \
             `pip install mlx[cpu]=={MLX_VERSION}`.\n",
            tried.join("\n  - ")
        );
    };
    let include = prefix.join("include");
    let lib = prefix.join("lib");

    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file("shim/mlx_shim.cpp")
        .file("shim/fast_qmv.cpp")
        .file("shim/fast_gemv.cpp")
        .file("shim/fast_sdpa.cpp")
        .file("shim/fast_mask.cpp")
        .file("shim/fast_qmm.cpp")
        .file("shim/cpu_gemv.cpp")
        .file("shim/kernel_cache.cpp")
        .include(&include)
        .include("shim")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        // cpu_gemv.cpp must multiply and add separately, as MLX's CPU matmul does.
        .flag_if_supported("-ffp-contract=off")
        .opt_level(2)
        .compile("mlx_shim");

    // Search through a link inside OUT_DIR: cargo puts link-search paths that lie inside
    // the target directory on the library path of `cargo test` / `cargo run`, so doctests
    // (built elsewhere, without our rpath) find libmlx too.
    let search = out_dir_link(&prefix).map_or_else(|| lib.clone(), |p| p.join("lib"));
    println!("cargo:rustc-link-search=native={}", search.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    if cfg!(target_os = "macos") {
        println!("cargo:rustc-link-lib=dylib=c++");
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }
    // Binaries find libmlx through `$ORIGIN/mlx-prefix/lib` (see .cargo/config.toml):
    // point <target>/<profile>/mlx-prefix at the prefix we found.
    link_prefix(&prefix);
    println!("cargo:rustc-env=MLX_SYS_PREFIX={}", prefix.display());
    println!("cargo:root={}", prefix.display());
    println!("cargo:lib={}", lib.display());
    println!("cargo:include={}", include.display());
    // Say where MLX came from only when asked: a warning on every build is noise.
    println!("cargo:rerun-if-env-changed=MLX_SYS_VERBOSE");
    if env::var_os("MLX_SYS_VERBOSE").is_some() {
        println!("cargo:warning=mlx-sys: using MLX from {}", prefix.display());
    }
}

//! `mlx-manage` against `python -m mlx_lm manage` on the same fake Hugging Face cache:
//! the same `--scan` table, and for `--delete` (confirmed, refused, asked again after an
//! invalid answer) the same output and the same files left.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

fn python() -> PathBuf {
    common::mlx_lm_python("mlx_lm.manage")
}

/// A repo with one snapshot whose files link to blobs; blob times `age` ago
/// (accessed `accessed` ago).
fn repo(cache: &Path, dir: &str, files: &[(&str, usize)], age: u64, accessed: u64) {
    let r = cache.join(dir);
    // Commit hashes are unique across repos (huggingface_hub deletes by hash).
    let rev = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut h);
        format!("{:016x}{:024x}", h.finish(), 0)
    };
    std::fs::create_dir_all(r.join("blobs")).unwrap();
    std::fs::create_dir_all(r.join("refs")).unwrap();
    std::fs::write(r.join("refs/main"), &rev).unwrap();
    let now = SystemTime::now();
    for (i, (name, size)) in files.iter().enumerate() {
        let blob = r.join("blobs").join(format!("blob{i:02}"));
        std::fs::write(&blob, vec![7u8; *size]).unwrap();
        let f = std::fs::File::options().write(true).open(&blob).unwrap();
        f.set_times(
            std::fs::FileTimes::new()
                .set_modified(now - Duration::from_secs(age))
                .set_accessed(now - Duration::from_secs(accessed)),
        )
        .unwrap();
        let link = r.join("snapshots").join(&rev).join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let depth = name.matches('/').count() + 2;
        let target = format!("{}blobs/blob{i:02}", "../".repeat(depth));
        std::os::unix::fs::symlink(target, &link).unwrap();
    }
}

fn fake_cache(root: &Path) -> PathBuf {
    let cache = root.join("hub");
    let day = 86_400;
    repo(
        &cache,
        "models--mlx-community--Llama-3.2-1B-Instruct-4bit",
        &[
            ("config.json", 1200),
            ("model.safetensors", 2_500_000),
            ("tokenizer.json", 17_000),
        ],
        3 * day,
        5 * 3600,
    );
    repo(
        &cache,
        "models--Qwen--Qwen3-0.6B",
        &[("config.json", 800)],
        40 * day,
        40 * day,
    );
    repo(
        &cache,
        "datasets--someone--mlx-data",
        &[("data/train.jsonl", 54_321)],
        15 * day,
        15 * day,
    );
    repo(
        &cache,
        "models--mlx-community--tiny",
        &[("a", 10), ("b", 999_999)],
        400 * day,
        2 * 3600,
    );
    // Not repos: skipped by both.
    std::fs::create_dir_all(cache.join("models--broken")).unwrap();
    std::fs::create_dir_all(cache.join(".locks")).unwrap();
    cache
}

fn run(cmd: &mut Command, cache: &Path, stdin: &str) -> String {
    use std::io::Write;
    let mut child = cmd
        .env("HF_HUB_CACHE", cache)
        .env_remove("MLX_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).replace(&cache.display().to_string(), "<cache>")
}

fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn ours() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mlx-manage"))
}

fn theirs(py: &Path) -> Command {
    let mut c = Command::new(py);
    c.args(["-m", "mlx_lm", "manage"]);
    c
}

#[test]
fn scan_matches_mlx_lm() {
    let py = python();
    let tmp = common::TempDir::new("manage-scan");
    let cache = fake_cache(&tmp.0);
    for args in [
        &["--scan"][..],
        &["--scan", "--pattern", "Qwen"],
        &["--scan", "--pattern", ""],
    ] {
        let a = run(ours().args(args), &cache, "");
        let b = run(theirs(&py).args(args), &cache, "");
        assert_eq!(a, b, "{args:?}");
        assert!(a.contains("REPO ID"));
    }
    let a = run(ours().arg("--scan"), &cache, "");
    assert!(
        a.contains("mlx-community/tiny") && !a.contains("Qwen"),
        "{a}"
    );
}

#[test]
fn delete_matches_mlx_lm() {
    let py = python();
    for (answer, deleted) in [
        ("y\n", true),
        ("no\n", false),
        ("maybe\nyes\n", true),
        ("", false),
    ] {
        let tmp = common::TempDir::new("manage-delete");
        let a_cache = fake_cache(&tmp.0.join("a"));
        let b_cache = fake_cache(&tmp.0.join("b"));
        let args = ["--delete", "--pattern", "mlx-community"];
        let a = run(ours().args(args), &a_cache, answer);
        if answer.is_empty() {
            // Python's input() fails at the end of input; ours takes it as "no".
            assert!(a.contains("Deletion cancelled"), "{a}");
            assert_eq!(tree(&a_cache), tree(&b_cache));
            continue;
        }
        let b = run(theirs(&py).args(args), &b_cache, answer);
        assert_eq!(a, b, "answer {answer:?}");
        assert_eq!(tree(&a_cache), tree(&b_cache), "answer {answer:?}");
        let left = tree(&a_cache);
        assert_eq!(
            left.iter()
                .any(|p| p.starts_with("models--mlx-community--tiny")),
            !deleted
        );
        assert!(left
            .iter()
            .any(|p| p.starts_with("models--Qwen--Qwen3-0.6B")));
    }
    let tmp = common::TempDir::new("manage-none");
    let cache = fake_cache(&tmp.0);
    let a = run(
        ours().args(["--delete", "--pattern", "nothing-like-this"]),
        &cache,
        "",
    );
    let b = run(
        theirs(&py).args(["--delete", "--pattern", "nothing-like-this"]),
        &cache,
        "",
    );
    assert_eq!(a, b);
}

#[test]
fn a_missing_cache_is_a_one_line_error() {
    let tmp = common::TempDir::new("manage-missing");
    let out = ours()
        .arg("--scan")
        .env("HF_HUB_CACHE", tmp.0.join("absent"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("not found"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

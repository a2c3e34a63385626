//! The commands against a local Hub (xtask/py/hub_server.py): `--model org/name`
//! downloads into the Hugging Face cache and generates what the same model from a local
//! directory generates; `HF_HUB_OFFLINE` uses the cache and names the problem when the
//! cache cannot answer; `mlx-upload` and `mlx-convert --upload-repo` put files that
//! huggingface_hub reads back byte for byte. Skips (saying so) without Python.
#[path = "../../crates/mlx-hub/tests/common_hub.rs"]
mod common_hub;

use common_hub::{python, Server, Tmp, TOKEN};
use std::path::Path;
use std::process::{Command, Output};

fn golden() -> std::path::PathBuf {
    common_hub::root().join("goldens/generate/models/llama-small-f32")
}

fn bin(name: &str, s: &Server, cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(name);
    c.args(args)
        .current_dir(common_hub::root())
        .env("HF_ENDPOINT", &s.endpoint)
        .env("HF_HUB_CACHE", cache)
        .env("HF_TOKEN", TOKEN)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("MLX_LOG")
        .env_remove("RUST_LOG");
    c
}

/// The generated text (between mlx-generate's `==========` lines; the speeds differ).
fn text(out: &str) -> String {
    out.split("==========").nth(1).unwrap_or(out).to_string()
}

fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn generate_takes_a_repo_id_and_works_offline_from_the_cache() {
    let Some(py) = python() else { return };
    let t = Tmp::new("gen");
    let s = Server::start(&py);
    s.py(&[
        "upload",
        &s.endpoint,
        "org/tiny",
        golden().to_str().unwrap(),
    ]);
    let cache = t.0.join("hub");
    let gen = env!("CARGO_BIN_EXE_mlx-generate");
    let args = |m: &str| {
        vec![
            "--model".to_string(),
            m.to_string(),
            "--prompt".into(),
            "hello".into(),
            "--max-tokens".into(),
            "8".into(),
        ]
    };
    let local = ok(
        &bin(gen, &s, &cache, &[])
            .args(args(golden().to_str().unwrap()))
            .output()
            .unwrap(),
        "local",
    );
    let hub = ok(
        &bin(gen, &s, &cache, &[])
            .args(args("org/tiny"))
            .output()
            .unwrap(),
        "repo id",
    );
    assert!(!text(&local).trim().is_empty(), "{local}");
    assert_eq!(text(&hub), text(&local));
    assert!(cache.join("models--org--tiny/refs/main").is_file());
    let offline = ok(
        &bin(gen, &s, &cache, &[])
            .args(args("org/tiny"))
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap(),
        "offline",
    );
    assert_eq!(text(&offline), text(&local));
    // Offline with nothing cached, and a repo the Hub does not have: one clear line each.
    for (repo, offline, wanted) in [
        ("org/absent", "1", "HF_HUB_OFFLINE is set"),
        ("org/absent", "0", "not found on the Hub"),
    ] {
        let o = bin(gen, &s, &cache, &[])
            .args(args(repo))
            .env("HF_HUB_OFFLINE", offline)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(wanted) && err.contains(repo),
            "{err}"
        );
    }
}

#[test]
fn upload_and_convert_upload_read_back_through_huggingface_hub() {
    let Some(py) = python() else { return };
    let t = Tmp::new("upload");
    let s = Server::start(&py);
    let cache = t.0.join("hub");
    let model = t.0.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for e in std::fs::read_dir(golden()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), model.join(e.file_name())).unwrap();
    }
    let up = bin(
        env!("CARGO_BIN_EXE_mlx-upload"),
        &s,
        &cache,
        &["--path", model.to_str().unwrap(), "--upload-repo", "me/up"],
    )
    .output()
    .unwrap();
    let out = ok(&up, "mlx-upload");
    assert_eq!(
        out.trim(),
        format!("Upload successful, go to {}/me/up for details.", s.endpoint)
    );
    let conv_dir = t.0.join("converted");
    let conv = bin(
        env!("CARGO_BIN_EXE_mlx-convert"),
        &s,
        &cache,
        &[
            "--hf-path",
            golden().to_str().unwrap(),
            "--mlx-path",
            conv_dir.to_str().unwrap(),
            "-q",
            "--upload-repo",
            "me/conv",
        ],
    )
    .output()
    .unwrap();
    assert!(ok(&conv, "mlx-convert --upload-repo").contains("Upload successful"));
    for (repo, dir) in [("me/up", &model), ("me/conv", &conv_dir)] {
        let back = t.0.join(format!("back-{}", repo.replace('/', "-")));
        let o = s.py(&["snapshot", &s.endpoint, back.to_str().unwrap(), repo]);
        let snap = std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name();
            assert_eq!(
                std::fs::read(dir.join(&name)).unwrap(),
                std::fs::read(snap.join(&name)).unwrap(),
                "{repo}: {name:?}"
            );
            n += 1;
        }
        let card = std::fs::read_to_string(snap.join("README.md")).unwrap();
        assert!(
            n >= 4 && card.contains(&format!("load(\"{repo}\")")),
            "{card}"
        );
    }
    // A bad repo id fails before anything is written or uploaded.
    let o = bin(
        env!("CARGO_BIN_EXE_mlx-upload"),
        &s,
        &cache,
        &["--path", model.to_str().unwrap(), "--upload-repo", "../x"],
    )
    .output()
    .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a valid repo id"));
}

/// The golden perplexity check, its data served as a Hub dataset (`data/train-*.jsonl`
/// shards): the same report, the same perplexity as mlx-lm on that data.
#[test]
fn perplexity_reads_a_dataset_id_like_the_local_copy() {
    let Some(py) = python() else { return };
    let t = Tmp::new("ppl");
    let s = Server::start(&py);
    let local = common_hub::root().join("goldens/perplexity/text");
    let text = std::fs::read_to_string(local.join("train.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (a, b) = lines.split_at(lines.len() / 2);
    let ds = t.0.join("ds");
    std::fs::create_dir_all(ds.join("data")).unwrap();
    std::fs::write(
        ds.join("data/train-00000-of-00002.jsonl"),
        a.join("\n") + "\n",
    )
    .unwrap();
    std::fs::write(
        ds.join("data/train-00001-of-00002.jsonl"),
        b.join("\n") + "\n",
    )
    .unwrap();
    std::fs::write(ds.join("notes.jsonl"), "{\"text\": \"not train data\"}\n").unwrap();
    s.py(&[
        "upload",
        &s.endpoint,
        "org/ds",
        ds.to_str().unwrap(),
        "--type",
        "dataset",
    ]);
    let cache = t.0.join("hub");
    let model = common_hub::root().join("goldens/generate/models/llama-small-f32");
    let run = |data: &str| {
        let args = [
            "--model",
            model.to_str().unwrap(),
            "--data-path",
            data,
            "--sequence-length",
            "32",
            "--num-samples",
            "6",
            "--batch-size",
            "4",
        ];
        let o = bin(env!("CARGO_BIN_EXE_mlx-perplexity"), &s, &cache, &args)
            .output()
            .unwrap();
        ok(&o, data)
    };
    let ours = run("org/ds");
    let strip = |s: &str| {
        s.lines()
            .filter(|l| {
                !l.contains("Model loaded")
                    && !l.contains("Loading Hugging Face dataset")
                    && !l.contains(" per second")
                    && !l.contains("time")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let reference = run(local.to_str().unwrap());
    assert!(ours.contains("Perplexity: "), "{ours}");
    assert_eq!(strip(&ours), strip(&reference));
    assert!(cache.join("datasets--org--ds/refs/main").is_file());
}

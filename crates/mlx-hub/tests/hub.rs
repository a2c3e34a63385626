//! Downloads and uploads against a local Hub (xtask/py/hub_server.py), with the official
//! `huggingface_hub` client as the referee: the cache tree we write is the one its
//! `snapshot_download` writes, what we upload it reads back file for file, and mlx-lm
//! loads our download offline by repo id. Faults: interrupted transfers resume, corrupt
//! or mis-sized bytes and path traversal are refused with nothing left in the cache.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common_hub;

use common_hub::{model_folder, python, tree, Server, Tmp};
use mlx_hub::hub::{snapshot_download, MODEL_ALLOW_PATTERNS};
use mlx_hub::{HubError, RepoId, RepoType};
use std::path::Path;

const ALLOW: Option<&[&str]> = Some(MODEL_ALLOW_PATTERNS);

fn model(id: &str) -> RepoId {
    RepoId::new(id, RepoType::Model).unwrap()
}

/// A server with `org/tiny` uploaded by huggingface_hub.
fn served(t: &Tmp) -> Option<Server> {
    let py = python()?;
    let s = Server::start(&py);
    let folder = model_folder(t);
    s.py(&["upload", &s.endpoint, "org/tiny", folder.to_str().unwrap()]);
    Some(s)
}

fn sha256_of_safetensors(s: &Server, cache: &Path) -> String {
    let snap = snapshot_download(
        &s.client(),
        cache,
        &model("org/tiny"),
        "main",
        Some(&["config.json"]),
    )
    .unwrap();
    let _ = snap;
    let tree: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::fs::read_dir(cache.join("models--org--tiny/trees"))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path(),
        )
        .unwrap(),
    )
    .unwrap();
    tree["files"]["model.safetensors"]["lfs_sha256"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn download_matches_huggingface_hub_snapshot_download_and_mlx_lm_loads_it() {
    let t = Tmp::new("same-tree");
    let Some(s) = served(&t) else { return };
    let ours = t.0.join("ours");
    let theirs = t.0.join("theirs");
    let snap = snapshot_download(&s.client(), &ours, &model("org/tiny"), "main", ALLOW).unwrap();
    assert!(snap.join("config.json").is_file() && snap.join("model.safetensors").is_file());
    assert!(
        !snap.join("pytorch_model.bin").exists(),
        "mlx-lm's patterns skip .bin"
    );
    assert!(snap.join("extra/notes.txt").is_file());
    let out = s.py(&[
        "snapshot",
        &s.endpoint,
        theirs.to_str().unwrap(),
        "org/tiny",
        "--mlx-lm-patterns",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        theirs
            .join(snap.strip_prefix(&ours).unwrap())
            .display()
            .to_string()
    );
    assert_eq!(tree(&ours), tree(&theirs));
    // A second run changes nothing and asks for no bytes.
    let before = s.gets();
    snapshot_download(&s.client(), &ours, &model("org/tiny"), "main", ALLOW).unwrap();
    assert_eq!(s.gets(), before);
    assert_eq!(tree(&ours), tree(&theirs));
    // mlx-lm finds and loads it by repo id, offline, from our cache.
    let load = std::process::Command::new(&s.py)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", &ours)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .args([
            "-c",
            "from mlx_lm import load; m, tok = load('org/tiny'); print(type(m).__module__)",
        ])
        .output()
        .unwrap();
    assert!(
        load.status.success()
            && String::from_utf8_lossy(&load.stdout).contains("mlx_lm.models.llama"),
        "mlx-lm could not load our download:\n{}\n{}",
        String::from_utf8_lossy(&load.stdout),
        String::from_utf8_lossy(&load.stderr)
    );
}

#[test]
fn an_interrupted_download_resumes_with_a_range_request() {
    let t = Tmp::new("resume");
    let Some(s) = served(&t) else { return };
    let cache = t.0.join("cache");
    let oid = sha256_of_safetensors(&s, &t.0.join("probe"));
    s.control(serde_json::json!({"truncate_once": {&oid: 50_000}}));
    let e = snapshot_download(&s.client(), &cache, &model("org/tiny"), "main", ALLOW).unwrap_err();
    assert!(matches!(e, HubError::Truncated { got: 50_000, .. }), "{e}");
    assert!(
        e.to_string().contains("run the command again to resume"),
        "{e}"
    );
    let storage = cache.join("models--org--tiny");
    let partial = storage.join("blobs").join(format!("{oid}.incomplete"));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 50_000);
    assert!(!storage.join("blobs").join(&oid).exists());
    let snap = std::fs::read_dir(storage.join("snapshots"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(
        !snap.join("model.safetensors").exists(),
        "no pointer to a half-written blob"
    );
    snapshot_download(&s.client(), &cache, &model("org/tiny"), "main", ALLOW).unwrap();
    assert_eq!(s.gets()[&oid], serde_json::json!([0, 50_000]));
    assert!(!partial.exists());
    let theirs = t.0.join("theirs");
    s.py(&[
        "snapshot",
        &s.endpoint,
        theirs.to_str().unwrap(),
        "org/tiny",
        "--mlx-lm-patterns",
    ]);
    assert_eq!(tree(&cache), tree(&theirs));
}

/// Nothing for the file in the cache: no blob, no partial, no pointer.
fn nothing_for(cache: &Path, etag: &str, file: &str) {
    let storage = cache.join("models--org--tiny");
    for e in std::fs::read_dir(storage.join("blobs"))
        .into_iter()
        .flatten()
    {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(etag), "left {name} in the cache");
    }
    for e in std::fs::read_dir(storage.join("snapshots"))
        .into_iter()
        .flatten()
    {
        assert!(
            !e.unwrap().path().join(file).exists(),
            "left a pointer to {file}"
        );
    }
}

#[test]
fn wrong_bytes_sizes_and_etags_are_refused_and_leave_nothing() {
    let t = Tmp::new("faults");
    let Some(s) = served(&t) else { return };
    let oid = sha256_of_safetensors(&s, &t.0.join("probe"));
    for (i, (fault, needle)) in [
        (serde_json::json!({"corrupt": {&oid: true}}), "expected"),
        (
            serde_json::json!({"corrupt": {}, "wrong_size": {&oid: 7}}),
            "announces",
        ),
        (
            serde_json::json!({"wrong_size": {}, "bad_etag": {&oid: true}}),
            "ETag",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        s.control(fault);
        let cache = t.0.join(format!("cache{i}"));
        let e =
            snapshot_download(&s.client(), &cache, &model("org/tiny"), "main", ALLOW).unwrap_err();
        assert!(matches!(e, HubError::Integrity { .. }), "{e:?}");
        assert!(
            e.to_string().contains(needle) && e.to_string().contains("model.safetensors"),
            "{e}"
        );
        nothing_for(&cache, &oid, "model.safetensors");
    }
}

#[test]
fn traversal_bad_ids_and_bad_revisions_are_refused() {
    let t = Tmp::new("traversal");
    let Some(s) = served(&t) else { return };
    let cache = t.0.join("cache");
    for bad in [
        "../../evil.json",
        "/tmp/evil.json",
        "a/../../evil.json",
        "a\\..\\evil.json",
    ] {
        let entry =
            serde_json::json!({"type": "file", "oid": "0".repeat(40), "size": 2, "path": bad});
        s.control(serde_json::json!({"extra_tree": {"org/tiny": [entry]}}));
        let e =
            snapshot_download(&s.client(), &cache, &model("org/tiny"), "main", None).unwrap_err();
        assert!(matches!(e, HubError::BadPath { .. }), "{bad}: {e:?}");
        assert!(e.to_string().contains(bad), "{e}");
    }
    assert!(!t.0.join("evil.json").exists());
    for rev in ["../../x", "/abs", "a/../b", ""] {
        let e = snapshot_download(&s.client(), &cache, &model("org/tiny"), rev, None).unwrap_err();
        assert!(matches!(e, HubError::BadPath { .. }), "{rev}: {e:?}");
    }
    for id in [
        "../x",
        "org/../x",
        "/abs/x",
        "a/b/c",
        "org",
        "org/na me",
        "org--x/y",
    ] {
        let e = RepoId::new(id, RepoType::Model).unwrap_err();
        assert!(e.to_string().contains("not a valid repo id"), "{e}");
    }
    // A revision that does not exist and a repo that does not exist name themselves.
    s.control(serde_json::json!({"extra_tree": {}}));
    let e = snapshot_download(
        &s.client(),
        &cache,
        &model("org/tiny"),
        "no-such-branch",
        None,
    )
    .unwrap_err();
    assert!(matches!(e, HubError::RevisionNotFound { .. }), "{e:?}");
    let e = snapshot_download(&s.client(), &cache, &model("org/absent"), "main", None).unwrap_err();
    assert!(matches!(e, HubError::RepoNotFound { .. }), "{e:?}");
    assert!(!cache.join("models--org--absent").exists());
}

#[test]
fn private_gated_and_offline_say_what_to_do() {
    let t = Tmp::new("auth");
    let Some(s) = served(&t) else { return };
    let cache = t.0.join("cache");
    let anon = mlx_hub::HubClient::new(s.endpoint.clone(), None, false).unwrap();
    s.control(serde_json::json!({"private": ["org/tiny"]}));
    let e = snapshot_download(&anon, &cache, &model("org/tiny"), "main", ALLOW).unwrap_err();
    assert!(
        matches!(e, HubError::RepoNotFound { .. }) && e.to_string().contains("HF_TOKEN"),
        "{e}"
    );
    s.control(serde_json::json!({"private": [], "gated": ["org/tiny"]}));
    let e = snapshot_download(&anon, &cache, &model("org/tiny"), "main", ALLOW).unwrap_err();
    assert!(
        matches!(e, HubError::Gated { .. }) && e.to_string().contains("HF_TOKEN"),
        "{e}"
    );
    let offline = mlx_hub::HubClient::new(s.endpoint.clone(), None, true).unwrap();
    let e = snapshot_download(&offline, &cache, &model("org/tiny"), "main", ALLOW).unwrap_err();
    assert!(
        matches!(e, HubError::Offline { .. }) && e.to_string().contains("HF_HUB_OFFLINE"),
        "{e}"
    );
    // With the token it downloads; then offline (and a gated answer) use the cache.
    let snap = snapshot_download(&s.client(), &cache, &model("org/tiny"), "main", ALLOW).unwrap();
    assert_eq!(
        snapshot_download(&offline, &cache, &model("org/tiny"), "main", ALLOW).unwrap(),
        snap
    );
    assert_eq!(
        snapshot_download(&anon, &cache, &model("org/tiny"), "main", ALLOW).unwrap(),
        snap
    );
    // An incomplete snapshot is not passed off as complete offline.
    std::fs::remove_file(snap.join("tokenizer.json")).unwrap();
    let e = snapshot_download(&offline, &cache, &model("org/tiny"), "main", ALLOW).unwrap_err();
    assert!(
        e.to_string().contains("incomplete") && e.to_string().contains("tokenizer.json"),
        "{e}"
    );
}

/// Run by [`concurrent_downloads_by_us_and_huggingface_hub_fetch_each_blob_once`] in
/// child processes.
#[test]
#[ignore = "a child of concurrent_downloads_by_us_and_huggingface_hub_fetch_each_blob_once"]
fn child_download() {
    let Ok(endpoint) = std::env::var("HUB_TEST_ENDPOINT") else {
        return;
    };
    let cache = std::env::var("HUB_TEST_CACHE").unwrap();
    let client = mlx_hub::HubClient::new(endpoint, Some(common_hub::TOKEN.into()), false).unwrap();
    snapshot_download(
        &client,
        Path::new(&cache),
        &model("org/tiny"),
        "main",
        ALLOW,
    )
    .unwrap();
}

#[test]
fn concurrent_downloads_by_us_and_huggingface_hub_fetch_each_blob_once() {
    let t = Tmp::new("concurrent");
    let Some(s) = served(&t) else { return };
    let cache = t.0.join("cache");
    // Slow transfers (a second per 64 KiB) so that the runs overlap.
    s.control(serde_json::json!({"delay": 1.0}));
    let exe = std::env::current_exe().unwrap();
    let spawn = || {
        std::process::Command::new(&exe)
            .args(["child_download", "--exact", "--ignored", "--nocapture"])
            .env("HUB_TEST_ENDPOINT", &s.endpoint)
            .env("HUB_TEST_CACHE", &cache)
            .output()
    };
    // Two of ours and huggingface_hub's snapshot_download, all at once.
    let (a, b, p) = std::thread::scope(|sc| {
        let a = sc.spawn(spawn);
        let b = sc.spawn(spawn);
        let p = sc.spawn(|| {
            s.py_cmd(&[
                "snapshot",
                &s.endpoint,
                cache.to_str().unwrap(),
                "org/tiny",
                "--mlx-lm-patterns",
            ])
            .output()
        });
        (
            a.join().unwrap().unwrap(),
            b.join().unwrap().unwrap(),
            p.join().unwrap().unwrap(),
        )
    });
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    for o in [&a, &b] {
        assert!(
            o.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("1 passed"),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    s.control(serde_json::json!({"delay": 0}));
    // Each blob was fetched once: the others waited on its lock (the same flock
    // huggingface_hub takes), then found it.
    for (etag, starts) in s.gets().as_object().unwrap() {
        assert_eq!(starts, &serde_json::json!([0]), "{etag} fetched {starts}");
    }
    let theirs = t.0.join("theirs");
    s.py(&[
        "snapshot",
        &s.endpoint,
        theirs.to_str().unwrap(),
        "org/tiny",
        "--mlx-lm-patterns",
    ]);
    assert_eq!(tree(&cache), tree(&theirs));
}

#[test]
fn our_upload_reads_back_through_huggingface_hub_with_mlx_lms_card() {
    let t = Tmp::new("upload");
    let Some(py) = python() else { return };
    let s = Server::start(&py);
    let folder = model_folder(&t);
    std::fs::write(
        folder.join("README.md"),
        "---\nbase_model: base/model\nlibrary_name: mlx\ntags:\n- mlx\n---\nold card\n",
    )
    .unwrap();
    let theirs_src = t.0.join("theirs-src");
    copy_dir(&folder, &theirs_src);
    // Ours.
    let repo = model("me/ours");
    mlx_hub::hub::upload::write_model_card(&folder, "me/ours").unwrap();
    mlx_hub::hub::upload::create_repo(&s.client(), &repo).unwrap();
    mlx_hub::hub::upload::create_repo(&s.client(), &repo).unwrap(); // exists: fine
    mlx_hub::hub::upload::upload_folder(&s.client(), &repo, &folder, "Upload").unwrap();
    // mlx-lm's upload_to_hub of the same folder.
    s.py(&[
        "mlx-upload",
        &s.endpoint,
        theirs_src.to_str().unwrap(),
        "me/ours",
    ]);
    // Read both back with huggingface_hub: every file, byte for byte; the cards are equal.
    let back = t.0.join("back");
    let out = s.py(&["snapshot", &s.endpoint, back.to_str().unwrap(), "me/ours"]);
    let snap = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    for rel in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "extra/notes.txt",
        "pytorch_model.bin",
        "README.md",
    ] {
        assert_eq!(
            std::fs::read(folder.join(rel)).unwrap(),
            std::fs::read(snap.join(rel)).unwrap(),
            "{rel}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(folder.join("README.md")).unwrap(),
        std::fs::read_to_string(theirs_src.join("README.md")).unwrap(),
        "our card is mlx-lm's"
    );
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let to = dst.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &to);
        } else {
            std::fs::copy(&p, &to).unwrap();
        }
    }
}

#[test]
fn the_environment_names_endpoint_token_and_offline_mode() {
    let t = Tmp::new("env");
    std::fs::write(t.0.join("token"), "file-token\n").unwrap();
    // SAFETY: nextest runs each test in its own process.
    unsafe {
        std::env::set_var("HF_HOME", &t.0);
        std::env::remove_var("HF_TOKEN");
        std::env::remove_var("HF_TOKEN_PATH");
        std::env::set_var("HF_ENDPOINT", "http://hub.invalid:9/");
        std::env::set_var("HF_HUB_OFFLINE", "yes");
    }
    let c = mlx_hub::HubClient::from_env().unwrap();
    assert_eq!(c.endpoint, "http://hub.invalid:9");
    assert_eq!(c.token.as_deref(), Some("file-token"));
    assert!(c.offline);
    // SAFETY: nextest runs each test in its own process.
    unsafe {
        std::env::set_var("HF_TOKEN", "env-token");
        std::env::set_var("HF_HUB_OFFLINE", "0");
        std::env::remove_var("HF_ENDPOINT");
    }
    let c = mlx_hub::HubClient::from_env().unwrap();
    assert_eq!(c.token.as_deref(), Some("env-token"));
    assert_eq!(c.endpoint, "https://huggingface.co");
    assert!(!c.offline);
}

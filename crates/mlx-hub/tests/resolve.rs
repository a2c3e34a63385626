//! Model resolution against fake cache layouts in a temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_hub::{HubError, Locations};
use std::path::{Path, PathBuf};

struct Tmp(PathBuf);
impl Tmp {
    fn new(tag: &str) -> Tmp {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("mlx-hub-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
    fn locations(&self) -> Locations {
        Locations {
            cache_dir: self.0.join("mlx-rs"),
            hf_hub_cache: self.0.join("hf/hub"),
        }
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fake_hf_repo(hub: &Path, repo: &str, hash: &str) -> PathBuf {
    let root = hub.join(format!("models--{}", repo.replace('/', "--")));
    let snap = root.join("snapshots").join(hash);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), format!("{hash}\n")).unwrap();
    std::fs::write(snap.join("config.json"), "{}").unwrap();
    snap
}

#[test]
fn org_name_resolves_through_refs_main_to_the_snapshot() {
    let t = Tmp::new("hf");
    let loc = t.locations();
    let old = fake_hf_repo(&loc.hf_hub_cache, "mlx-community/Tiny-4bit", "aaaa1111");
    let snap = fake_hf_repo(&loc.hf_hub_cache, "mlx-community/Tiny-4bit", "bbbb2222");
    assert_ne!(old, snap);
    assert_eq!(loc.resolve(Some("mlx-community/Tiny-4bit")).unwrap(), snap);
}

#[test]
fn local_model_directory_is_returned_as_is() {
    let t = Tmp::new("local");
    let dir = t.0.join("my-model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    let spec = dir.to_string_lossy().into_owned();
    assert_eq!(t.locations().resolve(Some(&spec)).unwrap(), dir);
}

#[test]
fn directory_without_config_json_is_not_a_model() {
    let t = Tmp::new("noconfig");
    let spec = t.0.to_string_lossy().into_owned();
    let e = t.locations().resolve(Some(&spec)).unwrap_err();
    assert!(matches!(e, HubError::NotAModelDir { .. }), "{e:?}");
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn missing_model_error_names_every_place_looked() {
    let t = Tmp::new("missing");
    let loc = t.locations();
    // No network in tests: the Hub is asked nothing (tests/hub.rs covers downloads).
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let e = loc.resolve(Some("someorg/some-model")).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, HubError::NotFound { looked, .. } if looked.len() == 3),
        "{e:?}"
    );
    assert!(msg.contains("someorg/some-model"), "{msg}");
    assert!(msg.contains("local directory"), "{msg}");
    assert!(
        msg.contains(
            &loc.hf_hub_cache
                .join("models--someorg--some-model")
                .display()
                .to_string()
        ),
        "{msg}"
    );
    assert!(msg.contains("HF_HUB_OFFLINE is set"), "{msg}");

    // A repo whose refs/main points at a missing snapshot is reported as such.
    let root = loc.hf_hub_cache.join("models--someorg--some-model");
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), "cafe").unwrap();
    let msg = loc
        .resolve(Some("someorg/some-model"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("snapshots/cafe") && msg.contains("does not exist"),
        "{msg}"
    );

    // A .gguf path that does not exist, and a plain name.
    let msg = loc
        .resolve(Some("nowhere/model.Q4_0.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("GGUF file") && msg.contains("model.Q4_0.gguf"),
        "{msg}"
    );
    let msg = loc.resolve(Some("justaname")).unwrap_err().to_string();
    assert!(msg.contains("not an `org/name` id"), "{msg}");
}

#[test]
fn locations_follow_the_environment_order() {
    // Only checks the pure function of the variables it is given through the process
    // environment of this test binary (nextest runs each test in its own process).
    let loc = Locations::from_env().unwrap();
    if let Some(c) = std::env::var_os("MLX_RS_CACHE") {
        assert_eq!(loc.cache_dir, PathBuf::from(c));
    } else if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        assert_eq!(loc.cache_dir, PathBuf::from(x).join("mlx-rs"));
    } else {
        assert!(
            loc.cache_dir.ends_with(".cache/mlx-rs"),
            "{:?}",
            loc.cache_dir
        );
    }
    if std::env::var_os("HF_HUB_CACHE").is_none() && std::env::var_os("HF_HOME").is_none() {
        assert!(
            loc.hf_hub_cache.ends_with("huggingface/hub"),
            "{:?}",
            loc.hf_hub_cache
        );
    }
}

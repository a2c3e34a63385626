//! Model sources: a repo id in the Hugging Face cache (with its model card carried over).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;

#[test]
fn repo_id_in_the_hf_cache_converts_with_the_source_card_and_base_model() {
    let tmp = temp_dir("hfcache");
    let hub = tmp.join("hub");
    let repo = hub.join("models--tiny-org--tiny-llama");
    let snap = repo.join("snapshots/0123abcd");
    golden_source("llama-small-f32-tied", &snap);
    std::fs::write(
        snap.join("README.md"),
        "---\nlicense: mit\ntags:\n- text\n---\n# Tiny\n",
    )
    .unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    // SAFETY: nextest runs each test in its own process; nothing else reads the env here.
    unsafe { std::env::set_var("HF_HUB_CACHE", &hub) };
    let out = tmp.join("out");
    let mut o = options(
        std::path::Path::new("tiny-org/tiny-llama"),
        &out,
        &["-q", "--q-group-size", "32"],
    );
    o.hf_path = "tiny-org/tiny-llama".into();
    let report = mlx_quant::convert(&o).unwrap();
    assert_eq!(report.source_dir, snap);
    assert_eq!(
        std::fs::read_to_string(out.join("README.md")).unwrap(),
        "---\nlicense: mit\ntags:\n- text\n- mlx\nbase_model: tiny-org/tiny-llama\n\
         library_name: mlx\npipeline_tag: text-generation\n---\n"
    );
    assert!(out.join("generation_config.json").is_file());
    assert_eq!(json(&out.join("config.json"))["eos_token_id"], 2);
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn unknown_model_spec_names_the_places_looked() {
    let tmp = temp_dir("nomodel");
    // SAFETY: nextest runs each test in its own process, and this one starts no threads
    // before setting the variable.
    unsafe { std::env::set_var("HF_HUB_CACHE", tmp.join("hub")) };
    let err = mlx_quant::convert(&options(
        std::path::Path::new("nobody/nothing"),
        &tmp.join("out"),
        &[],
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("nobody/nothing") && err.contains("Hugging Face cache"),
        "{err}"
    );
    assert!(!tmp.join("out").exists());
    std::fs::remove_dir_all(&tmp).unwrap();
}

//! A SentencePiece (`tokenizer.ggml.model = llama`) vocabulary becomes a tokenizer.json that
//! gives SentencePiece's own ids. The vocabulary comes from a small model trained by
//! `xtask/py/gguf_check.py spm-fixture` (needs a Python with sentencepiece and mlx-lm:
//! `$MLX_LM_PYTHON`, else the workspace `.venv`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_gguf::{import_gguf, ImportOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn python(args: &[&std::ffi::OsStr]) -> String {
    let py = std::env::var_os("MLX_LM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    assert!(
        py.exists(),
        "no Python with mlx-lm at {} (set MLX_LM_PYTHON)",
        py.display()
    );
    let out = Command::new(&py)
        .arg(workspace().join("xtask/py/gguf_check.py"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

#[test]
fn sentencepiece_vocabulary_tokenizes_like_sentencepiece() {
    let tmp = TempDir::new("spm");
    let fx_dir = tmp.path().join("fx");
    python(&["spm-fixture".as_ref(), fx_dir.as_os_str()]);
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string(fx_dir.join("spm.json")).unwrap()).unwrap();
    let strs = |k: &str| {
        fx[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let tokens = strs("tokens");
    let scores: Vec<f32> = fx["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let types: Vec<i32> = fx["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();

    let mut kvs = tiny_llama_kvs("llama");
    kvs.retain(|(k, _)| !k.starts_with("tokenizer.ggml."));
    kvs.extend([
        ("tokenizer.ggml.model", Kv::Str("llama".into())),
        ("tokenizer.ggml.tokens", Kv::Strs(tokens.clone())),
        ("tokenizer.ggml.scores", Kv::F32s(scores)),
        ("tokenizer.ggml.token_type", Kv::I32s(types)),
        ("tokenizer.ggml.bos_token_id", Kv::U32(1)),
        ("tokenizer.ggml.eos_token_id", Kv::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Kv::U32(0)),
    ]);
    let tensors: Vec<Tensor> = tiny_weights_n("llama", 8, None, tokens.len())
        .iter()
        .map(encode)
        .collect();
    let gguf = tmp.path().join("spm.gguf");
    std::fs::write(&gguf, gguf_bytes(&kvs, &tensors)).unwrap();
    let out = tmp.path().join("model");
    let report = import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
    assert_eq!(report.tokenizer_model, "llama");

    // The Rust tokenizers crate (what mlx-tokenizer uses) on the produced tokenizer.json.
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    for (text, want) in strs("texts").iter().zip(fx["ids"].as_array().unwrap()) {
        let want: Vec<u32> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text.as_str(), true).unwrap().get_ids().to_vec();
        assert_eq!(
            got[0], 1,
            "BOS first (add_bos_token defaults to true for SentencePiece)"
        );
        assert_eq!(&got[1..], &want[..], "{text:?}");
        assert_eq!(tok.decode(&got, true).unwrap(), *text);
    }
    let think = tok.encode("a<think>b", false).unwrap();
    assert!(
        think.get_ids().contains(&3),
        "user-defined token kept whole: {:?}",
        think.get_tokens()
    );

    // And the tokenizer mlx-lm builds from the directory (transformers), with its SPM
    // streaming detokenizer.
    let text = python(&[
        "spm-compare".as_ref(),
        out.as_os_str(),
        fx_dir.join("spm.json").as_os_str(),
    ]);
    assert!(
        text.contains("\"ok\": true") && text.contains("SPMStreamingDetokenizer"),
        "{text}"
    );
}

//! Corrupt inputs and invalid options fail clearly, and a failed conversion leaves
//! nothing behind; sharded output loads back.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_quant::{convert, QuantError};
use std::path::Path;

fn source(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let tmp = temp_dir(tag);
    let src = tmp.join("src");
    golden_source("llama-small-f32-tied", &src);
    (tmp, src)
}

/// Runs a conversion expected to fail; checks nothing but `src` is left in `tmp`.
fn fails(tmp: &Path, src: &Path, flags: &[&str]) -> String {
    let out = tmp.join("out");
    let err = convert(&options(src, &out, flags)).unwrap_err().to_string();
    let left: Vec<String> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "src")
        .collect();
    assert!(left.is_empty(), "a failed convert left {left:?}");
    err
}

fn write_safetensors(path: &Path, header: &str, data_len: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, data_len));
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn truncated_safetensors_names_the_file_and_tensor() {
    let (tmp, src) = source("trunc");
    let f = src.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let err = fails(&tmp, &src, &["-q", "--q-group-size", "32"]);
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn wrong_header_length_is_reported() {
    let (tmp, src) = source("hlen");
    let f = src.join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&f, &bytes).unwrap();
    let err = fails(&tmp, &src, &[]);
    assert!(err.contains("header length"), "{err}");
    // A header length inside the file that cuts the JSON short.
    bytes[..8].copy_from_slice(&10u64.to_le_bytes());
    std::fs::write(&f, &bytes).unwrap();
    let err = fails(&tmp, &src, &[]);
    assert!(err.contains("corrupt header"), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn index_naming_a_missing_shard_is_reported() {
    let (tmp, src) = source("index");
    std::fs::write(
        src.join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let err = fails(&tmp, &src, &[]);
    assert!(
        err.contains("model-00002-of-00002.safetensors") && err.contains("model.norm.weight"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn unknown_dtype_and_bad_sizes_are_reported() {
    let (tmp, src) = source("dtype");
    let f = src.join("model.safetensors");
    write_safetensors(
        &f,
        r#"{"model.norm.weight": {"dtype": "F12", "shape": [32], "data_offsets": [0, 128]}}"#,
        128,
    );
    let err = fails(&tmp, &src, &[]);
    assert!(
        err.contains("unknown dtype `F12`") && err.contains("model.norm.weight"),
        "{err}"
    );
    write_safetensors(
        &f,
        r#"{"model.norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 64]}}"#,
        64,
    );
    let err = fails(&tmp, &src, &[]);
    assert!(err.contains("expected 128"), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn pickle_only_checkpoints_are_refused() {
    let tmp = temp_dir("pickle");
    let src = tmp.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    std::fs::write(src.join("pytorch_model.bin"), b"not really").unwrap();
    let err = convert(&options(&src, &tmp.join("out"), &[])).unwrap_err();
    assert!(matches!(err, QuantError::PickleWeights { .. }), "{err}");
    assert!(err.to_string().contains("pytorch_model.bin"));
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn existing_output_and_conflicting_options_are_refused() {
    let (tmp, src) = source("opts");
    std::fs::create_dir_all(tmp.join("taken")).unwrap();
    let err = convert(&options(&src, &tmp.join("taken"), &[])).unwrap_err();
    assert!(matches!(err, QuantError::OutputExists { .. }), "{err}");
    std::fs::remove_dir_all(tmp.join("taken")).unwrap();
    let err = fails(&tmp, &src, &["-q", "-d"]);
    assert!(err.contains("either quantize or dequantize"), "{err}");
    let err = fails(
        &tmp,
        &src,
        &["-q", "--q-mode", "mxfp4", "--quant-predicate", "mixed_3_6"],
    );
    assert!(err.contains("only support 'affine'"), "{err}");
    let err = fails(&tmp, &src, &["-q", "--q-bits", "7", "--q-group-size", "32"]);
    assert!(err.contains("model."), "the failing layer is named: {err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn model_predicate_group_size_that_does_not_divide_fails_like_mlx_lm() {
    // qwen3_moe keeps its router at 8 bits with group size 64; hidden size 32 cannot be
    // grouped by 64, and mlx-lm refuses this conversion too.
    let tmp = temp_dir("moe");
    let src = tmp.join("src");
    golden_source("qwen3_moe-small-f32", &src);
    let err = fails(&tmp, &src, &["-q", "--q-group-size", "32"]);
    assert!(err.contains("mlp.gate") && err.contains("64"), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn sharded_output_has_an_index_and_loads_back() {
    let (tmp, src) = source("shards");
    let out = tmp.join("out");
    let mut o = options(&src, &out, &["-q", "--q-group-size", "32"]);
    o.max_shard_bytes = 8 << 10;
    let report = convert(&o).unwrap();
    let n = report.weights.shards.len();
    assert!(n > 2, "{n} shards");
    assert_eq!(
        report.weights.shards[0],
        format!("model-00001-of-{n:05}.safetensors")
    );
    let index = json(&out.join("model.safetensors.index.json"));
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), report.weights.tensors);
    for (tensor, file) in map {
        let (t, _) = mlx_array::io::load_safetensors(out.join(file.as_str().unwrap())).unwrap();
        assert!(t.contains_key(tensor), "{tensor} not in {file}");
    }
    // Same tensors as a single-shard conversion; the model loads with its quantization.
    let single = tmp.join("single");
    convert(&options(&src, &single, &["-q", "--q-group-size", "32"])).unwrap();
    let (a, b) = (tensors(&out), tensors(&single));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let (_, cfg) = mlx_models::load_model(&out).unwrap();
    assert_eq!(cfg.quantization.unwrap().default.group_size, 32);
    let (meta_a, meta_b) = (
        json(&out.join("model.safetensors.index.json"))["metadata"].clone(),
        json(&single.join("model.safetensors.index.json"))["metadata"].clone(),
    );
    assert_eq!(meta_a, meta_b);
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn shards_carry_mlx_format_metadata() {
    let (tmp, src) = source("meta");
    let out = tmp.join("out");
    convert(&options(&src, &out, &["--dtype", "bfloat16"])).unwrap();
    let (t, meta) = mlx_array::io::load_safetensors(out.join("model.safetensors")).unwrap();
    assert_eq!(meta.get("format").map(String::as_str), Some("mlx"));
    assert!(t.values().all(|a| a.dtype() == mlx_array::Dtype::Bfloat16));
    std::fs::remove_dir_all(&tmp).unwrap();
}

//! Loading checkpoint directories: round trips, quantized checkpoints, and errors that
//! name what is wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;
use common::{max_diff, random_model, scratch, tiny, tokens};
use mlx_array::quant::QuantMode;
use mlx_array::{io, Array, Dtype};
use mlx_models::{load_model, load_model_with, Error, LoadOptions};
use mlx_nn::{quantize_module, Module, QuantSpec};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

fn write_checkpoint(dir: &Path, config: &Value, weights: &BTreeMap<String, Array>) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    io::save_safetensors(
        dir.join("model.safetensors"),
        weights.iter().map(|(k, v)| (k.as_str(), v)),
        [("format", "mlx")],
    )
    .unwrap();
}

fn llama_checkpoint(name: &str) -> (tempfile::TempDir, BTreeMap<String, Array>) {
    let dir = scratch(name);
    let m = random_model(&tiny("llama"), 11);
    let w: BTreeMap<String, Array> = m.parameters().into_iter().collect();
    write_checkpoint(dir.path(), &tiny("llama"), &w);
    (dir, w)
}

fn load_err(dir: &Path) -> String {
    match load_model(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_saved_checkpoint_loads_back_with_the_same_logits() {
    let (tmp, w) = llama_checkpoint("roundtrip");
    let dir = tmp.path();
    let mut m = mlx_models::build_model(&tiny("llama")).unwrap();
    m.load_weights(w, true).unwrap();
    let t = tokens(&[&[1, 2, 3, 4]]);
    let (loaded, cfg) = load_model(dir).unwrap();
    assert_eq!(cfg.model_type, "llama");
    assert_eq!(loaded.model_type(), "llama");
    let a = m.forward(&t, &mut []).unwrap();
    let b = loaded.forward(&t, &mut []).unwrap();
    assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
}

#[test]
fn a_missing_tensor_is_named() {
    let (tmp, mut w) = llama_checkpoint("missing");
    let dir = tmp.path();
    w.remove("model.layers.1.mlp.up_proj.weight");
    write_checkpoint(dir, &tiny("llama"), &w);
    let e = load_err(dir);
    assert!(
        e.contains("missing") && e.contains("model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
}

#[test]
fn an_unexpected_tensor_is_named() {
    let (tmp, mut w) = llama_checkpoint("unexpected");
    let dir = tmp.path();
    w.insert(
        "model.layers.0.self_attn.q_proj.bias".into(),
        Array::from_slice(&[0f32; 32], &[32]).unwrap(),
    );
    write_checkpoint(dir, &tiny("llama"), &w);
    let e = load_err(dir);
    assert!(e.contains("model.layers.0.self_attn.q_proj.bias"), "{e}");
}

#[test]
fn a_wrongly_shaped_tensor_is_named_with_both_shapes() {
    let (tmp, mut w) = llama_checkpoint("shape");
    let dir = tmp.path();
    w.insert(
        "model.norm.weight".into(),
        Array::from_slice(&[1f32; 31], &[31]).unwrap(),
    );
    write_checkpoint(dir, &tiny("llama"), &w);
    let e = load_err(dir);
    assert!(
        e.contains("model.norm.weight") && e.contains("[32]") && e.contains("[31]"),
        "{e}"
    );
}

#[test]
fn an_unknown_model_type_lists_the_supported_ones() {
    let (tmp, w) = llama_checkpoint("unknown");
    let dir = tmp.path();
    let mut c = tiny("llama");
    c["model_type"] = json!("not_a_model");
    write_checkpoint(dir, &c, &w);
    let e = load_err(dir);
    for t in [
        "not_a_model",
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma3_text",
        "mixtral",
        "phi3",
        // Issue 26, wave 2 part B.
        "phi",
        "gpt2",
        "stablelm",
    ] {
        assert!(e.contains(t), "{t} not in: {e}");
    }
}

#[test]
fn a_missing_config_key_is_named() {
    let (tmp, w) = llama_checkpoint("nokey");
    let dir = tmp.path();
    let mut c = tiny("llama");
    c.as_object_mut().unwrap().remove("num_hidden_layers");
    write_checkpoint(dir, &c, &w);
    let e = load_err(dir);
    assert!(
        e.contains("num_hidden_layers") && e.contains("config.json"),
        "{e}"
    );
}

#[test]
fn a_mistyped_config_key_is_named() {
    let (tmp, w) = llama_checkpoint("badkey");
    let dir = tmp.path();
    let mut c = tiny("llama");
    c["rms_norm_eps"] = json!("small");
    write_checkpoint(dir, &c, &w);
    let e = load_err(dir);
    assert!(e.contains("rms_norm_eps"), "{e}");
}

#[test]
fn malformed_json_names_the_file() {
    let (tmp, _) = llama_checkpoint("badjson");
    let dir = tmp.path();
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"llama\",").unwrap();
    let e = load_err(dir);
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn a_truncated_weight_file_names_the_file_and_a_tensor() {
    let (tmp, _) = llama_checkpoint("truncated");
    let dir = tmp.path();
    let f = dir.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(dir);
    assert!(
        e.contains("model.safetensors") && e.contains("tensor `") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn a_corrupt_header_names_the_file() {
    let (tmp, _) = llama_checkpoint("corrupt");
    let dir = tmp.path();
    let f = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[8] = b'#';
    std::fs::write(&f, &bytes).unwrap();
    let e = load_err(dir);
    assert!(
        e.contains("model.safetensors") && e.contains("corrupt header"),
        "{e}"
    );
}

#[test]
fn no_weight_files_is_an_error() {
    let (tmp, _) = llama_checkpoint("noweights");
    let dir = tmp.path();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = load_err(dir);
    assert!(e.contains("no model*.safetensors"), "{e}");
}

#[test]
fn a_shard_missing_from_the_index_is_named() {
    let (tmp, _) = llama_checkpoint("shards");
    let dir = tmp.path();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let e = load_err(dir);
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("model.norm.weight"),
        "{e}"
    );
}

#[test]
fn tied_heads_drop_a_redundant_lm_head_and_rotary_buffers() {
    let tmp = scratch("tied");
    let dir = tmp.path();
    let mut c = tiny("llama");
    c["tie_word_embeddings"] = json!(true);
    let m = random_model(&c, 12);
    let mut w: BTreeMap<String, Array> = m.parameters().into_iter().collect();
    w.insert(
        "lm_head.weight".into(),
        w["model.embed_tokens.weight"].clone(),
    );
    w.insert(
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        Array::from_slice(&[1f32; 4], &[4]).unwrap(),
    );
    write_checkpoint(dir, &c, &w);
    let (loaded, _) = load_model(dir).unwrap();
    let names = loaded.as_module().unwrap().parameter_shapes();
    assert!(!names.contains_key("lm_head.weight"));
}

fn quantized_checkpoint(name: &str) -> (tempfile::TempDir, Box<dyn mlx_models::Architecture>) {
    let dir = scratch(name);
    let mut m = random_model(&tiny("llama"), 13);
    // 8-bit for the head, 4-bit group 32 elsewhere, embeddings left dense.
    quantize_module(m.as_mut(), &mut |path, _| {
        Ok(match path {
            "model.embed_tokens" => None,
            "lm_head" => Some(QuantSpec::new(Some(32), Some(8), QuantMode::Affine)),
            _ => Some(QuantSpec::new(Some(32), Some(4), QuantMode::Affine)),
        })
    })
    .unwrap();
    let mut c = tiny("llama");
    c["quantization"] = json!({"group_size": 64, "bits": 4, "lm_head": {"group_size": 32, "bits": 8},
                               "model.embed_tokens": false});
    write_checkpoint(dir.path(), &c, &m.parameters().into_iter().collect());
    (dir, m)
}

#[test]
fn a_quantized_checkpoint_loads_with_per_layer_settings() {
    let (tmp, m) = quantized_checkpoint("quant");
    let dir = tmp.path();
    let (loaded, cfg) = load_model(dir).unwrap();
    let q = cfg.quantization.unwrap();
    assert_eq!(
        q.default,
        QuantSpec::new(Some(64), Some(4), QuantMode::Affine)
    );
    let shapes = loaded.as_module().unwrap().parameter_shapes();
    assert_eq!(shapes["lm_head.weight"], [64, 8]); // 32 inputs at 8 bits
    assert_eq!(shapes["model.layers.0.mlp.up_proj.weight"], [64, 4]); // 4 bits, inferred group 32
    assert_eq!(shapes["model.layers.0.mlp.up_proj.scales"], [64, 1]);
    assert_eq!(shapes["model.embed_tokens.weight"], [64, 32]);
    let t = tokens(&[&[5, 6, 7]]);
    let a = m.forward(&t, &mut []).unwrap();
    let b = loaded.forward(&t, &mut []).unwrap();
    assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
}

#[test]
fn dequantized_loading_gives_dense_float32_layers_with_close_logits() {
    let (tmp, m) = quantized_checkpoint("dequant");
    let dir = tmp.path();
    let opts = LoadOptions {
        dequantize: true,
        ..Default::default()
    };
    let (loaded, _) = load_model_with(dir, &opts).unwrap();
    let shapes = loaded.as_module().unwrap().parameter_shapes();
    assert_eq!(shapes["lm_head.weight"], [64, 32]);
    assert!(!shapes.contains_key("lm_head.scales"));
    let t = tokens(&[&[5, 6, 7]]);
    let a = m.forward(&t, &mut []).unwrap();
    let b = loaded.forward(&t, &mut []).unwrap();
    assert_eq!(b.dtype(), Dtype::Float32);
    assert!(max_diff(&a, &b) < 1e-3, "{}", max_diff(&a, &b));
}

#[test]
fn dequantizing_a_bfloat16_checkpoint_makes_every_parameter_float32() {
    let (tmp, _) = quantized_checkpoint("dequant-bf16");
    let dir = tmp.path();
    // Re-save the checkpoint's floating tensors as bfloat16 (scales and norms).
    let (w, _) = io::load_safetensors(dir.join("model.safetensors")).unwrap();
    let w: BTreeMap<String, Array> = w
        .into_iter()
        .map(|(k, v)| {
            let v = if v.dtype() == Dtype::Float32 {
                v.astype(Dtype::Bfloat16).unwrap()
            } else {
                v
            };
            (k, v)
        })
        .collect();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    write_checkpoint(dir, &config, &w);
    let opts = LoadOptions {
        dequantize: true,
        ..Default::default()
    };
    let (loaded, _) = load_model_with(dir, &opts).unwrap();
    for (name, p) in loaded.as_module().unwrap().parameters() {
        assert_eq!(p.dtype(), Dtype::Float32, "{name}");
    }
}

#[test]
fn dequantize_leaves_a_checkpoint_that_is_not_quantized_in_its_dtype() {
    // The CPU default (`dequantize: true`) is for quantized checkpoints; a bf16 model
    // keeps bf16, the arithmetic mlx-lm runs.
    let (tmp, w) = llama_checkpoint("dequant-dense-bf16");
    let dir = tmp.path();
    let w: BTreeMap<String, Array> = w
        .into_iter()
        .map(|(k, v)| (k, v.astype(Dtype::Bfloat16).unwrap()))
        .collect();
    write_checkpoint(dir, &tiny("llama"), &w);
    let opts = LoadOptions {
        dequantize: true,
        ..Default::default()
    };
    let (loaded, _) = load_model_with(dir, &opts).unwrap();
    for (name, p) in loaded.as_module().unwrap().parameters() {
        assert_eq!(p.dtype(), Dtype::Bfloat16, "{name}");
    }
}

#[test]
fn the_dtype_option_casts_floating_parameters() {
    let (tmp, _) = llama_checkpoint("dtype");
    let dir = tmp.path();
    let opts = LoadOptions {
        dtype: Some(Dtype::Bfloat16),
        ..Default::default()
    };
    let (loaded, _) = load_model_with(dir, &opts).unwrap();
    let y = loaded.forward(&tokens(&[&[1, 2]]), &mut []).unwrap();
    assert_eq!(y.dtype(), Dtype::Bfloat16);
}

#[test]
fn an_unsupported_legacy_quant_method_is_named() {
    let (tmp, w) = llama_checkpoint("awq");
    let dir = tmp.path();
    let mut c = tiny("llama");
    c["quantization_config"] = json!({"quant_method": "awq", "bits": 4});
    write_checkpoint(dir, &c, &w);
    let e = load_err(dir);
    assert!(e.contains("awq"), "{e}");
    assert!(matches!(load_model(dir), Err(Error::Quantization(_))));
}

/// A Mamba-2 checkpoint as many are published (`"time_step_limit": [0.0, Infinity]`,
/// which Python's json reads and mlx-lm runs): it loads, and its logits are those of
/// the same weights with a finite limit no time step reaches.
#[test]
fn a_config_with_python_infinity_loads_as_mlx_lm_reads_it() {
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models/mamba2-small-f32");
    let text = std::fs::read_to_string(golden.join("config.json")).unwrap();
    let weights = std::fs::read(golden.join("model.safetensors")).unwrap();
    let limit = "[\n    0.001,\n    100.0\n  ]";
    assert!(text.contains(limit), "{text}");
    let run = |name: &str, limit_text: &str| {
        let dir = scratch(name);
        std::fs::write(
            dir.path().join("config.json"),
            text.replace(limit, limit_text),
        )
        .unwrap();
        std::fs::write(dir.path().join("model.safetensors"), &weights).unwrap();
        let (m, cfg) = load_model(dir.path()).unwrap();
        let y = m.forward(&tokens(&[&[1, 2, 3, 4, 5]]), &mut []).unwrap();
        (cfg.raw["time_step_limit"].clone(), y.to_bytes().unwrap())
    };
    let (inf, a) = run("infinity", "[0.0, Infinity]");
    assert_eq!(inf[1].as_f64(), Some(mlx_models::config::JSON_INFINITY));
    let (_, b) = run("finite", "[0.0, 1e30]");
    assert_eq!(a, b);
    let dir = scratch("nan");
    std::fs::write(
        dir.path().join("config.json"),
        text.replace(limit, "[0.0, NaN]"),
    )
    .unwrap();
    std::fs::write(dir.path().join("model.safetensors"), &weights).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("config.json") && e.contains("NaN at line"),
        "{e}"
    );
}

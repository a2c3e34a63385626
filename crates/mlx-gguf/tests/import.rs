//! End-to-end import of synthetic GGUF files written from the spec (see `common`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_array::quant::{dequantize, QuantMode};
use mlx_array::{Array, Dtype};
use mlx_gguf::{import_gguf, GgufError, ImportOptions, QuantSpec};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

fn load_dir(dir: &Path) -> BTreeMap<String, Array> {
    mlx_array::io::load_safetensors(dir.join("model.safetensors"))
        .unwrap()
        .0
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The values the output holds for an HF weight (dequantized when quantized).
fn output_values(arrays: &BTreeMap<String, Array>, hf_name: &str) -> Vec<f32> {
    let module = hf_name.trim_end_matches(".weight");
    let w = &arrays[hf_name];
    let out = match arrays.get(&format!("{module}.scales")) {
        Some(scales) => {
            let in_dim = scales.shape()[1] * 32; // group size 32
            let bits = w.shape()[1] * 32 / in_dim;
            dequantize(
                w,
                scales,
                arrays.get(&format!("{module}.biases")),
                Some(32),
                Some(bits),
                QuantMode::Affine,
                None,
            )
            .unwrap()
        }
        None => w.clone(),
    };
    out.astype(Dtype::Float32)
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn import_restores_hf_names_values_and_qk_row_order() {
    let tmp = TempDir::new("values");
    let (gguf, weights) = write_tiny_llama(tmp.path(), 8, Some(0));
    let out = tmp.path().join("model");
    let report = import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
    assert_eq!(report.arch, "llama");
    assert_eq!(
        report.quantization,
        Some(QuantSpec {
            group_size: 32,
            bits: 4
        })
    );
    assert_eq!(report.tensors.len(), weights.len());
    let arrays = load_dir(&out);
    for w in &weights {
        let got = output_values(&arrays, &w.hf_name);
        // What llama.cpp would compute from the stored blocks, rows back in HF order.
        let stored = dequant(w.ggml_type, &encode(w).data);
        let mut want = stored.clone();
        if w.permute_heads > 0 {
            // Invert the permutation by permuting a row index vector.
            let idx: Vec<f32> = (0..w.rows).map(|r| r as f32).collect();
            let perm = permute_rows(&idx, w.permute_heads, 1);
            for (dst, src) in perm.iter().enumerate() {
                let src = *src as usize;
                want[src * w.cols..(src + 1) * w.cols]
                    .copy_from_slice(&stored[dst * w.cols..(dst + 1) * w.cols]);
            }
        }
        let d = max_diff(&got, &want);
        assert!(d <= 2e-3, "{}: max diff {d}", w.hf_name);
        if w.ggml_type == 0 {
            // F32 is carried bit for bit, and its rows are the original HF rows.
            assert_eq!(got, w.values, "{}", w.hf_name);
        }
    }
    let q = &arrays["model.layers.0.self_attn.q_proj.weight"];
    assert_eq!(q.dtype(), Dtype::Uint32);
    assert_eq!(
        q.shape(),
        vec![(HEADS * HEAD_DIM) as i32, (HIDDEN / 8) as i32]
    );
    assert_eq!(
        arrays["model.layers.0.self_attn.q_proj.scales"].shape(),
        vec![(HEADS * HEAD_DIM) as i32, 2]
    );
    assert!(!arrays.contains_key("model.layers.0.self_attn.k_proj.scales"));
}

#[test]
fn config_describes_the_model_and_per_module_quantization() {
    let tmp = TempDir::new("config");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, Some(0));
    let out = tmp.path().join("model");
    import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
    let c = read_json(&out.join("config.json"));
    assert_eq!(c["model_type"], json!("llama"));
    assert_eq!(c["hidden_size"], json!(HIDDEN));
    assert_eq!(c["num_hidden_layers"], json!(LAYERS));
    assert_eq!(c["intermediate_size"], json!(FFN));
    assert_eq!(c["num_attention_heads"], json!(HEADS));
    assert_eq!(c["num_key_value_heads"], json!(KV_HEADS));
    assert_eq!(c["rms_norm_eps"], json!(1e-5));
    assert_eq!(c["rope_theta"], json!(100000.0));
    assert_eq!(c["max_position_embeddings"], json!(2048));
    assert_eq!(c["vocab_size"], json!(vocab().0.len()));
    assert_eq!(c["tie_word_embeddings"], json!(false));
    assert_eq!(c["rope_scaling"], Value::Null);
    assert!(c.get("head_dim").is_none());
    let q = &c["quantization"];
    assert_eq!(
        (
            q["group_size"].clone(),
            q["bits"].clone(),
            q["mode"].clone()
        ),
        (json!(32), json!(4), json!("affine"))
    );
    let q8 = json!({"group_size": 32, "bits": 8, "mode": "affine"});
    assert_eq!(q["model.embed_tokens"], q8);
    assert_eq!(q["model.layers.1.mlp.up_proj"], q8);
    for unquantized in [
        "lm_head",
        "model.layers.0.self_attn.k_proj",
        "model.layers.1.self_attn.o_proj",
    ] {
        assert_eq!(q[unquantized], json!(false), "{unquantized}");
    }
    assert!(
        q.get("model.layers.0.self_attn.v_proj").is_none(),
        "Q4_0 is the default 4-bit group-32 spec"
    );
    assert_eq!(c["quantization_config"], c["quantization"]);
    let g = read_json(&out.join("generation_config.json"));
    assert_eq!(
        g,
        json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    );
    let index = read_json(&out.join("model.safetensors.index.json"));
    assert_eq!(
        index["weight_map"]["lm_head.weight"],
        json!("model.safetensors")
    );
}

#[test]
fn missing_output_tensor_means_tied_embeddings() {
    let tmp = TempDir::new("tied");
    let (gguf, _) = write_tiny_llama(tmp.path(), 3, None);
    let out = tmp.path().join("model");
    let r = import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
    let c = read_json(&out.join("config.json"));
    assert_eq!(c["tie_word_embeddings"], json!(true));
    assert!(r.tensors.iter().all(|t| t.hf_name != "lm_head.weight"));
    assert!(c["quantization"].get("model.embed_tokens").is_none());
}

#[test]
fn dtype_option_casts_floats_but_not_packed_weights() {
    let tmp = TempDir::new("dtype");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, Some(0));
    let out = tmp.path().join("model");
    let opts = ImportOptions {
        dtype: Some(Dtype::Bfloat16),
        ..Default::default()
    };
    import_gguf(&gguf, &out, &opts).unwrap();
    let a = load_dir(&out);
    assert_eq!(a["model.norm.weight"].dtype(), Dtype::Bfloat16);
    assert_eq!(a["lm_head.weight"].dtype(), Dtype::Bfloat16);
    assert_eq!(a["model.embed_tokens.scales"].dtype(), Dtype::Bfloat16);
    assert_eq!(a["model.embed_tokens.weight"].dtype(), Dtype::Uint32);
    assert_eq!(
        read_json(&out.join("config.json"))["torch_dtype"],
        json!("bfloat16")
    );
}

#[test]
fn tokenizer_files_rebuild_the_byte_level_bpe() {
    let tmp = TempDir::new("tok");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, None);
    let out = tmp.path().join("model");
    import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let (tokens, _, _) = vocab();
    let id = |s: &str| tokens.iter().position(|t| t == s).unwrap() as u32;
    let enc = tok
        .encode("<|im_start|>hello world<|im_end|>", false)
        .unwrap();
    assert_eq!(enc.get_ids(), &[1, id("hello"), id("Ġworld"), 2]);
    // Digits are split one by one (smollm pre-tokenizer) and every byte round-trips.
    let text = "héllo 12 <think> wörld\n\t!";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert!(ids.contains(&id("<think>")));
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let digits = tok.encode("12", false).unwrap();
    assert_eq!(digits.get_ids(), &[id("1"), id("2")]);
    let cfg = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(cfg["bos_token"], json!("<|im_start|>"));
    assert_eq!(cfg["eos_token"], json!("<|im_end|>"));
    assert_eq!(cfg["add_bos_token"], json!(false));
    assert!(cfg["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(cfg["added_tokens_decoder"]["1"]["special"], json!(true));
    assert_eq!(
        cfg["added_tokens_decoder"][id("<think>").to_string()]["special"],
        json!(false)
    );
}

#[test]
fn existing_output_is_refused_or_replaced_without_leftovers() {
    let tmp = TempDir::new("atomic");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, None);
    let out = tmp.path().join("model");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("stale.txt"), "old").unwrap();
    let e = import_gguf(&gguf, &out, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, GgufError::OutputExists { .. }), "{e}");
    assert!(out.join("stale.txt").exists());
    import_gguf(
        &gguf,
        &out,
        &ImportOptions {
            overwrite: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!out.join("stale.txt").exists());
    assert!(out.join("config.json").exists());
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "temporary directories left behind: {names:?}"
    );
}

#[test]
fn small_shard_limit_splits_weights_across_files() {
    let tmp = TempDir::new("shards");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, Some(0));
    let out = tmp.path().join("model");
    let r = import_gguf(
        &gguf,
        &out,
        &ImportOptions {
            max_shard_bytes: 40_000,
            ..Default::default()
        },
    )
    .unwrap();
    let shards: Vec<&String> = r
        .files
        .iter()
        .filter(|f| f.ends_with(".safetensors"))
        .collect();
    assert!(shards.len() > 1, "{shards:?}");
    let index = read_json(&out.join("model.safetensors.index.json"));
    let map = index["weight_map"].as_object().unwrap();
    let mut total = 0;
    for s in &shards {
        let (a, meta) = mlx_array::io::load_safetensors(out.join(s)).unwrap();
        assert_eq!(meta.get("format").map(String::as_str), Some("mlx"));
        for k in a.keys() {
            assert_eq!(map[k], json!(s));
        }
        total += a.len();
    }
    assert_eq!(total, map.len());
}

#[test]
fn qwen_architectures_keep_row_order_and_map_biases_and_norms() {
    for arch in ["qwen2", "qwen3"] {
        let tmp = TempDir::new(arch);
        let (gguf, weights) = write_tiny(tmp.path(), arch, 8, None);
        let out = tmp.path().join("model");
        let r = import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
        assert_eq!(r.model_type, arch);
        let arrays = load_dir(&out);
        for w in weights.iter().filter(|w| w.ggml_type == 0) {
            assert_eq!(
                output_values(&arrays, &w.hf_name),
                w.values,
                "{arch} {}",
                w.hf_name
            );
        }
        let c = read_json(&out.join("config.json"));
        assert_eq!(c["model_type"], json!(arch));
        if arch == "qwen2" {
            assert_eq!(c["attention_bias"], json!(true));
            assert!(arrays.contains_key("model.layers.1.self_attn.v_proj.bias"));
        } else {
            assert_eq!(c["head_dim"], json!(HEAD_DIM));
            assert!(arrays.contains_key("model.layers.0.self_attn.q_norm.weight"));
        }
    }
}

/// mlx-lm's own loader (strict: every parameter present, shapes and quantization
/// matching) accepts the imported directories. Needs a Python with mlx-lm
/// (`$MLX_LM_PYTHON`, else the workspace `.venv`).
#[test]
fn mlx_lm_loads_imported_tiny_models_strictly() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf();
    let python = std::env::var_os("MLX_LM_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| ws.join(".venv/bin/python"));
    assert!(
        python.exists(),
        "no Python with mlx-lm at {} (set MLX_LM_PYTHON)",
        python.display()
    );
    let tmp = TempDir::new("mlxlm");
    let mut dirs = Vec::new();
    for (arch, lm_head) in [
        ("llama", Some(0)),
        ("llama", None),
        ("qwen2", None),
        ("qwen3", Some(8)),
    ] {
        let sub = tmp.path().join(format!("{arch}-{}", lm_head.is_some()));
        std::fs::create_dir_all(&sub).unwrap();
        let (gguf, _) = write_tiny(&sub, arch, 8, lm_head);
        let out = sub.join("model");
        import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
        dirs.push(out);
    }
    let script = "import sys\nfrom pathlib import Path\nimport mlx.core as mx\nfrom mlx_lm.utils import load_model\n\
                  for d in sys.argv[1:]:\n    m, _ = load_model(Path(d), strict=True)\n    \
                  y = m(mx.array([[1, 5, 7]]))\n    mx.eval(y)\n    print(d, y.shape, y.dtype)\n";
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(&dirs)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let vocab = vocab().0.len();
    assert_eq!(
        text.matches(&format!("(1, 3, {vocab})")).count(),
        dirs.len(),
        "{text}"
    );
}

#[test]
fn k_quants_import_as_affine_or_float16_and_bf16_stays_bf16() {
    let tmp = TempDir::new("kquant");
    let weights = tiny_llama_weights(8, None);
    let mut tensors: Vec<Tensor> = weights.iter().map(encode).collect();
    let goldens = goldens();
    let golden = |name: &str| goldens.iter().find(|g| g.name == name).unwrap();
    let mut expected = Vec::new();
    // ffn_down is 64 x 256: 32 copies of a golden's two 256-value rows.
    for (tensor, kind) in [
        ("blk.0.ffn_down.weight", "Q4_K"),
        ("blk.1.ffn_down.weight", "Q6_K"),
    ] {
        let g = golden(kind);
        let t = tensors.iter_mut().find(|t| t.name == tensor).unwrap();
        t.ggml_type = g.ggml_type;
        t.data = g.bytes.repeat(32);
        expected.push((
            tensor
                .replace("blk.", "model.layers.")
                .replace("ffn_down", "mlp.down_proj"),
            g.values.repeat(32),
        ));
    }
    let up = tensors
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_up.weight")
        .unwrap();
    let bf16: Vec<f32> = noise(99, FFN * HIDDEN)
        .iter()
        .map(|v| f32::from_bits(v.to_bits() & 0xffff_0000))
        .collect();
    up.ggml_type = 30;
    up.data = bf16
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let gguf = tmp.path().join("k.gguf");
    std::fs::write(&gguf, gguf_bytes(&tiny_llama_kvs("llama"), &tensors)).unwrap();
    let out = tmp.path().join("model");
    let r = import_gguf(&gguf, &out, &ImportOptions::default()).unwrap();
    let arrays = load_dir(&out);
    let q = &read_json(&out.join("config.json"))["quantization"];
    // Q4_K: 4-bit group-32 affine, the default spec (no per-module entry).
    assert!(q.get("model.layers.0.mlp.down_proj").is_none());
    assert_eq!(
        arrays["model.layers.0.mlp.down_proj.weight"].dtype(),
        Dtype::Uint32
    );
    // Q6_K: dequantized to float16, marked unquantized.
    assert_eq!(q["model.layers.1.mlp.down_proj"], json!(false));
    assert_eq!(
        arrays["model.layers.1.mlp.down_proj.weight"].dtype(),
        Dtype::Float16
    );
    assert!(r
        .tensors
        .iter()
        .any(|t| t.gguf_name == "blk.1.ffn_down.weight" && t.dequantized));
    for (hf, want) in &expected {
        let got = output_values(&arrays, hf);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = max_diff(&got, want);
        assert!(d <= 2e-3 * scale, "{hf}: max diff {d} (scale {scale})");
    }
    assert_eq!(
        arrays["model.layers.0.mlp.up_proj.weight"].dtype(),
        Dtype::Bfloat16
    );
    assert_eq!(
        output_values(&arrays, "model.layers.0.mlp.up_proj.weight"),
        bf16
    );
    assert_eq!(q["model.layers.0.mlp.up_proj"], json!(false));
}

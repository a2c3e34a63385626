//! `mlx-fuse` against `python -m mlx_lm fuse` on the same tiny models and adapters (made
//! here with mlx-lm's own `linear_to_lora_layers`, their B and DoRA magnitudes perturbed
//! so the fuse changes every adapted weight): LoRA and DoRA on dense, 4-bit and
//! mixture-of-experts models, with and without `--dequantize`, and a full fine-tune.
//! The saved weights are the same tensors bit for bit, and config.json is the same.
//! With `--export-gguf`, the GGUF file is mlx-lm's byte for byte (Llama tied and untied,
//! bfloat16 with biases, Mixtral), reads back through mlx-gguf's importer into a model
//! with the fused model's logits, and the models mlx-lm refuses are refused.
mod common;

use common::TempDir;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    common::mlx_lm_python("mlx_lm.fuse")
}

/// A copy of `goldens/models/NAME` with a tokenizer (mlx-lm's fuse loads one).
fn model_with_tokenizer(tmp: &TempDir, name: &str) -> PathBuf {
    let src = common::root().join("goldens/models").join(name);
    let dst = tmp.0.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let tok = common::golden_model("llama-small-f32");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dst.join(f)).unwrap();
    }
    dst
}

use common::check;

use common::tensors;

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn case(model: &str, kind: &str, dequantize: bool) {
    let py = python();
    let tmp = TempDir::new(&format!("fuse-{model}-{kind}-{dequantize}"));
    let m = model_with_tokenizer(&tmp, model);
    let adapters = tmp.0.join("adapters");
    common::make_adapters(&py, &m, &adapters, kind);
    let (ours, theirs) = (tmp.0.join("ours"), tmp.0.join("theirs"));
    let mut args = vec![
        "--model".to_string(),
        m.display().to_string(),
        "--adapter-path".into(),
        adapters.display().to_string(),
        "--save-path".into(),
    ];
    let extra: &[&str] = if dequantize { &["--dequantize"] } else { &[] };
    let mut a_ours = args.clone();
    a_ours.push(ours.display().to_string());
    a_ours.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = a_ours.iter().map(String::as_str).collect();
    let o = common::run(env!("CARGO_BIN_EXE_mlx-fuse"), &refs, b"");
    check(&o, "mlx-fuse");
    args.push(theirs.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let t = Command::new(&py)
        .args(["-m", "mlx_lm", "fuse"])
        .args(&args)
        .current_dir(&tmp.0)
        .output()
        .unwrap();
    check(&t, "mlx_lm fuse");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&t.stdout),
        "printed lines differ"
    );
    let (a, b) = (tensors(&ours), tensors(&theirs));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "tensor names differ"
    );
    let base = tensors(&m);
    let mut changed = 0;
    for (k, (dt, shape, bytes)) in &a {
        let (tdt, tshape, tbytes) = &b[k];
        assert_eq!((dt, shape), (tdt, tshape), "{k}: dtype or shape differ");
        assert!(bytes == tbytes, "{model} {kind}: {k} differs from mlx-lm's");
        if base.get(k).is_none_or(|(_, _, bb)| bb != bytes) {
            changed += 1;
        }
    }
    assert!(changed > 0, "the fuse changed no weight");
    assert_eq!(config(&ours), config(&theirs), "config.json differs");
}

#[test]
fn lora_dense_matches_mlx_lm() {
    case("llama-small-f32-tied", "lora", false);
}

#[test]
fn dora_dense_matches_mlx_lm() {
    case("llama-small-f32-tied", "dora", false);
}

#[test]
fn lora_bf16_matches_mlx_lm() {
    case("qwen3-small-bf16", "lora", false);
}

#[test]
fn lora_4bit_matches_mlx_lm() {
    case("llama-small-q4-g32", "lora", false);
}

#[test]
fn lora_4bit_dequantized_matches_mlx_lm() {
    case("llama-small-q4-g32", "lora", true);
}

#[test]
fn dora_4bit_matches_mlx_lm() {
    case("llama-small-q4-g32", "dora", false);
}

#[test]
fn lora_experts_match_mlx_lm() {
    case("qwen3_moe-small-f32", "lora", false);
}

#[test]
fn full_fine_tune_matches_mlx_lm() {
    case("llama-small-f32-tied", "full", false);
}

#[test]
fn unsupported_flags_and_missing_adapters_fail_in_one_line() {
    let tmp = TempDir::new("fuse-errors");
    let m = model_with_tokenizer(&tmp, "llama-small-f32-tied");
    let save = tmp.0.join("out");
    let base = [
        "--model",
        m.to_str().unwrap(),
        "--save-path",
        save.to_str().unwrap(),
    ];
    for (extra, wanted) in [
        (
            &["--upload-repo", "../x"][..],
            "`../x` is not a valid repo id",
        ),
        (
            &["--adapter-path", "/nonexistent/adapters"][..],
            "/nonexistent/adapters: the adapter path does not exist",
        ),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let o = common::run(env!("CARGO_BIN_EXE_mlx-fuse"), &args, b"");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(wanted) && err.trim().lines().count() == 1,
            "{extra:?}: {err}"
        );
        assert!(!save.exists(), "{extra:?} wrote {}", save.display());
    }
}

/// Runs `mlx-fuse` and `python -m mlx_lm fuse` with `extra` flags on a LoRA of `model`
/// (a directory with a tokenizer), saving to `ours` / `theirs` in `tmp`; checks both
/// succeed and print the same lines.
fn fuse_both(tmp: &TempDir, model: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let py = python();
    let adapters = tmp.0.join("adapters");
    common::make_adapters(&py, model, &adapters, "lora");
    let (ours, theirs) = (tmp.0.join("ours"), tmp.0.join("theirs"));
    let args = |save: &Path| -> Vec<String> {
        [
            "--model",
            model.to_str().unwrap(),
            "--adapter-path",
            adapters.to_str().unwrap(),
            "--save-path",
            save.to_str().unwrap(),
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let a = args(&ours);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = common::run(env!("CARGO_BIN_EXE_mlx-fuse"), &refs, b"");
    check(&o, "mlx-fuse");
    let t = Command::new(&py)
        .args(["-m", "mlx_lm", "fuse"])
        .args(args(&theirs))
        .current_dir(&tmp.0)
        .output()
        .unwrap();
    check(&t, "mlx_lm fuse");
    // The same lines, the save paths apart.
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .replace(ours.to_str().unwrap(), theirs.to_str().unwrap()),
        String::from_utf8_lossy(&t.stdout),
        "printed lines differ"
    );
    (ours, theirs)
}

/// `--export-gguf` (and `extra`) on both sides: the GGUF files are the same bytes.
fn gguf_case(tmp: &TempDir, model: &Path, extra: &[&str], file: &str) -> PathBuf {
    let mut flags = vec!["--export-gguf"];
    flags.extend(extra);
    let (ours, theirs) = fuse_both(tmp, model, &flags);
    let (a, b) = (
        std::fs::read(ours.join(file)).unwrap(),
        std::fs::read(theirs.join(file)).unwrap(),
    );
    assert!(a.starts_with(b"GGUF"), "{file} is not a GGUF file");
    assert!(
        a == b,
        "{}: our GGUF ({} bytes) differs from mlx-lm's ({} bytes)",
        model.display(),
        a.len(),
        b.len()
    );
    ours
}

#[test]
fn export_gguf_untied_matches_mlx_lm_and_reads_back_with_the_same_logits() {
    let tmp = TempDir::new("fuse-gguf-untied");
    let m = tmp.copy_model("llama-small-f32");
    let ours = gguf_case(&tmp, &m, &[], "ggml-model-f16.gguf");

    // Our importer turns the file back into a model that computes what the fused one does.
    let imported = tmp.0.join("imported");
    mlx_gguf::import_gguf(
        &ours.join("ggml-model-f16.gguf"),
        &imported,
        &mlx_gguf::ImportOptions::default(),
    )
    .unwrap();
    let tokens = mlx_array::Array::from_slice(&[1i32, 17, 42, 99, 250, 3], &[1, 6]).unwrap();
    let logits = |dir: &Path| {
        let (model, _) = mlx_models::load_model(dir).unwrap();
        let out = model.forward(&tokens, &mut []).unwrap();
        (out.shape(), out.to_vec::<f32>().unwrap())
    };
    let (fused, back) = (logits(&ours), logits(&imported));
    assert_eq!(fused.0, vec![1, 6, 320]);
    assert_eq!(fused, back, "the imported GGUF computes other logits");
}

#[test]
fn export_gguf_vocabulary_with_added_and_byte_tokens_matches_mlx_lm() {
    // Past the base vocabulary: a plain added token (USER_DEFINED) and a special one
    // (CONTROL, listed in extra_special_tokens); in it, a byte token `<0x0A>` (BYTE).
    let tmp = TempDir::new("fuse-gguf-vocab");
    let m = tmp.copy_model("llama-small-f32");
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(m.join(f)).unwrap()).unwrap()
    };
    let mut tok = read("tokenizer.json");
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    let ten = vocab
        .iter()
        .find(|(_, id)| id.as_u64() == Some(10))
        .map(|(k, _)| k.clone())
        .unwrap();
    vocab.remove(&ten);
    vocab.insert("<0x0A>".into(), 10.into());
    let added = |id: u32, content: &str, special: bool| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": special})
    };
    let list = tok["added_tokens"].as_array_mut().unwrap();
    list.push(added(320, "<extra>", false));
    list.push(added(321, "<ctrl>", true));
    let mut cfg = read("tokenizer_config.json");
    cfg["extra_special_tokens"] = serde_json::json!(["<ctrl>"]);
    for (id, content, special) in [("320", "<extra>", false), ("321", "<ctrl>", true)] {
        let mut t = added(0, content, special);
        t.as_object_mut().unwrap().remove("id");
        cfg["added_tokens_decoder"][id] = t;
    }
    std::fs::write(m.join("tokenizer.json"), tok.to_string()).unwrap();
    std::fs::write(m.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let ours = gguf_case(&tmp, &m, &[], "ggml-model-f16.gguf");
    let (_, meta) = mlx_array::io::load_gguf(ours.join("ggml-model-f16.gguf")).unwrap();
    let Some(mlx_array::io::GgufValue::Array(types)) = meta.get("tokenizer.ggml.token_type") else {
        panic!("no token types");
    };
    let types = types.to_vec::<u32>().unwrap();
    assert_eq!((types[10], types[320], types[321]), (6, 4, 3));
}

#[test]
fn export_gguf_vocabulary_from_tokenizer_json_alone_matches_mlx_lm() {
    // No tokenizer_config.json: transformers' AutoTokenizer builds the tokenizer from
    // tokenizer.json alone and names no special token (its added tokens marked
    // `special` stay NORMAL, no bos/eos ids); ours reads the same from the same file.
    let tmp = TempDir::new("fuse-gguf-tokenizer-json");
    let m = tmp.copy_model("llama-small-f32");
    std::fs::remove_file(m.join("tokenizer_config.json")).unwrap();
    let ours = gguf_case(&tmp, &m, &[], "ggml-model-f16.gguf");
    let (_, meta) = mlx_array::io::load_gguf(ours.join("ggml-model-f16.gguf")).unwrap();
    assert!(!meta.contains_key("tokenizer.ggml.bos_token_id"));
    let Some(mlx_array::io::GgufValue::Array(types)) = meta.get("tokenizer.ggml.token_type") else {
        panic!("no token types");
    };
    assert!(types.to_vec::<u32>().unwrap().iter().all(|&t| t == 1));
}

#[test]
fn export_gguf_vocabulary_with_a_special_tokens_map_matches_mlx_lm() {
    // A tokenizer_config.json without `added_tokens_decoder` next to a
    // special_tokens_map.json (transformers' older layout): the map's tokens are special.
    let tmp = TempDir::new("fuse-gguf-special-map");
    let m = tmp.copy_model("llama-small-f32");
    std::fs::write(
        m.join("tokenizer_config.json"),
        r#"{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    std::fs::write(
        m.join("special_tokens_map.json"),
        r#"{"bos_token": "<|im_start|>", "additional_special_tokens": ["<|endoftext|>"]}"#,
    )
    .unwrap();
    let ours = gguf_case(&tmp, &m, &[], "ggml-model-f16.gguf");
    let (_, meta) = mlx_array::io::load_gguf(ours.join("ggml-model-f16.gguf")).unwrap();
    let Some(mlx_array::io::GgufValue::Array(types)) = meta.get("tokenizer.ggml.token_type") else {
        panic!("no token types");
    };
    assert_eq!(types.to_vec::<u32>().unwrap()[..4], [3, 3, 3, 1]);
}

#[test]
fn export_gguf_tied_with_custom_path_matches_mlx_lm() {
    // MLX appends `.gguf` to a path without it; both print the path as given.
    let tmp = TempDir::new("fuse-gguf-tied");
    let m = model_with_tokenizer(&tmp, "llama-small-f32-tied");
    gguf_case(&tmp, &m, &["--gguf-path", "tied"], "tied.gguf");
}

#[test]
fn export_gguf_bf16_with_biases_matches_mlx_lm() {
    // bfloat16 weights (norms included) become float16; q/k biases are not permuted.
    let tmp = TempDir::new("fuse-gguf-bf16");
    let m = model_with_tokenizer(&tmp, "llama-small-bf16-untied-bias");
    gguf_case(&tmp, &m, &[], "ggml-model-f16.gguf");
}

#[test]
fn export_gguf_mixtral_matches_mlx_lm() {
    let tmp = TempDir::new("fuse-gguf-mixtral");
    let m = model_with_tokenizer(&tmp, "mixtral-small-f32");
    gguf_case(&tmp, &m, &[], "ggml-model-f16.gguf");
}

#[test]
fn export_gguf_dequantized_matches_mlx_lm() {
    let tmp = TempDir::new("fuse-gguf-deq");
    let m = model_with_tokenizer(&tmp, "llama-small-q4-g32");
    gguf_case(&tmp, &m, &["--dequantize"], "ggml-model-f16.gguf");
}

/// `--export-gguf` on a model mlx-lm does not export: both save the fused model, then
/// fail before writing a GGUF file; ours says why in one line.
fn refused(name: &str, generate_model: bool, wanted: &str) {
    let tmp = TempDir::new(&format!("fuse-gguf-refused-{name}"));
    let m = if generate_model {
        tmp.copy_model(name)
    } else {
        model_with_tokenizer(&tmp, name)
    };
    let py = python();
    let adapters = tmp.0.join("adapters");
    common::make_adapters(&py, &m, &adapters, "lora");
    let (ours, theirs) = (tmp.0.join("ours"), tmp.0.join("theirs"));
    let args = |save: &Path| {
        vec![
            "--model".to_string(),
            m.display().to_string(),
            "--adapter-path".into(),
            adapters.display().to_string(),
            "--save-path".into(),
            save.display().to_string(),
            "--export-gguf".into(),
        ]
    };
    let a = args(&ours);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = common::run(env!("CARGO_BIN_EXE_mlx-fuse"), &refs, b"");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{name}: {err}");
    assert!(
        err.contains(wanted) && err.trim().lines().count() == 1,
        "{name}: {err}"
    );
    let t = Command::new(&py)
        .args(["-m", "mlx_lm", "fuse"])
        .args(args(&theirs))
        .current_dir(&tmp.0)
        .output()
        .unwrap();
    assert!(!t.status.success(), "{name}: mlx-lm exported it");
    for dir in [&ours, &theirs] {
        assert!(
            dir.join("config.json").is_file(),
            "{name}: {} not saved",
            dir.display()
        );
        assert!(
            !dir.join("ggml-model-f16.gguf").exists(),
            "{name}: a GGUF was written"
        );
    }
}

#[test]
fn export_gguf_refuses_a_quantized_model_after_saving() {
    refused(
        "llama-small-q4-g32",
        false,
        "Conversion of quantized models is not yet supported",
    );
}

#[test]
fn export_gguf_refuses_other_model_types_after_saving() {
    refused(
        "qwen3-small-bf16",
        true,
        "Model type qwen3 not supported for GGUF conversion",
    );
}

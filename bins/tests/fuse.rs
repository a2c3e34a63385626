//! `mlx-fuse` against `python -m mlx_lm fuse` on the same tiny models and adapters (made
//! here with mlx-lm's own `linear_to_lora_layers`, their B and DoRA magnitudes perturbed
//! so the fuse changes every adapted weight): LoRA and DoRA on dense, 4-bit and
//! mixture-of-experts models, with and without `--dequantize`, and a full fine-tune.
//! The saved weights are the same tensors bit for bit, and config.json is the same.
mod common;

use common::TempDir;
use std::collections::BTreeMap;
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

/// Every tensor of a saved model: name -> (dtype, shape, bytes).
fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<i32>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let (arrays, _) = mlx_array::io::load_safetensors(&p).unwrap();
            for (k, a) in arrays {
                let v = (
                    a.dtype().name().to_string(),
                    a.shape(),
                    a.to_bytes().unwrap(),
                );
                out.insert(k, v);
            }
        }
    }
    assert!(!out.is_empty(), "no weights saved in {}", dir.display());
    out
}

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
        (&["--export-gguf"][..], "--export-gguf is not supported yet"),
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

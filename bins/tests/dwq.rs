//! `mlx-dwq` against mlx-lm's `mlx_lm.dwq` command, both run with the same flags on tiny
//! models and a local dataset directory (rows of real text, tokenized by the models'
//! real tokenizers; read by mlx-lm through `datasets.load_dataset(dir)`): a float32
//! Llama quantized to 4 bits, a bfloat16 Qwen3 quantized to 3 bits with chat rows and
//! gradient checkpointing, a Llama with biased projections, a 210-iteration run (its
//! report lines too), an already quantized student (`--quantized-model`), and
//! precomputed top-1024 targets (`--target-dir`, `--targets-only`, then targets read back
//! with no teacher loaded) on a Llama whose vocabulary holds more than 1024 entries. Every
//! output tensor must be the same bits, the config's quantization sections the same, the
//! target files the same bytes. Bad input is refused with a message naming the problem,
//! nothing written.
mod common;

use common::{assert_same_quantized_model, assert_takes_mlx_lm_flags, check, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ours() -> &'static str {
    env!("CARGO_BIN_EXE_mlx-dwq")
}

/// Runs `cmd` with `args`, offline, with a Hugging Face home of its own under `tmp`
/// (`datasets` keeps its cache there).
fn run_in(tmp: &Path, cmd: &mut Command, args: &[&str]) -> Output {
    cmd.args(args)
        .env("HF_HOME", tmp.join("hf"))
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env_remove("MLX_LOG")
        .output()
        .expect("the command starts")
}

fn run_theirs(py: &Path, tmp: &Path, args: &[&str]) -> Output {
    run_in(tmp, Command::new(py).args(["-m", "mlx_lm", "dwq"]), args)
}

fn run_ours(tmp: &Path, args: &[&str]) -> Output {
    run_in(tmp, &mut Command::new(ours()), args)
}

/// A local dataset directory (`train.jsonl`) of `n` rows of the calibration text's
/// paragraphs, of varied lengths: `text` rows, or `messages` (chat) rows.
fn dataset(dir: &Path, name: &str, n: usize, chat: bool) -> PathBuf {
    let text = std::fs::read_to_string(common::root().join("crates/mlx-quant/src/calibration.txt"))
        .expect("the calibration text");
    let paras: Vec<String> = text
        .split("\n\n")
        .filter(|p| p.len() > 50)
        .map(|p| p.replace('\n', " "))
        .collect();
    assert!(paras.len() >= 8, "{} paragraphs", paras.len());
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let p = &paras[i % paras.len()];
            let cut: String = p.chars().take(40 + (i * 37) % 300).collect();
            if chat {
                serde_json::json!({"messages": [
                    {"role": "user", "content": format!("Row {i}: go on.")},
                    {"role": "assistant", "content": cut},
                ]})
            } else {
                serde_json::json!({ "text": cut })
            }
            .to_string()
        })
        .collect();
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("train.jsonl"), rows.join("\n") + "\n").unwrap();
    d
}

/// The `Validation: it=..., loss=...` lines of a run's output.
fn validation_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Validation: "))
        .map(str::to_string)
        .collect()
}

/// Runs both commands with `args` plus their own `--mlx-path` under `tmp` and asserts
/// the same model comes out; returns our run's output.
fn compare(py: &Path, tmp: &Path, tag: &str, args: &[&str]) -> Output {
    compare_both(py, tmp, tag, args).1
}

/// [`compare`], returning both runs' outputs (mlx-lm's, ours).
fn compare_both(py: &Path, tmp: &Path, tag: &str, args: &[&str]) -> (Output, Output) {
    let (theirs, mine) = (
        tmp.join(format!("{tag}-mlx-lm")),
        tmp.join(format!("{tag}-ours")),
    );
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["--mlx-path", theirs.to_str().unwrap()]);
    let theirs_out = run_theirs(py, tmp, &a);
    check(&theirs_out, &format!("{tag}: mlx_lm dwq"));
    let mut b: Vec<&str> = args.to_vec();
    b.extend(["--mlx-path", mine.to_str().unwrap()]);
    let out = run_ours(tmp, &b);
    check(&out, &format!("{tag}: mlx-dwq"));
    assert_same_quantized_model(&theirs, &mine, tag);
    (theirs_out, out)
}

/// Asserts training moved the validation loss (so the comparison covers trained values,
/// not just a quantization).
fn assert_trained(out: &Output, tag: &str) {
    let v = validation_lines(out);
    assert_eq!(v.len(), 2, "{tag}: {v:?}");
    assert_ne!(
        v[0].split("loss=").nth(1),
        v[1].split("loss=").nth(1),
        "{tag}: the validation loss did not move: {v:?}"
    );
}

#[test]
fn dwq_matches_mlx_lm_dwq_command() {
    let py = common::mlx_lm_python("mlx_lm.quant.dwq");
    let tmp = TempDir::new("dwq");
    let text = dataset(&tmp.0, "text-data", 24, false);
    let chat = dataset(&tmp.0, "chat-data", 22, true);
    let llama = common::golden_model("llama-small-f32");
    let qwen = common::golden_model("qwen3-small-bf16");
    let out = compare(
        &py,
        &tmp.0,
        "llama-f32-q4",
        &[
            "--model",
            llama.to_str().unwrap(),
            "--data-path",
            text.to_str().unwrap(),
            "--num-samples",
            "8",
            "--batch-size",
            "2",
            "--max-seq-length",
            "48",
            "--group-size",
            "32",
            "--learning-rate",
            "1e-3",
        ],
    );
    assert_trained(&out, "llama-f32-q4");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Trainable parameters: "),
        "mlx-lm's report lines: {stdout}"
    );
    let out = compare(
        &py,
        &tmp.0,
        "qwen3-bf16-q3-chat-checkpointed",
        &[
            "-m",
            qwen.to_str().unwrap(),
            "--data-path",
            chat.to_str().unwrap(),
            "--num-samples",
            "10",
            "--batch-size",
            "2",
            "--max-seq-length",
            "40",
            "--bits",
            "3",
            "--group-size",
            "32",
            "--seed",
            "7",
            "--learning-rate",
            "1e-3",
            "--grad-checkpoint",
        ],
    );
    assert_trained(&out, "qwen3-bf16-q3-chat-checkpointed");
    // Biased projections: a quantized layer's `bias` trains too (mlx.nn sets it after
    // freezing the layer).
    let biased = made_llama(
        &py,
        &tmp.0,
        "llama-biased",
        r#"{"attention_bias": true, "mlp_bias": true}"#,
    );
    let (theirs, out) = compare_both(
        &py,
        &tmp.0,
        "llama-biased-q4",
        &[
            "--model",
            biased.to_str().unwrap(),
            "--data-path",
            text.to_str().unwrap(),
            "--num-samples",
            "8",
            "--batch-size",
            "2",
            "--max-seq-length",
            "40",
            "--group-size",
            "32",
            "--learning-rate",
            "1e-3",
        ],
    );
    assert_trained(&out, "llama-biased-q4");
    let trainable = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("Trainable parameters: "))
            .map(str::to_string)
    };
    assert_eq!(trainable(&theirs), trainable(&out));
}

/// The fields of the report lines that do not depend on time or memory: validation
/// lines whole, and `it`, `avg_loss`, `total_tokens` of the lines every 20 iterations.
fn report(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            if l.starts_with("Validation: ") {
                Some(l.to_string())
            } else if l.starts_with("it=") {
                Some(l.split(", ").take(3).collect::<Vec<_>>().join(", "))
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn dwq_long_run_matches_mlx_lm() {
    // 210 iterations of one row: the report every 20 iterations and the validation at
    // iteration 200 run, and Adam's state builds up over many steps.
    let py = common::mlx_lm_python("mlx_lm.quant.dwq");
    let tmp = TempDir::new("dwq-long");
    let text = dataset(&tmp.0, "data", 250, false);
    let llama = common::golden_model("llama-small-f32");
    let (theirs, ours) = compare_both(
        &py,
        &tmp.0,
        "long",
        &[
            "--model",
            llama.to_str().unwrap(),
            "--data-path",
            text.to_str().unwrap(),
            "--num-samples",
            "210",
            "--batch-size",
            "1",
            "--max-seq-length",
            "24",
            "--group-size",
            "32",
            "--learning-rate",
            "1e-3",
        ],
    );
    let (want, got) = (report(&theirs), report(&ours));
    assert_eq!(want.len(), 3 + 10, "{want:?}");
    assert_eq!(want, got);
}

#[test]
fn dwq_of_a_quantized_model_matches_mlx_lm() {
    let py = common::mlx_lm_python("mlx_lm.quant.dwq");
    let tmp = TempDir::new("dwq-quantized");
    let text = dataset(&tmp.0, "data", 24, false);
    let teacher = common::golden_model("llama-small-f32");
    let student = common::golden_model("llama-small-q4-g32");
    let out = compare(
        &py,
        &tmp.0,
        "q4-g32-student",
        &[
            "--model",
            teacher.to_str().unwrap(),
            "--quantized-model",
            student.to_str().unwrap(),
            "--data-path",
            text.to_str().unwrap(),
            "--num-samples",
            "8",
            "--batch-size",
            "2",
            "--max-seq-length",
            "40",
            "--learning-rate",
            "1e-3",
            "--seed",
            "11",
        ],
    );
    assert_trained(&out, "q4-g32-student");
}

/// A float32 Llama made with mlx-lm's class (`mx.random.seed(5)`) from the committed
/// Llama's config with `edits` (a JSON object) merged in, over its tokenizer.
fn made_llama(py: &Path, dir: &Path, name: &str, edits: &str) -> PathBuf {
    let script = r#"
import json, shutil, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama
src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True)
cfg = json.load(open(src / "config.json"))
cfg.update(json.loads(sys.argv[3]))
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(src / f, out / f)
mx.random.seed(5)
m = llama.Model(llama.ModelArgs.from_dict(cfg))
mx.eval(m.parameters())
mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(m.parameters())))
json.dump(cfg, open(out / "config.json", "w"))
"#;
    let out = dir.join(name);
    let made = Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(common::golden_model("llama-small-f32"))
        .arg(&out)
        .arg(edits)
        .output()
        .unwrap();
    check(&made, "making the model with mlx-lm");
    out
}

/// The relative paths and bytes of every file under `dir`.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for split in ["train", "valid"] {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(split))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            out.push((
                format!("{split}/{n}"),
                std::fs::read(dir.join(split).join(&n)).unwrap(),
            ));
        }
    }
    out
}

#[test]
fn dwq_with_precomputed_targets_matches_mlx_lm() {
    let py = common::mlx_lm_python("mlx_lm.quant.dwq");
    let tmp = TempDir::new("dwq-targets");
    let text = dataset(&tmp.0, "data", 24, false);
    // Top-1024 targets need more than 1024 tokens.
    let model = made_llama(&py, &tmp.0, "llama-vocab1100", r#"{"vocab_size": 1100}"#);
    let (t_theirs, t_ours) = (tmp.0.join("targets-mlx-lm"), tmp.0.join("targets-ours"));
    let common_args = [
        "--model",
        model.to_str().unwrap(),
        "--data-path",
        text.to_str().unwrap(),
        "--num-samples",
        "8",
        "--batch-size",
        "2",
        "--max-seq-length",
        "40",
        "--group-size",
        "32",
        "--learning-rate",
        "1e-3",
    ];
    // Targets computed, then trained on, in one run each.
    let (m_theirs, m_ours) = (tmp.0.join("mlx-lm"), tmp.0.join("ours"));
    let mut a = common_args.to_vec();
    a.extend(["--target-dir", t_theirs.to_str().unwrap()]);
    a.extend(["--mlx-path", m_theirs.to_str().unwrap()]);
    check(&run_theirs(&py, &tmp.0, &a), "mlx_lm dwq --target-dir");
    let mut b = common_args.to_vec();
    b.extend(["--target-dir", t_ours.to_str().unwrap()]);
    b.extend(["--mlx-path", m_ours.to_str().unwrap()]);
    let out = run_ours(&tmp.0, &b);
    check(&out, "mlx-dwq --target-dir");
    assert_trained(&out, "targets");
    let (want, got) = (files(&t_theirs), files(&t_ours));
    // 16 validation rows and 8 training rows in batches of 2.
    assert_eq!(want.len(), 12);
    assert_eq!(
        want.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        got.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((n, w), (_, g)) in want.iter().zip(&got) {
        assert!(w == g, "target file {n} differs from mlx-lm's");
    }
    assert_same_quantized_model(&m_theirs, &m_ours, "targets");

    // --targets-only: the same files, no model.
    let only = tmp.0.join("targets-only");
    let no_model = tmp.0.join("no-model");
    let mut c = common_args.to_vec();
    c.extend(["--target-dir", only.to_str().unwrap(), "--targets-only"]);
    c.extend(["--mlx-path", no_model.to_str().unwrap()]);
    check(&run_ours(&tmp.0, &c), "mlx-dwq --targets-only");
    assert!(files(&only) == want, "--targets-only wrote other targets");
    assert!(!no_model.exists(), "--targets-only wrote a model");

    // Targets read back with an already quantized student (mlx-lm's output): no teacher.
    let mut d = common_args.to_vec();
    d.extend(["--quantized-model", m_theirs.to_str().unwrap()]);
    d.extend(["--target-dir", t_theirs.to_str().unwrap()]);
    compare(&py, &tmp.0, "targets-read-back", &d);
}

/// Asserts a run failed with a message holding `needle`, without panicking, and wrote
/// nothing at `path`.
fn assert_refused(out: &Output, needle: &str, path: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {err}");
    assert!(err.contains("mlx-dwq: error:"), "{err}");
    assert!(err.contains(needle), "`{needle}` not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!path.exists(), "{} was written", path.display());
}

#[test]
fn dwq_refuses_bad_input() {
    let tmp = TempDir::new("dwq-errors");
    let text = dataset(&tmp.0, "data", 12, false);
    let llama = common::golden_model("llama-small-f32");
    let out_dir = tmp.0.join("out");
    let targets = tmp.0.join("targets");
    let (m, d, o) = (
        llama.to_str().unwrap(),
        text.to_str().unwrap(),
        out_dir.to_str().unwrap(),
    );
    let base = ["--model", m, "--data-path", d, "--mlx-path", o];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend(extra);
        run_ours(&tmp.0, &a)
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--quantized-model",
                m,
                "--num-samples",
                "4",
                "--batch-size",
                "2",
            ],
            "Quantized model must already be quantized",
        ),
        (vec!["--bits", "7"], "--bits 7"),
        (vec!["--group-size", "48"], "--group-size 48"),
        (
            vec!["--num-samples", "1", "--batch-size", "2"],
            "Dataset must have at least batch_size=2 examples but only has 1.",
        ),
        (vec!["--batch-size", "0"], "--batch-size"),
        // 12 rows: all for training, none for validation.
        (
            vec!["--num-samples", "12", "--batch-size", "2"],
            "only has 0",
        ),
        (
            vec![
                "--num-samples",
                "4",
                "--batch-size",
                "2",
                "--target-dir",
                targets.to_str().unwrap(),
            ],
            "only 320 entries",
        ),
    ];
    for (extra, needle) in &cases {
        assert_refused(&run(extra), needle, &out_dir);
        assert!(!targets.exists(), "{extra:?} left targets");
    }
    let missing = tmp.0.join("no-such-data");
    let mut a = base.to_vec();
    a[3] = missing.to_str().unwrap();
    assert_refused(&run_ours(&tmp.0, &a), "no such directory", &out_dir);
    let file = text.join("train.jsonl");
    a[3] = file.to_str().unwrap();
    assert_refused(&run_ours(&tmp.0, &a), "a file", &out_dir);
    a[3] = "no-org/no-such-dataset";
    assert_refused(&run_ours(&tmp.0, &a), "no-org/no-such-dataset", &out_dir);
    // An architecture no model file covers.
    let odd = tmp.0.join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        std::fs::copy(llama.join(f), odd.join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(llama.join("config.json"))
        .unwrap()
        .replace("\"llama\"", "\"no_such_arch\"");
    std::fs::write(odd.join("config.json"), cfg).unwrap();
    let mut a = base.to_vec();
    a[1] = odd.to_str().unwrap();
    a.extend(["--num-samples", "4", "--batch-size", "2"]);
    assert_refused(&run_ours(&tmp.0, &a), "no_such_arch", &out_dir);
}

#[test]
fn dwq_takes_mlx_lm_flags() {
    let py = common::mlx_lm_python("mlx_lm.quant.dwq");
    assert_takes_mlx_lm_flags(&py, &["-m", "mlx_lm", "dwq"], ours(), &["--version"]);
}

//! `mlx-lora` against live `mlx_lm lora` (the .venv's mlx-lm 0.32.2) on the committed
//! tiny models: for each case the printed train, validation and test losses, the
//! trainable-parameter line, `adapter_config.json`, `adapters.safetensors` and the
//! numbered checkpoints are the same (files byte for byte). mlx-lm runs all cases in
//! one Python process (xtask/py/lora_oracle.py) to keep the cost small.
mod common;

use common::TempDir;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One run: a name and the arguments after `--model M --data D`.
struct Case {
    name: &'static str,
    model: &'static str,
    data: &'static str,
    args: &'static [&'static str],
    /// A YAML config written next to the run (passed as `-c config.yaml`).
    config: Option<&'static str>,
}

const BASE: &[&str] = &[
    "--train",
    "--iters",
    "6",
    "--steps-per-report",
    "2",
    "--steps-per-eval",
    "3",
    "--save-every",
    "4",
    "--val-batches",
    "2",
    "--batch-size",
    "2",
    "--adapter-path",
    "adapters",
    "--num-layers",
    "2",
];

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "lora-adam-text",
            model: "llama-small-f32",
            data: "text",
            args: &["--test", "--test-batches", "2", "--learning-rate", "1e-3"],
            config: None,
        },
        Case {
            name: "lora-4bit-chat-mask",
            model: "llama-small-q4-g32",
            data: "chat",
            args: &["--mask-prompt", "--learning-rate", "2e-3", "--num-layers", "1"],
            config: None,
        },
        Case {
            name: "dora-adamw-completions-schedule",
            model: "llama-small-f32",
            data: "completions",
            args: &["--fine-tune-type", "dora", "--optimizer", "adamw", "--mask-prompt"],
            config: Some(
                "prompt_feature: question\ncompletion_feature: answer\n\
                 lr_schedule:\n  name: cosine_decay\n  arguments: [1e-3, 10, 1e-5]\n  warmup: 2\n\
                 lora_parameters:\n  rank: 4\n  scale: 10.0\n  dropout: 0.0\n\
                 optimizer_config:\n  adamw:\n    weight_decay: 0.05\n",
            ),
        },
        Case {
            name: "full-sgd-accumulation",
            model: "llama-small-f32",
            data: "text",
            args: &[
                "--fine-tune-type",
                "full",
                "--optimizer",
                "sgd",
                "--grad-accumulation-steps",
                "2",
                "--learning-rate",
                "5e-2",
                "--num-layers",
                "1",
            ],
            config: Some("optimizer_config:\n  sgd:\n    momentum: 0.9\n"),
        },
        Case {
            name: "lora-adam-bias-correction-bf16",
            model: "qwen3-small-bf16",
            data: "text",
            args: &["--learning-rate", "1e-3", "--max-seq-length", "24"],
            config: Some("optimizer_config:\n  adam:\n    bias_correction: true\n"),
        },
    ]
}

/// The lines that carry numbers, without rich's colours: the trainable-parameter
/// line, validation and training rows (without tokens/s, a timing), saves, warnings
/// and the test line.
fn numbers(stdout: &str) -> Vec<String> {
    let ansi = |s: &str| {
        let mut out = String::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    let mut out = Vec::new();
    for line in stdout.lines().map(ansi) {
        let t = line.trim();
        let words: Vec<&str> = t.split_whitespace().collect();
        if t.starts_with("Trainable parameters")
            || t.starts_with("Test loss")
            || t.starts_with("[WARNING]")
            || t.starts_with("save ")
        {
            out.push(words.join(" "));
        } else if words.len() >= 3 && words[1] == "val" {
            out.push(format!("{} val {}", words[0], words[2]));
        } else if words.len() >= 5 && (words[2] == "▼" || words[2] == "▲") {
            // iteration, loss, trend, (tok/s), trained tokens
            out.push(format!("{} {} {} {}", words[0], words[1], words[2], words[4]));
        }
    }
    out
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "metrics.jsonl")
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn training_matches_mlx_lm() {
    let py = common::mlx_lm_python("mlx_lm.lora");
    let tmp = TempDir::new("lora-parity");
    let oracle = common::root().join("xtask/py/lora_oracle.py");
    let data = tmp.0.join("data");
    let made = Command::new(&py)
        .arg(&oracle)
        .args(["data", data.to_str().unwrap()])
        .output()
        .unwrap();
    common::check(&made, "making the datasets");
    let cases = cases();
    let args_of = |c: &Case, dir: &Path| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--model".into(),
            common::golden_model(c.model).display().to_string(),
            "--data".into(),
            data.join(c.data).display().to_string(),
        ];
        a.extend(BASE.iter().map(|s| s.to_string()));
        a.extend(c.args.iter().map(|s| s.to_string()));
        if let Some(cfg) = c.config {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("config.yaml"), cfg).unwrap();
            a.extend(["-c".to_string(), "config.yaml".to_string()]);
        }
        a
    };
    let dir = |side: &str, c: &Case| -> PathBuf { tmp.0.join(side).join(c.name) };
    let json: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| serde_json::json!({"cwd": dir("py", c), "args": args_of(c, &dir("py", c))}))
        .collect();
    let cases_file = tmp.0.join("cases.json");
    std::fs::write(&cases_file, serde_json::to_string(&json).unwrap()).unwrap();
    let ran = Command::new(&py)
        .arg(&oracle)
        .args(["run", cases_file.to_str().unwrap()])
        .output()
        .unwrap();
    common::check(&ran, "mlx_lm lora");
    let mut failures = Vec::new();
    for c in &cases {
        let (pd, rd) = (dir("py", c), dir("rs", c));
        if let Ok(e) = std::fs::read_to_string(pd.join("error.txt")) {
            panic!("{}: mlx_lm lora failed:\n{e}", c.name);
        }
        let args = args_of(c, &rd);
        let ours = Command::new(env!("CARGO_BIN_EXE_mlx-lora"))
            .args(&args)
            .current_dir(&rd)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        common::check(&ours, c.name);
        let theirs = std::fs::read_to_string(pd.join("stdout.txt")).unwrap();
        let (a, b) = (numbers(&String::from_utf8_lossy(&ours.stdout)), numbers(&theirs));
        assert!(b.len() >= 4, "{}: mlx-lm printed {theirs}", c.name);
        if a != b {
            failures.push(format!("{}: printed\n ours   {a:?}\n mlx-lm {b:?}", c.name));
        }
        let (pa, ra) = (pd.join("adapters"), rd.join("adapters"));
        let names = files(&pa);
        assert_eq!(files(&ra), names, "{}: adapter files", c.name);
        for n in &names {
            let (x, y) = (std::fs::read(pa.join(n)).unwrap(), std::fs::read(ra.join(n)).unwrap());
            if x != y {
                failures.push(format!("{}: {n} differs", c.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The quality gate of the split attention of a few queries (`MLX_SDPA_SPLIT_QUERIES`,
//! docs/parity.md): on the GPU, attention over 2 to 65 queries (speculative verification,
//! short prompts) runs one query at a time through MLX's decoding kernels instead
//! of a cuDNN plan built for every new shape. Here the same split is forced on the CPU
//! (`MLX_SDPA_SPLIT_QUERIES=force`) for the real default model (SmolLM2-135M-Instruct):
//! perplexity over 32-token windows stays within 0.1% of the exact path, and speculative
//! greedy decoding with the model as its own draft (5 drafts: 6 queries per verification,
//! six single-query attentions) prints the plain greedy text.
mod common;

use std::process::Output;

fn run(bin: &str, args: &[&str], split: &str) -> Output {
    let out = std::process::Command::new(bin)
        .args(args)
        .current_dir(common::root())
        .env("MLX_SDPA_SPLIT_QUERIES", split)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{bin} {args:?} (MLX_SDPA_SPLIT_QUERIES={split}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `Perplexity: X ± Y` of mlx-perplexity's report.
fn perplexity(out: &Output) -> f64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Perplexity: "))
        .unwrap_or_else(|| panic!("no perplexity line in {stdout}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
#[ignore = "slow quality gate of an opt-in path (~2-4 min): cargo nextest run -p mlx-bins --run-ignored only --test dequant_gemm --test sdpa_split"]
fn split_attention_keeps_perplexity_and_greedy_tokens() {
    let model = mlx_hub::default_model().expect("the default model (fetched from PyPI once)");
    let model = model.to_str().unwrap();
    let tmp = common::TempDir::new("sdpa-split");
    let text = std::fs::read_to_string(common::root().join("crates/mlx-quant/src/calibration.txt"))
        .unwrap();
    let rows: Vec<String> = text
        .split("\n\n")
        .filter(|p| p.len() > 200)
        .map(|p| serde_json::json!({ "text": p }).to_string())
        .collect();
    assert!(
        rows.len() >= 4,
        "calibration text has {} paragraphs",
        rows.len()
    );
    let data = tmp.0.join("text.jsonl");
    std::fs::write(&data, rows.join("\n") + "\n").unwrap();
    let data = data.to_str().unwrap();
    let ppl_args = [
        "--model",
        model,
        "--data-path",
        data,
        "--sequence-length",
        "32",
        "--num-samples",
        "8",
        "--batch-size",
        "8",
    ];
    let bin = env!("CARGO_BIN_EXE_mlx-perplexity");
    let exact = perplexity(&run(bin, &ppl_args, "0"));
    let split = perplexity(&run(bin, &ppl_args, "force"));
    let rel = (split - exact).abs() / exact;
    assert!(
        rel < 1e-3,
        "perplexity {split} with split attention, {exact} exact: {:.4}% apart",
        rel * 100.0
    );

    let gen = env!("CARGO_BIN_EXE_mlx-generate");
    let text = |o: &Output| {
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        s.split("==========").nth(1).unwrap_or(&s).to_string()
    };
    for prompt in [
        "What is the capital of France?",
        "Write a haiku about a train in the rain.",
    ] {
        let plain = ["--model", model, "--prompt", prompt, "--max-tokens", "24"];
        let spec = [
            "--model",
            model,
            "--prompt",
            prompt,
            "--max-tokens",
            "24",
            "--draft-model",
            model,
            "--num-draft-tokens",
            "5",
        ];
        let exact = run(gen, &plain, "0");
        let split = run(gen, &spec, "force");
        assert_eq!(
            text(&split),
            text(&exact),
            "greedy text differs for {prompt:?}"
        );
    }
}

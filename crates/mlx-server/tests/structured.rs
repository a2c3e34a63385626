//! Structured output through the server, checked by `xtask/py/structured_clients.py`
//! (the official `openai` / `anthropic` SDKs and Python's `jsonschema` as the
//! independent validator): every answer of a set of schemas validates, alone,
//! streaming and at 32 concurrent requests; regex / choice / Lark / GBNF extensions;
//! the SDKs' Pydantic `parse`; forced tool calls; errors as 400s naming the problem.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use std::time::Duration;

async fn run_checks(base: &str, extra: &[&str]) {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "no Python at {}: run scripts/setup.sh to create the repository's virtual environment",
        python.display()
    );
    let run = tokio::process::Command::new(&python)
        .arg(root.join("xtask/py/structured_clients.py"))
        .args(["--base-url", base])
        .args(extra)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(1500), run)
        .await
        .expect("the structured-output checks timed out")
        .expect("running the checks");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "checks failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("checks passed") && !stdout.contains("FAIL"),
        "{stdout}"
    );
}

/// A tiny random llama over the Qwen3 vocabulary (its template calls tools with
/// `<tool_call>` JSON, so forced tool calls are checked too).
#[tokio::test(flavor = "multi_thread")]
async fn structured_output_validates_with_a_tiny_random_model() {
    let (model, tok) = tiny_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let base = format!("http://{}", server.local_addr());
    run_checks(&base, &["--tools"]).await;
    server.shutdown().await.unwrap();
}

/// The default model (SmolLM2-135M-Instruct): its template has no tool-call format, so
/// forcing a tool is a 400 naming that.
#[tokio::test(flavor = "multi_thread")]
async fn structured_output_validates_with_the_default_model() {
    let (model, tok) = default_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let base = format!("http://{}", server.local_addr());
    run_checks(&base, &[]).await;
    server.shutdown().await.unwrap();
}

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

/// After "a" this grammar wants a character outside Unicode: no token can continue it.
const DEAD_END: &str = "start: \"a\" /[^\\x00-\\U0010FFFF]/\n";

/// A constraint that reaches a dead end finishes the choice with `finish_reason:
/// "error"` (HTTP 200, the text so far), streaming or not, on every endpoint; the
/// server keeps serving; a constraint cut by `max_tokens` is `length`.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_end_constraint_finishes_with_error_not_a_500() {
    let (model, tok) = tiny_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let addr = server.local_addr();
    let chat = serde_json::json!({
        "model": "default_model", "messages": [{"role": "user", "content": "Go."}],
        "max_tokens": 16, "guided_grammar": DEAD_END,
    });
    let r = post(addr, "/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 200, "{}", r.json());
    let c = &r.json()["choices"][0];
    assert_eq!(c["finish_reason"], "error", "{c}");
    assert_eq!(c["message"]["content"], "a", "{c}");

    let mut streamed = chat.clone();
    streamed["stream"] = serde_json::json!(true);
    let mut s = SseStream::open(addr, "/v1/chat/completions", &streamed).await;
    assert_eq!(s.status, 200);
    let (text, finish) = chat_stream_text(&s.collect_data().await);
    assert_eq!((text.as_str(), finish.as_deref()), ("a", Some("error")));

    let comp = serde_json::json!({"model": "default_model", "prompt": "Go", "max_tokens": 16, "guided_grammar": DEAD_END});
    let r = post(addr, "/v1/completions", &comp).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["choices"][0]["finish_reason"], "error");
    assert_eq!(r.json()["choices"][0]["text"], "a");

    let resp = serde_json::json!({"model": "default_model", "input": "Go.", "max_output_tokens": 16, "guided_grammar": DEAD_END});
    let r = post(addr, "/v1/responses", &resp).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["status"], "incomplete", "{}", r.json());
    assert_eq!(r.json()["incomplete_details"]["reason"], "error");

    // Cut by max_tokens before the grammar completes: `length`, as with OpenAI.
    let long = serde_json::json!({
        "model": "default_model", "messages": [{"role": "user", "content": "Go."}],
        "max_tokens": 3, "guided_regex": "[a-z]{20}",
    });
    let r = post(addr, "/v1/chat/completions", &long).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");

    // The server keeps serving constrained requests.
    let ok = serde_json::json!({
        "model": "default_model", "messages": [{"role": "user", "content": "Go."}],
        "max_tokens": 16, "guided_choice": ["yes", "no"],
    });
    let r = post(addr, "/v1/chat/completions", &ok).await;
    let c = &r.json()["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{c}");
    assert!(["yes", "no"].contains(&c["message"]["content"].as_str().unwrap()));
    server.shutdown().await.unwrap();
}

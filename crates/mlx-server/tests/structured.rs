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

/// Forced tool calls through the server in tool-call formats other than `<tool_call>`
/// JSON: the tiny model's tokenizer told (`tool_parser_type`) that its format is
/// another; every answer comes back as a `tool_calls` entry naming the tool, with
/// arguments valid against its schema.
#[tokio::test(flavor = "multi_thread")]
async fn forced_tool_calls_come_back_as_tool_calls_in_every_format() {
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 8},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "unit", "days"], "additionalProperties": false}}}]);
    for format in [
        "qwen3_coder",
        "pythonic",
        "mistral",
        "function_gemma",
        "gemma4",
        "llama3_json",
        "glm47",
        "kimi_k2",
        "minimax_m2",
        "longcat",
        "minicpm5",
        "muse_spark",
        "kimi_k3",
    ] {
        let dir = tempfile::tempdir().unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(tiny_model_dir().join(f), dir.path().join(f)).unwrap();
        }
        let cfg_path = dir.path().join("tokenizer_config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["tool_parser_type"] = serde_json::json!(format);
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let tok = mlx_tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
        let (model, _) = tiny_model();
        let server = start(model, tok, ServerConfig::default()).await;
        let addr = server.local_addr();
        for seed in [7] {
            let body = serde_json::json!({
                "model": "default_model", "messages": [{"role": "user", "content": "Weather?"}],
                "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
                "max_tokens": 200, "temperature": 1.0, "seed": seed,
            });
            let r = post(addr, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "{format}: {}", r.json());
            let c = &r.json()["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{format}: {c}");
            let calls = c["message"]["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 1, "{format}: {c}");
            let f = &calls[0]["function"];
            assert_eq!(f["name"], "get_weather", "{format}: {c}");
            let args: serde_json::Value =
                serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            let o = args.as_object().unwrap();
            assert_eq!(o.len(), 3, "{format}: {args}");
            let city = o["city"].as_str().unwrap();
            assert!((1..=8).contains(&city.chars().count()), "{format}: {args}");
            assert!(["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap()));
            assert!(
                (1..=7).contains(&o["days"].as_i64().unwrap()),
                "{format}: {args}"
            );
        }
        server.shutdown().await.unwrap();
    }
}

/// Requests with the same schema compile it once: the second (and two more at once)
/// reuse the compiled form (`mlx_server_constraint_compiles_total` /
/// `_cache_hits_total`), with the same greedy answer; another schema compiles.
#[tokio::test(flavor = "multi_thread")]
async fn requests_with_one_schema_compile_it_once() {
    let (model, tok) = tiny_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let addr = server.local_addr();
    let schema = serde_json::json!({
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 4, "maxItems": 4,
    });
    let body = |schema: &serde_json::Value| {
        serde_json::json!({
            "model": "default_model", "messages": [{"role": "user", "content": "Digits."}],
            "max_tokens": 32, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": schema}},
        })
    };
    let first = post(addr, "/v1/chat/completions", &body(&schema)).await;
    assert_eq!(first.status, 200, "{}", first.json());
    let answer = first.json()["choices"][0]["message"]["content"].clone();
    let digits: Vec<u32> = serde_json::from_str(answer.as_str().unwrap()).unwrap();
    assert_eq!(digits.len(), 4, "{answer}");
    assert_eq!(
        metric(addr, "mlx_server_constraint_compiles_total").await,
        1.0
    );
    assert_eq!(
        metric(addr, "mlx_server_constraint_cache_hits_total").await,
        0.0
    );

    let again = post(addr, "/v1/chat/completions", &body(&schema)).await;
    assert_eq!(again.json()["choices"][0]["message"]["content"], answer);
    let same = body(&schema);
    let (a, b) = tokio::join!(
        post(addr, "/v1/chat/completions", &same),
        post(addr, "/v1/chat/completions", &same),
    );
    for r in [a, b] {
        assert_eq!(r.json()["choices"][0]["message"]["content"], answer);
    }
    assert_eq!(
        metric(addr, "mlx_server_constraint_compiles_total").await,
        1.0
    );
    assert_eq!(
        metric(addr, "mlx_server_constraint_cache_hits_total").await,
        3.0
    );

    let mut other = schema.clone();
    other["minItems"] = serde_json::json!(2);
    other["maxItems"] = serde_json::json!(2);
    let r = post(addr, "/v1/chat/completions", &body(&other)).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(
        metric(addr, "mlx_server_constraint_compiles_total").await,
        2.0
    );
    server.shutdown().await.unwrap();
}

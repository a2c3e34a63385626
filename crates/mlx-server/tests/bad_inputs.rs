//! Malformed requests get the right 4xx status with an OpenAI-shaped (or, on
//! `/v1/messages`, Anthropic-shaped) error body, and the server stays healthy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};
use std::time::Duration;

enum Body {
    Json(Json),
    Bytes(&'static [u8]),
}

struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: Body,
    status: u16,
}

fn case(name: &'static str, path: &'static str, body: Json, status: u16) -> Case {
    Case {
        name,
        method: "POST",
        path,
        body: Body::Json(body),
        status,
    }
}

fn raw_case(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: &'static [u8],
    status: u16,
) -> Case {
    Case {
        name,
        method,
        path,
        body: Body::Bytes(body),
        status,
    }
}

fn chat(extra: Json) -> Json {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    if let (Some(o), Json::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

const CHAT: &str = "/v1/chat/completions";
const COMPL: &str = "/v1/completions";
const MSGS: &str = "/v1/messages";

fn cases() -> Vec<Case> {
    vec![
        raw_case("truncated JSON", "POST", CHAT, b"{\"messages\": [", 400),
        raw_case("not JSON at all", "POST", CHAT, b"hello", 400),
        raw_case("empty body", "POST", CHAT, b"", 400),
        raw_case(
            "invalid UTF-8",
            "POST",
            CHAT,
            b"{\"messages\": \"\xff\xfe\"}",
            400,
        ),
        raw_case("JSON array body", "POST", CHAT, b"[1, 2]", 400),
        raw_case("JSON string body", "POST", CHAT, b"\"hi\"", 400),
        case("no messages", CHAT, json!({"max_tokens": 3}), 400),
        case(
            "per-request adapters",
            CHAT,
            json!({"messages": [{"role": "user", "content": "hi"}], "adapters": "my-adapters"}),
            400,
        ),
        case(
            "draft model not loaded",
            CHAT,
            chat(json!({"draft_model": "some/draft"})),
            400,
        ),
        case(
            "num_draft_tokens zero",
            CHAT,
            chat(json!({"num_draft_tokens": 0})),
            400,
        ),
        case(
            "num_draft_tokens absurd",
            COMPL,
            json!({"prompt": "hi", "num_draft_tokens": 100000}),
            400,
        ),
        case(
            "prediction of an unknown type",
            CHAT,
            chat(json!({"prediction": {"type": "audio", "content": "hello"}})),
            400,
        ),
        case("messages is a string", CHAT, json!({"messages": "hi"}), 400),
        case("messages is empty", CHAT, json!({"messages": []}), 400),
        case("message is a number", CHAT, json!({"messages": [1]}), 400),
        case(
            "message without role",
            CHAT,
            json!({"messages": [{"content": "hi"}]}),
            400,
        ),
        case(
            "content is a number",
            CHAT,
            json!({"messages": [{"role": "user", "content": 5}]}),
            400,
        ),
        case(
            "image content part",
            CHAT,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            400,
        ),
        case(
            "tool call arguments not JSON",
            CHAT,
            json!({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
            400,
        ),
        case(
            "max_tokens negative",
            CHAT,
            chat(json!({"max_tokens": -5})),
            400,
        ),
        case("max_tokens zero", CHAT, chat(json!({"max_tokens": 0})), 400),
        case(
            "max_tokens huge float",
            CHAT,
            chat(json!({"max_tokens": 1e30})),
            400,
        ),
        case(
            "max_tokens beyond 2^31",
            CHAT,
            chat(json!({"max_tokens": 9_000_000_000_000_000i64})),
            400,
        ),
        case(
            "max_tokens as string",
            CHAT,
            chat(json!({"max_tokens": "10"})),
            400,
        ),
        case(
            "max_completion_tokens negative",
            CHAT,
            chat(json!({"max_completion_tokens": -1})),
            400,
        ),
        case(
            "temperature negative",
            CHAT,
            chat(json!({"temperature": -0.5})),
            400,
        ),
        case(
            "temperature as string",
            CHAT,
            chat(json!({"temperature": "hot"})),
            400,
        ),
        case("top_p above 1", CHAT, chat(json!({"top_p": 1.5})), 400),
        case("top_k negative", CHAT, chat(json!({"top_k": -1})), 400),
        case("top_k fractional", CHAT, chat(json!({"top_k": 2.5})), 400),
        case("min_p above 1", CHAT, chat(json!({"min_p": 2})), 400),
        case(
            "xtc_threshold above 0.5",
            CHAT,
            chat(json!({"xtc_threshold": 0.9, "xtc_probability": 0.5})),
            400,
        ),
        case(
            "repetition_penalty negative",
            CHAT,
            chat(json!({"repetition_penalty": -1})),
            400,
        ),
        case(
            "presence_penalty as string",
            CHAT,
            chat(json!({"presence_penalty": "x"})),
            400,
        ),
        case(
            "frequency_context_size negative",
            CHAT,
            chat(json!({"frequency_context_size": -3})),
            400,
        ),
        case(
            "stream as string",
            CHAT,
            chat(json!({"stream": "yes"})),
            400,
        ),
        case(
            "stream_options not an object",
            CHAT,
            chat(json!({"stream": true, "stream_options": 3})),
            400,
        ),
        case(
            "logprobs as string",
            CHAT,
            chat(json!({"logprobs": "true"})),
            400,
        ),
        case(
            "top_logprobs too large",
            CHAT,
            chat(json!({"logprobs": true, "top_logprobs": 100})),
            400,
        ),
        case(
            "logit_bias key not an int",
            CHAT,
            chat(json!({"logit_bias": {"abc": 1}})),
            400,
        ),
        case(
            "logit_bias value not a number",
            CHAT,
            chat(json!({"logit_bias": {"5": "up"}})),
            400,
        ),
        case(
            "logit_bias not an object",
            CHAT,
            chat(json!({"logit_bias": [1, 2]})),
            400,
        ),
        case("stop is a number", CHAT, chat(json!({"stop": 123})), 400),
        case(
            "stop list of numbers",
            CHAT,
            chat(json!({"stop": [1, 2]})),
            400,
        ),
        case("seed negative", CHAT, chat(json!({"seed": -5})), 400),
        case("n zero", CHAT, chat(json!({"n": 0})), 400),
        case("n huge", CHAT, chat(json!({"n": 1000})), 400),
        case(
            "chat_template_kwargs not an object",
            CHAT,
            chat(json!({"chat_template_kwargs": "x"})),
            400,
        ),
        case(
            "tools not an array",
            CHAT,
            chat(json!({"tools": {"name": "f"}})),
            400,
        ),
        case(
            "tool without a name",
            CHAT,
            chat(json!({"tools": [{"type": "function", "function": {}}]})),
            400,
        ),
        case(
            "tool_choice unknown",
            CHAT,
            chat(json!({"tool_choice": "sometimes"})),
            400,
        ),
        case(
            "tool_choice names a missing tool",
            CHAT,
            chat(
                json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            ),
            400,
        ),
        case(
            "unknown model",
            CHAT,
            chat(json!({"model": "no/such-model"})),
            404,
        ),
        case("model not a string", CHAT, chat(json!({"model": 7})), 400),
        case(
            "prompt longer than the context",
            CHAT,
            json!({"messages": [{"role": "user", "content": "word ".repeat(600)}]}),
            400,
        ),
        case(
            "completions without prompt",
            COMPL,
            json!({"max_tokens": 3}),
            400,
        ),
        case(
            "completions prompt is a number",
            COMPL,
            json!({"prompt": 12}),
            400,
        ),
        case(
            "completions token id out of vocabulary",
            COMPL,
            json!({"prompt": [1, 4_000_000_000u64]}),
            400,
        ),
        case(
            "completions logprobs too large",
            COMPL,
            json!({"prompt": "hi", "logprobs": 50}),
            400,
        ),
        case(
            "completions empty prompt",
            COMPL,
            json!({"prompt": ""}),
            400,
        ),
        case(
            "messages without max_tokens",
            MSGS,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            400,
        ),
        case(
            "messages with a system role",
            MSGS,
            json!({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}),
            400,
        ),
        case(
            "messages with an image block",
            MSGS,
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            400,
        ),
        case(
            "messages with a bad tool_choice",
            MSGS,
            json!({"max_tokens": 5, "tool_choice": {"type": "maybe"}, "messages": [{"role": "user", "content": "hi"}]}),
            400,
        ),
        case(
            "count_tokens without messages",
            "/v1/messages/count_tokens",
            json!({"model": "default_model"}),
            400,
        ),
        case(
            "responses without input",
            "/v1/responses",
            json!({"model": "default_model"}),
            400,
        ),
        case(
            "responses with previous_response_id",
            "/v1/responses",
            json!({"input": "hi", "previous_response_id": "resp_1"}),
            400,
        ),
        case(
            "responses with a non-function tool",
            "/v1/responses",
            json!({"input": "hi", "tools": [{"type": "web_search"}]}),
            400,
        ),
        raw_case("unknown route", "POST", "/v1/engines", b"{}", 404),
        raw_case("GET on a POST route", "GET", CHAT, b"", 405),
        raw_case("POST on a GET route", "POST", "/v1/models", b"{}", 405),
    ]
}

fn check_error_shape(c: &Case, v: &Json) {
    if c.path == MSGS || c.path.starts_with("/v1/messages/") {
        assert_eq!(v["type"], "error", "{}: {v}", c.name);
        assert!(v["error"]["type"].is_string(), "{}: {v}", c.name);
        assert!(v["error"]["message"].is_string(), "{}: {v}", c.name);
    } else {
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{}: {v}",
            c.name
        );
        assert!(v["error"]["type"].is_string(), "{}: {v}", c.name);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_4xx_and_the_server_stays_healthy() {
    let cfg = ServerConfig {
        context_length: Some(512),
        max_request_bytes: 64 * 1024,
        ..Default::default()
    };
    let server = scripted_server(cfg, Duration::ZERO).await;
    let addr = server.local_addr();
    let cases = cases();
    assert!(cases.len() >= 30);
    for c in &cases {
        let bytes = match &c.body {
            Body::Json(j) => j.to_string().into_bytes(),
            Body::Bytes(b) => b.to_vec(),
        };
        let r = request(
            addr,
            c.method,
            c.path,
            &[("Content-Type", "application/json")],
            &bytes,
        )
        .await;
        assert_eq!(
            r.status,
            c.status,
            "{}: {}",
            c.name,
            String::from_utf8_lossy(&r.body)
        );
        check_error_shape(c, &r.json());
    }
    // Transport-level problems.
    let big = vec![b'a'; 70 * 1024];
    let r = request(addr, "POST", CHAT, &[], &big).await;
    assert_eq!(r.status, 413, "body over --max-request-bytes");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = request(addr, "POST", MSGS, &[], &big).await;
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (413, Some("request_too_large"))
    );
    let chunked = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n10010\r\n";
    let mut huge = chunked.to_vec();
    huge.extend(vec![b'a'; 0x10010]);
    huge.extend(b"\r\n0\r\n\r\n");
    assert_eq!(
        raw(addr, &huge).await.status,
        413,
        "chunked body over the limit"
    );
    let bad_len = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: abc\r\n\r\n";
    assert_eq!(raw(addr, bad_len).await.status, 400);

    // Still healthy and serving.
    assert_eq!(get(addr, "/health").await.json()["status"], "ok");
    let ok = post(addr, CHAT, &chat(json!({}))).await;
    assert_eq!(ok.status, 200);
    assert_eq!(
        ok.json()["choices"][0]["message"]["content"],
        "Hello! The answer"
    );
    let errors = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    assert!(errors.contains("route=\"/v1/chat/completions\",status=\"400\""));
    assert!(server.is_healthy());
    server.shutdown().await.unwrap();
}

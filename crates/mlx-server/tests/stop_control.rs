//! vLLM's stopping fields (`min_tokens`, `ignore_eos`, `stop_token_ids`,
//! `include_stop_str_in_output`) on the scripted model, whose answer and EOS are known
//! token by token, and OpenAI's `reasoning_effort` reaching the chat template.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

fn chat(extra: Json) -> Json {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40});
    if let (Some(o), Json::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

fn answer_ids() -> Vec<u32> {
    tokenizer().encode(DEFAULT_ANSWER, false).unwrap()
}

async fn ask(addr: std::net::SocketAddr, body: Json) -> (String, String, u64) {
    let r = post(addr, CHAT, &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let c = &v["choices"][0];
    (
        c["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        c["finish_reason"].as_str().unwrap_or_default().to_string(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_token_ids_end_the_answer_before_that_token() {
    let server = scripted_server(ServerConfig::default(), Duration::ZERO).await;
    let ids = answer_ids();
    let tok = tokenizer();
    let (text, finish, _) = ask(
        server.local_addr(),
        chat(json!({"stop_token_ids": [ids[3]]})),
    )
    .await;
    assert_eq!(text, tok.decode(&ids[..3], false).unwrap());
    assert_eq!(finish, "stop");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn ignore_eos_runs_to_the_token_budget() {
    let server = scripted_server(ServerConfig::default(), Duration::ZERO).await;
    let n = answer_ids().len() as u64 + 5;
    let (text, finish, tokens) = ask(
        server.local_addr(),
        chat(json!({"ignore_eos": true, "max_tokens": n})),
    )
    .await;
    assert!(text.starts_with(DEFAULT_ANSWER), "{text:?}");
    assert_eq!(finish, "length");
    assert_eq!(tokens, n);
    // Without it the same request ends at EOS.
    let (text, finish, _) = ask(server.local_addr(), chat(json!({"max_tokens": n}))).await;
    assert_eq!((text.as_str(), finish.as_str()), (DEFAULT_ANSWER, "stop"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn min_tokens_masks_eos_until_the_answer_is_long_enough() {
    let server = scripted_server(ServerConfig::default(), Duration::ZERO).await;
    let addr = server.local_addr();
    let script = answer_ids().len() as u64;
    for min in [script + 4, script + 1] {
        let (text, finish, tokens) = ask(addr, chat(json!({"min_tokens": min}))).await;
        assert!(text.starts_with(DEFAULT_ANSWER), "{text:?}");
        assert!(text.len() > DEFAULT_ANSWER.len(), "{text:?}");
        assert_eq!(finish, "stop");
        // `min` tokens where EOS was masked, then the EOS (counted as mlx-lm counts it).
        assert_eq!(tokens, min + 1, "min_tokens {min}");
    }
    // A budget below the script: min_tokens changes nothing then.
    let (text, _, tokens) = ask(addr, chat(json!({"min_tokens": 2}))).await;
    assert_eq!((text.as_str(), tokens), (DEFAULT_ANSWER, script + 1));
    // Twice the same prompt: the second is served from the prompt cache, and still
    // counts its tokens from the prompt's end.
    let (_, _, again) = ask(addr, chat(json!({"min_tokens": script + 4}))).await;
    assert_eq!(again, script + 5);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_words_wait_for_min_tokens_and_can_be_kept() {
    let server = scripted_server(ServerConfig::default(), Duration::ZERO).await;
    let addr = server.local_addr();
    let (text, finish, _) = ask(addr, chat(json!({"stop": ["answer"]}))).await;
    assert_eq!((text.as_str(), finish.as_str()), ("Hello! The ", "stop"));
    // "answer" ends within the first few tokens: with a higher minimum it does not stop.
    let (text, finish, _) = ask(addr, chat(json!({"stop": ["answer"], "min_tokens": 8}))).await;
    assert_eq!((text.as_str(), finish.as_str()), (DEFAULT_ANSWER, "stop"));
    // The stop word kept, streamed or not.
    let body = chat(json!({"stop": ["42"], "include_stop_str_in_output": true}));
    let (text, finish, _) = ask(addr, body.clone()).await;
    assert_eq!(
        (text.as_str(), finish.as_str()),
        ("Hello! The answer is 42", "stop")
    );
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let mut s = SseStream::open(addr, CHAT, &streamed).await;
    let (text, finish) = chat_stream_text(&s.collect_data().await);
    assert_eq!(text, "Hello! The answer is 42");
    assert_eq!(finish.as_deref(), Some("stop"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_stop_fields_are_refused_by_name() {
    let server = scripted_server(ServerConfig::default(), Duration::ZERO).await;
    let addr = server.local_addr();
    let vocab = tokenizer().vocab_size();
    for (body, param) in [
        (chat(json!({"stop_token_ids": [-1]})), "stop_token_ids"),
        (chat(json!({"stop_token_ids": "7"})), "stop_token_ids"),
        (
            chat(json!({"stop_token_ids": [vocab + 10]})),
            "stop_token_ids",
        ),
        (chat(json!({"min_tokens": 41})), "min_tokens"),
        (chat(json!({"min_tokens": -1})), "min_tokens"),
        (chat(json!({"ignore_eos": "yes"})), "ignore_eos"),
        (
            chat(json!({"include_stop_str_in_output": 1})),
            "include_stop_str_in_output",
        ),
        (
            chat(json!({"functions": [{"name": "f", "parameters": {}}]})),
            "functions",
        ),
        (chat(json!({"function_call": "auto"})), "function_call"),
        (chat(json!({"use_beam_search": true})), "use_beam_search"),
        (chat(json!({"prompt_logprobs": 1})), "prompt_logprobs"),
        (chat(json!({"modalities": ["text", "audio"]})), "modalities"),
        (
            chat(json!({"audio": {"voice": "alloy", "format": "wav"}})),
            "audio",
        ),
    ] {
        let r = post(addr, CHAT, &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    for (body, param) in [
        (json!({"prompt": "hi", "suffix": "end"}), "suffix"),
        (json!({"prompt": "hi", "best_of": 3}), "best_of"),
    ] {
        let r = post(addr, "/v1/completions", &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    for body in [
        json!({"input": "hi", "background": true}),
        json!({"input": "hi", "truncation": "auto"}),
    ] {
        let r = post(addr, "/v1/responses", &body).await;
        assert_eq!(r.status, 400, "{body}");
    }
    // Harmless values of the same fields, and bookkeeping fields, are served.
    for body in [
        json!({"prompt": "hi", "suffix": "", "best_of": 1, "max_tokens": 3}),
        json!({"prompt": "hi", "n": 2, "best_of": 2, "max_tokens": 3, "user": "u1"}),
    ] {
        let r = post(addr, "/v1/completions", &body).await;
        assert_eq!(r.status, 200, "{body}");
    }
    let r = post(
        addr,
        CHAT,
        &chat(json!({"modalities": ["text"], "store": false, "metadata": {"k": "v"}})),
    )
    .await;
    assert_eq!(r.status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn min_tokens_holds_while_speculating_from_a_prediction() {
    // A real (tiny, random) model, whose every position has its own logits, with EOS
    // pushed to the top: the answer is `min_tokens` tokens and then EOS, with or without
    // drafts from a predicted output, accepted or not.
    let (model, tok) = tiny_model();
    let eos = *tok.eos_token_ids().iter().min().unwrap();
    let server = start(model, tok, ServerConfig::default()).await;
    let addr = server.local_addr();
    let base = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30,
        "min_tokens": 12, "logit_bias": {eos.to_string(): 100.0}});
    let (plain, finish, tokens) = ask(addr, base.clone()).await;
    assert_eq!((finish.as_str(), tokens), ("stop", 13));
    for pred in [
        plain.clone(),
        format!("{plain} and more"),
        "nothing alike".into(),
    ] {
        let mut body = base.clone();
        body["prediction"] = json!({"type": "content", "content": pred});
        let v = post(addr, CHAT, &body).await.json();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            plain.as_str(),
            "{pred}"
        );
        assert_eq!(v["usage"]["completion_tokens"], 13, "{pred}");
        let d = &v["usage"]["completion_tokens_details"];
        let drafted = d["accepted_prediction_tokens"].as_u64().unwrap()
            + d["rejected_prediction_tokens"].as_u64().unwrap();
        assert!(drafted > 0, "{pred}: no drafts were verified");
    }
    server.shutdown().await.unwrap();
}

//! `/v1/completions` as OpenAI's legacy API defines it, on a committed tiny model
//! (goldens/generate/models/llama-small-f32): every prompt form (a string, a list of
//! strings, token ids, lists of token ids) with `n`, `echo` with the prompt's
//! log-probabilities (first `null`), alternatives and text offsets, `max_tokens: 0`
//! scoring, streaming with the prompt in the first chunk, and the errors of bad input.
//! That the echoed values equal mlx-lm's `_score_fn` is checked in
//! crates/mlx-eval/tests/prompt_logprobs.rs (engine) and bins/tests/evaluate.rs
//! (lm-evaluation-harness against mlx-server).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::{Server, ServerConfig};
use serde_json::{json, Value as Json};

async fn server() -> (Server, mlx_tokenizer::Tokenizer) {
    let dir = repo_root().join("goldens/generate/models/llama-small-f32");
    let (model, _) = mlx_models::load_model(&dir).expect("tiny model");
    let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).expect("tokenizer");
    let tok2 = mlx_tokenizer::Tokenizer::from_dir(&dir).expect("tokenizer");
    (start(model, tok, ServerConfig::default()).await, tok2)
}

const A: &str = "hello world, the quick brown fox";
const B: &str = "a b c d";

fn choices(v: &Json) -> &Vec<Json> {
    v["choices"].as_array().unwrap_or_else(|| panic!("{v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn echo_scores_every_prompt_token_in_openai_legacy_shape() {
    let (server, tok) = server().await;
    let addr = server.local_addr();
    let ids = tok.encode(A, true).unwrap();
    let body = json!({"prompt": A, "max_tokens": 0, "echo": true, "logprobs": 2});
    let v = post(addr, "/v1/completions", &body).await.json();
    let c = &choices(&v)[0];
    assert_eq!(c["text"], A);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    let lp = &c["logprobs"];
    let tokens: Vec<String> = ids
        .iter()
        .map(|&t| tok.decode(&[t], false).unwrap())
        .collect();
    assert_eq!(lp["tokens"], json!(tokens));
    let values = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(values.len(), ids.len());
    assert!(
        values[0].is_null(),
        "the first prompt token has no log-probability"
    );
    assert!(values[1..]
        .iter()
        .all(|x| x.as_f64().is_some_and(|x| x <= 0.0)));
    let top = lp["top_logprobs"].as_array().unwrap();
    assert!(top[0].is_null());
    for (t, x) in top[1..].iter().zip(&values[1..]) {
        let m = t.as_object().unwrap();
        assert!(!m.is_empty() && m.len() <= 2, "{t}");
        let best = m
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(x.as_f64().unwrap() <= best);
    }
    let mut at = 0;
    for (o, t) in lp["text_offset"].as_array().unwrap().iter().zip(&tokens) {
        assert_eq!(o.as_u64().unwrap() as usize, at);
        at += t.chars().count();
    }

    // The same prompt as token ids, and then one generated token: the prompt's entries
    // are the same, the generated token's follows.
    let body = json!({"prompt": ids, "max_tokens": 1, "echo": true, "logprobs": 2});
    let w = post(addr, "/v1/completions", &body).await.json();
    let wl = &choices(&w)[0]["logprobs"];
    let wv = wl["token_logprobs"].as_array().unwrap();
    assert_eq!(wv.len(), ids.len() + 1);
    assert_eq!(&wv[..ids.len()], &values[..]);
    assert_eq!(w["usage"]["completion_tokens"], 1);
    let text = choices(&w)[0]["text"].as_str().unwrap();
    assert!(text.starts_with(A), "{text}");

    // Without logprobs, echo is the text only.
    let body = json!({"prompt": A, "max_tokens": 0, "echo": true});
    let e = post(addr, "/v1/completions", &body).await.json();
    assert_eq!(choices(&e)[0]["text"], A);
    assert!(choices(&e)[0]["logprobs"].is_null());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn prompt_lists_answer_one_choice_per_prompt_times_n_in_order() {
    let (server, tok) = server().await;
    let addr = server.local_addr();
    let one = |p: &str| json!({"prompt": p, "max_tokens": 3, "echo": true, "logprobs": 1});
    let a = post(addr, "/v1/completions", &one(A)).await.json();
    let b = post(addr, "/v1/completions", &one(B)).await.json();
    let single = [&choices(&a)[0], &choices(&b)[0]];
    let ids: Vec<Vec<u32>> = [A, B]
        .iter()
        .map(|p| tok.encode(p, true).unwrap())
        .collect();
    for prompt in [json!([A, B]), json!(ids)] {
        let body = json!({"prompt": prompt, "max_tokens": 3, "echo": true, "logprobs": 1, "n": 2});
        let v = post(addr, "/v1/completions", &body).await.json();
        let list = choices(&v);
        assert_eq!(list.len(), 4, "{v}");
        for (i, c) in list.iter().enumerate() {
            assert_eq!(c["index"], i);
            // Greedy: every choice of a prompt is that prompt's single answer.
            let want = single[i / 2];
            assert_eq!(c["text"], want["text"], "choice {i}");
            assert_eq!(c["logprobs"], want["logprobs"], "choice {i}");
        }
        let prompt_tokens = ids[0].len() + ids[1].len();
        assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
        let generated = |r: &Json| r["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(
            v["usage"]["completion_tokens"].as_u64().unwrap(),
            2 * (generated(&a) + generated(&b))
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_echo_sends_the_prompt_in_the_first_chunk() {
    let (server, _) = server().await;
    let addr = server.local_addr();
    let body = json!({"prompt": A, "max_tokens": 2, "echo": true, "logprobs": 1});
    let whole = post(addr, "/v1/completions", &body).await.json();
    let whole = &choices(&whole)[0];
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let data = SseStream::open(addr, "/v1/completions", &stream_body)
        .await
        .collect_data()
        .await;
    let chunks: Vec<Json> = data
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"], A);
    let prompt_lp = first["logprobs"]["token_logprobs"].as_array().unwrap();
    assert!(prompt_lp[0].is_null());
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(text, whole["text"].as_str().unwrap());
    let all: Vec<Json> = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(json!(all), whole["logprobs"]["token_logprobs"]);
    let offsets: Vec<Json> = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(json!(offsets), whole["logprobs"]["text_offset"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_completion_prompts_are_refused_with_the_reason() {
    let (server, _) = server().await;
    let addr = server.local_addr();
    let cases = [
        (json!({"prompt": A, "max_tokens": 0}), "echo"),
        (json!({"prompt": A, "logprobs": 6}), "at most 5"),
        (json!({"prompt": []}), "empty list"),
        (json!({"prompt": [1, "a"]}), "list of strings"),
        (json!({"prompt": [[1, 2], []]}), "prompt[1] is empty"),
        (json!({"prompt": [[1, 2], [1, 99999]]}), "prompt[1]"),
        (json!({"prompt": [A, B], "stream": true}), "one prompt"),
    ];
    for (body, needle) in cases {
        let r = post(addr, "/v1/completions", &body).await;
        assert_eq!(r.status, 400, "{body}");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    server.shutdown().await.unwrap();
}

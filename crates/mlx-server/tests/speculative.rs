#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Speculative decoding in the server: with a draft model loaded (mlx-lm's
//! `--draft-model`), greedy answers equal those of the same server without one, alone
//! and as several concurrent streams that stay batched; bad draft settings are clear
//! 400s and the server keeps serving; the counters reach `/metrics` and `usage`; OpenAI
//! predicted outputs through the official Python SDK (`xtask/py/server_clients.py
//! --speculative`); constrained requests (JSON schema, regex with penalties) speculate
//! in the batch and answer as without speculation.
mod common;

use common::*;
use mlx_server::pool::{LoadedModel, ModelSpec, PoolConfig};
use mlx_server::{Server, ServerConfig};
use serde_json::{json, Value as Json};
use std::time::Duration;

const DRAFT: &str = "tiny-draft";

/// A server over the tiny model, with the tiny model as its draft when `draft`.
async fn server(draft: bool) -> Server {
    server_with(draft, 0).await
}

/// [`server`] with `--draft-max-batch max_batch`.
async fn server_with(draft: bool, max_batch: usize) -> Server {
    server_cfg(draft, max_batch, false).await
}

/// [`server_with`], verifying every draft of a prediction in every step when `all`
/// (every draft of the draft model always).
async fn server_cfg(draft: bool, max_batch: usize, all: bool) -> Server {
    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        decode_concurrency: 8,
        draft_max_batch: max_batch,
        // The draft model's tests count its drafts: every one verified, as mlx-lm.
        verify_all_drafts: all || draft,
        ..Default::default()
    };
    let mut spec = ModelSpec::new(&cfg.model_id);
    spec.draft_model = draft.then(|| DRAFT.to_string());
    let loaded = LoadedModel {
        model,
        tokenizer: tok,
        context_length: None,
        aliases: Vec::new(),
        config: None,
        draft: draft.then(|| tiny_model().0),
    };
    Server::start_pool(cfg, PoolConfig::default(), Some((spec, loaded)), None)
        .await
        .expect("server starts")
}

fn chat(text: &str, extra: Json) -> Json {
    let mut body = json!({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 24,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

async fn answer(addr: std::net::SocketAddr, body: &Json) -> Json {
    let r = post(addr, "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn content(v: &Json) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

const PROMPTS: [&str; 4] = [
    "Tell me a story.",
    "hi",
    "What is the capital of France? Answer in one word.",
    "Count to ten.",
];

#[tokio::test(flavor = "multi_thread")]
async fn greedy_answers_with_a_draft_model_equal_those_without() {
    let plain = server(false).await;
    let mut want = Vec::new();
    for p in PROMPTS {
        want.push(content(
            &answer(plain.local_addr(), &chat(p, json!({}))).await,
        ));
    }
    plain.shutdown().await.unwrap();

    let spec = server(true).await;
    let addr = spec.local_addr();
    for (p, w) in PROMPTS.iter().zip(&want) {
        for k in [1, 5] {
            let v = answer(addr, &chat(p, json!({"num_draft_tokens": k}))).await;
            assert_eq!(&content(&v), w, "{p:?}, {k} draft tokens");
            let d = &v["usage"]["completion_tokens_details"];
            // The model is its own draft: every draft is accepted.
            assert!(d["draft_tokens"].as_u64().unwrap() > 0, "{v}");
            assert_eq!(d["draft_tokens"], d["accepted_draft_tokens"], "{v}");
        }
    }
    // mlx-lm's names for the loaded draft.
    for name in ["default_model", DRAFT] {
        let v = answer(addr, &chat(PROMPTS[0], json!({"draft_model": name}))).await;
        assert_eq!(content(&v), want[0]);
    }
    // Concurrent streams (different draft lengths) share the speculating batch.
    let texts = streamed_chats(
        addr,
        (0..8).map(|i| {
            chat(
                PROMPTS[i % 4],
                json!({"stream": true, "num_draft_tokens": 1 + i % 5}),
            )
        }),
    )
    .await;
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(t, &want[i % 4], "stream {i}");
    }
    let drafted = metric(addr, "mlx_server_speculative_drafted_tokens_total").await;
    let accepted = metric(addr, "mlx_server_speculative_accepted_tokens_total").await;
    assert!(drafted > 0.0 && accepted == drafted, "{drafted} {accepted}");
    assert!(metric(addr, "mlx_server_speculative_steps_total").await > 0.0);
    // Every draft accepted: no request stepped aside from speculation.
    assert_eq!(
        metric(addr, "mlx_server_speculation_rows_stepped_aside_total").await,
        0.0
    );
    spec.shutdown().await.unwrap();
}

/// The texts of streamed chat completions of `bodies`, all sent at once.
async fn streamed_chats(
    addr: std::net::SocketAddr,
    bodies: impl Iterator<Item = Json>,
) -> Vec<String> {
    futures_join(bodies.map(|body| {
        tokio::spawn(async move {
            let r = post(addr, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200);
            chat_stream_text(&r.sse_data()).0
        })
    }))
    .await
}

async fn futures_join<T: Send + 'static>(
    handles: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    // Spawned before the first is awaited (a lazy `map` would spawn them one by one).
    let handles: Vec<_> = handles.collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_streams_over_the_draft_max_batch_go_plain_with_the_same_answers() {
    // Long answers, one draft per round: the streams overlap.
    let long = json!({"max_tokens": 100});
    let plain = server(false).await;
    let mut want = Vec::new();
    for p in PROMPTS {
        want.push(content(
            &answer(plain.local_addr(), &chat(p, long.clone())).await,
        ));
    }
    plain.shutdown().await.unwrap();
    // --draft-max-batch 1: once two requests decode at once, speculating ones go on
    // without drafts (counted, apart from the acceptance step-aside).
    let spec = server_with(true, 1).await;
    let addr = spec.local_addr();
    let texts = streamed_chats(
        addr,
        (0..8).map(|i| {
            chat(
                PROMPTS[i % 4],
                json!({"stream": true, "max_tokens": 100, "num_draft_tokens": 1}),
            )
        }),
    )
    .await;
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(t, &want[i % 4], "stream {i}");
    }
    assert!(metric(addr, "mlx_server_speculation_rows_over_batch_total").await > 0.0);
    assert_eq!(
        metric(addr, "mlx_server_speculation_rows_stepped_aside_total").await,
        0.0
    );
    // Alone (under the limit) a request speculates.
    let v = answer(addr, &chat(PROMPTS[0], long)).await;
    assert_eq!(content(&v), want[0]);
    let d = &v["usage"]["completion_tokens_details"];
    assert!(d["draft_tokens"].as_u64().unwrap() > 0, "{v}");
    spec.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_draft_settings_are_400s_and_the_server_keeps_serving() {
    for draft in [false, true] {
        let s = server(draft).await;
        let addr = s.local_addr();
        let cases = [
            (json!({"draft_model": "other/draft"}), "other/draft"),
            (json!({"num_draft_tokens": 0}), "num_draft_tokens"),
            (json!({"num_draft_tokens": 65}), "num_draft_tokens"),
            (json!({"num_draft_tokens": "3"}), "num_draft_tokens"),
            (
                json!({"prediction": {"type": "text", "content": "x"}}),
                "prediction",
            ),
            (
                json!({"prediction": {"type": "content", "content": 3}}),
                "prediction",
            ),
        ];
        for (extra, names) in cases {
            let r = post(addr, "/v1/chat/completions", &chat("hi", extra.clone())).await;
            assert_eq!(r.status, 400, "{extra}");
            let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
            assert!(msg.contains(names), "{extra}: {msg}");
        }
        // Predictions are for chat completions only.
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": "hi", "prediction": {"type": "content", "content": "x"}}),
        )
        .await;
        assert_eq!(r.status, 400);
        let v = answer(addr, &chat("hi", json!({}))).await;
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");
        s.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prediction_drafts_from_its_text_without_changing_the_answer() {
    // Every draft verified: the default width follows the step times, which a loaded
    // test machine can make leave every draft out (the same tokens either way).
    let s = server_cfg(false, 0, true).await;
    let addr = s.local_addr();
    let plain = answer(addr, &chat(PROMPTS[0], json!({}))).await;
    let text = content(&plain);
    assert!(plain["usage"].get("completion_tokens_details").is_none());
    let v = answer(
        addr,
        &chat(
            PROMPTS[0],
            json!({"prediction": {"type": "content", "content": text}}),
        ),
    )
    .await;
    assert_eq!(content(&v), text);
    let d = &v["usage"]["completion_tokens_details"];
    let accepted = d["accepted_prediction_tokens"].as_u64().unwrap();
    assert!(accepted > 0, "{v}");
    assert!(d["rejected_prediction_tokens"].as_u64().is_some(), "{v}");
    // A wrong prediction: nothing accepted, the same answer.
    let v = answer(
        addr,
        &chat(
            PROMPTS[0],
            json!({"prediction": {"type": "content", "content": [{"type": "text", "text": "zzz qqq"}]}}),
        ),
    )
    .await;
    assert_eq!(content(&v), text);
    assert!(
        wait_metric(
            addr,
            "mlx_server_speculative_accepted_tokens_total",
            accepted as f64,
            Duration::from_secs(5)
        )
        .await
            >= accepted as f64
    );
    // A prediction's drafts cost nothing to make: its row does not step aside for its
    // acceptance (--draft-min-acceptance is the draft model's); the step's width leaves
    // out drafts that do not pay.
    assert_eq!(
        metric(addr, "mlx_server_speculation_rows_stepped_aside_total").await,
        0.0
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn mixed_requests_beside_predictions_answer_as_alone() {
    // Plain requests of every kind next to predicted ones (plain rows step with the
    // prediction batch unless they have a seed, processors or an adapter): each answer,
    // its log-probabilities and finish reason as when the request is served alone.
    let s = server(false).await;
    let addr = s.local_addr();
    let kinds = [
        json!({"prediction": {"type": "content", "content": "Once upon a time"}}),
        json!({"logprobs": true, "top_logprobs": 2}),
        json!({"n": 2, "temperature": 0.8, "seed": 5}),
        json!({"prediction": {"type": "content", "content": "one two three four"}}),
        json!({"stop": ["e"]}),
        json!({"response_format": {"type": "json_object"}}),
        json!({"logit_bias": {"42": -100}}),
        json!({}),
    ];
    let bodies: Vec<Json> = (0..16)
        .map(|i| {
            let mut b = chat(PROMPTS[i % 4], kinds[i % 8].clone());
            b["max_tokens"] = json!(32);
            b
        })
        .collect();
    let key = |v: &Json| -> Vec<Json> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| json!([c["message"]["content"], c["finish_reason"], c["logprobs"]]))
            .collect()
    };
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(key(&answer(addr, b).await));
    }
    let together = futures_join(bodies.into_iter().map(|body| {
        tokio::spawn(async move {
            let r = post(addr, "/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            r.json()
        })
    }))
    .await;
    for (i, v) in together.iter().enumerate() {
        assert_eq!(key(v), alone[i], "request {i}");
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openai_sdk_sends_predictions_and_reads_their_usage() {
    // Every prediction draft verified (see above): the script checks accepted tokens.
    let s = server_cfg(true, 0, true).await;
    let root = repo_root();
    let out = tokio::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("xtask/py/server_clients.py"))
        .args([
            "--base-url",
            &format!("http://{}", s.local_addr()),
            "--speculative",
        ])
        .kill_on_drop(true)
        .output()
        .await
        .expect("running the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("checks passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.shutdown().await.unwrap();
}

/// A schema every answer of the tiny random model ends (bounded strings and numbers).
fn person_schema() -> Json {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    })
}

/// Requests with output constraints (a JSON schema; a regex with penalties) speculate in
/// the batch: with the draft model, and with a prediction next to plain and unconstrained
/// rows. Each greedy answer equals the same request's answer without speculation, the
/// JSON answers validate (Python's `jsonschema`), and drafts were accepted for them.
#[tokio::test(flavor = "multi_thread")]
async fn constrained_requests_speculate_and_answer_as_without_speculation() {
    let format = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "schema": person_schema(), "strict": true}},
        "max_tokens": 80});
    let regex = json!({"guided_regex": "[a-z]{3,9}( [0-9]{1,3}){2,4}", "max_tokens": 40,
        "repetition_penalty": 1.3, "presence_penalty": 0.5});
    // (prompt, constraint) of each request; the last two are unconstrained.
    let cases = [
        (PROMPTS[0], format.clone()),
        (PROMPTS[2], format.clone()),
        (PROMPTS[1], regex.clone()),
        (PROMPTS[3], json!({})),
        (PROMPTS[0], json!({})),
    ];
    // Every draft of a prediction verified: by default a step verifies as many as pay
    // for their positions by the step times it measured, which a loaded machine can
    // leave at none (the same tokens either way; `batch/width.rs`).
    let plain = server_cfg(false, 0, true).await;
    let mut want = Vec::new();
    for (p, extra) in &cases {
        want.push(content(
            &answer(plain.local_addr(), &chat(p, extra.clone())).await,
        ));
    }
    println!("answers without speculation: {want:?}");
    let validated = validate_json(&want[..2], &person_schema());
    assert!(validated.contains("2 valid"), "{validated}");
    let re = regex_lite(&want[2]);
    assert!(re, "{:?} does not match the regex", want[2]);

    // With predictions, next to a plain row: right predictions for the first three,
    // a wrong one for the fourth, none for the last.
    let addr = plain.local_addr();
    let handles = cases
        .iter()
        .zip(&want)
        .enumerate()
        .map(|(i, ((p, extra), w))| {
            let mut body = chat(p, extra.clone());
            match i {
                0..=2 => body["prediction"] = json!({"type": "content", "content": w}),
                3 => body["prediction"] = json!({"type": "content", "content": "zzz qqq"}),
                _ => {}
            }
            tokio::spawn(async move { answer(addr, &body).await })
        });
    let got = futures_join(handles).await;
    for (i, (v, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(&content(v), w, "request {i} with a prediction");
    }
    for v in &got[..3] {
        let d = &v["usage"]["completion_tokens_details"];
        assert!(d["accepted_prediction_tokens"].as_u64().unwrap() > 0, "{v}");
    }
    plain.shutdown().await.unwrap();

    // With the draft model (the tiny model itself): every request speculates, batched.
    let spec = server(true).await;
    let addr = spec.local_addr();
    let handles = cases.iter().map(|(p, extra)| {
        let body = chat(p, extra.clone());
        tokio::spawn(async move { answer(addr, &body).await })
    });
    let got = futures_join(handles).await;
    for (i, (v, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(&content(v), w, "request {i} with the draft model");
        let d = &v["usage"]["completion_tokens_details"];
        assert!(
            d["accepted_draft_tokens"].as_u64().unwrap() > 0,
            "request {i}: {v}"
        );
    }
    let drafted = metric(addr, "mlx_server_speculative_drafted_tokens_total").await;
    let accepted = metric(addr, "mlx_server_speculative_accepted_tokens_total").await;
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "{drafted} {accepted}"
    );
    spec.shutdown().await.unwrap();
}

/// Validates each text as JSON against `schema` with Python's `jsonschema`; returns
/// its report (`N valid` or the error).
fn validate_json(texts: &[String], schema: &Json) -> String {
    let script = "import json, sys, jsonschema\n\
        d = json.load(sys.stdin)\n\
        for t in d['texts']:\n    jsonschema.validate(json.loads(t), d['schema'])\n\
        print(len(d['texts']), 'valid')\n";
    let mut child = std::process::Command::new(repo_root().join(".venv/bin/python"))
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running Python");
    let input = json!({"texts": texts, "schema": schema}).to_string();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `[a-z]{3,9}( [0-9]{1,3}){2,4}`, matched in full.
fn regex_lite(t: &str) -> bool {
    let mut parts = t.split(' ');
    let word = parts.next().unwrap_or("");
    let nums: Vec<&str> = parts.collect();
    (3..=9).contains(&word.len())
        && word.bytes().all(|b| b.is_ascii_lowercase())
        && (2..=4).contains(&nums.len())
        && nums
            .iter()
            .all(|n| (1..=3).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

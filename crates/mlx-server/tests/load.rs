//! 64 concurrent streaming requests of mixed lengths all complete, and at temperature 0
//! each gives the same tokens and log-probabilities as the same request alone.
//!
//! The model: `MLX_SERVER_LOAD_MODEL=default` (SmolLM2-135M-Instruct through mlx-hub) or
//! `tiny` (a 2-layer random llama over the Qwen3 vocabulary). Unset, the default model
//! runs on a GPU and the tiny one on the CPU, where the default model decodes at only a
//! few tokens per second on a busy 2-core machine (about 1,000 decode steps are needed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};
use std::time::{Duration, Instant};

const PROMPTS: [&str; 8] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain gravity to a child.",
    "Say hello in Spanish.",
    "What is 12 times 12?",
    "Name a famous painter.",
    "Give me a synonym for happy.",
];

/// Token ids, log-probabilities, text and finish reason of a streamed chat answer.
async fn stream_tokens(
    addr: std::net::SocketAddr,
    prompt: &str,
    max_tokens: usize,
) -> (Vec<u64>, Vec<f64>, String, String) {
    let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                      "temperature": 0.0, "stream": true, "logprobs": true});
    let mut s = SseStream::open(addr, "/v1/chat/completions", &body).await;
    assert_eq!(s.status, 200);
    let (mut ids, mut lps, mut text, mut finish) =
        (Vec::new(), Vec::new(), String::new(), String::new());
    while let Some(d) = s.next_data().await {
        if d == "[DONE]" {
            break;
        }
        let v: Json = serde_json::from_str(&d).unwrap();
        let c = &v["choices"][0];
        for lp in c["logprobs"]["content"].as_array().into_iter().flatten() {
            ids.push(lp["id"].as_u64().unwrap());
            lps.push(lp["logprob"].as_f64().unwrap());
        }
        text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (ids, lps, text, finish)
}

fn load_test_model() -> (Box<dyn mlx_models::LanguageModel>, mlx_tokenizer::Tokenizer) {
    let on_gpu =
        mlx_array::Device::default_device().is_ok_and(|d| d.kind == mlx_array::DeviceType::Gpu);
    match std::env::var("MLX_SERVER_LOAD_MODEL").as_deref() {
        Ok("default") => default_model(),
        Ok("tiny") => tiny_model(),
        Ok(other) => panic!("MLX_SERVER_LOAD_MODEL must be `default` or `tiny`, got {other:?}"),
        Err(_) if on_gpu => default_model(),
        Err(_) => tiny_model(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_streams_match_single_requests() {
    let (model, tok) = load_test_model();
    let cfg = ServerConfig {
        prompt_cache_size: 0,
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let addr = server.local_addr();
    let budget = Duration::from_secs(900);
    let t0 = Instant::now();
    let max_len = 18;
    // Alone: each prompt at the longest length (shorter budgets are its prefixes), and
    // each prompt once at a shorter length to check that claim directly.
    let mut alone = Vec::new();
    for (i, p) in PROMPTS.iter().enumerate() {
        let long = stream_tokens(addr, p, max_len).await;
        assert!(!long.0.is_empty());
        let short_len = 4 + i;
        let short = stream_tokens(addr, p, short_len).await;
        let n = short_len.min(long.0.len());
        assert_eq!(
            short.0,
            long.0[..n],
            "prompt {i}: a shorter budget is a prefix"
        );
        alone.push(long);
    }
    let single_time = t0.elapsed();
    // Together: 64 streams, 8 per prompt, lengths 4..=18.
    let t1 = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|k| {
            let (p, m) = (k % PROMPTS.len(), 4 + (k * 7) % (max_len - 3));
            tokio::spawn(async move { (p, m, stream_tokens(addr, PROMPTS[p], m).await) })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        let left = budget.saturating_sub(t0.elapsed());
        let (p, m, (ids, lps, text, finish)) = tokio::time::timeout(left, t)
            .await
            .expect("load test timed out")
            .unwrap();
        let (want_ids, want_lps, _, want_finish) = &alone[p];
        let n = m.min(want_ids.len());
        assert_eq!(
            ids,
            want_ids[..n],
            "request (prompt {p}, max {m}): tokens differ from the single run"
        );
        assert_eq!(
            lps,
            want_lps[..n],
            "request (prompt {p}, max {m}): logprobs differ from the single run"
        );
        let expect_finish = if n == want_ids.len() && want_finish == "stop" {
            "stop"
        } else {
            "length"
        };
        assert_eq!(finish, expect_finish, "prompt {p}, max {m}");
        assert!(!text.is_empty() || finish == "stop");
        done += 1;
    }
    assert_eq!(done, 64);
    eprintln!(
        "alone: {single_time:?} for 16 requests; together: {:?} for 64",
        t1.elapsed()
    );
    // A stream's last chunk can reach the client before the engine's next loop drops the
    // finished rows from the decode batch and updates the gauge: give it that loop.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(addr, "mlx_server_active_sequences").await > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    assert!(text.contains("mlx_server_active_sequences 0"), "{text}");
    assert!(text.contains("mlx_server_queue_depth 0"));
    server.shutdown().await.unwrap();
}

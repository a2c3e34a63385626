//! Memory that never kills the server: with MLX's memory limit set low
//! (`memory_limit_bytes`, the `--memory-limit-mb` flag), a prompt too large for it gets
//! 503 naming memory while 64 other streams finish with the tokens they get alone, and
//! the next request is served; `/health` reports the headroom. Twice: refused before it
//! runs by the admission estimate (a model whose config.json is known), and stopped by
//! the engine's enforcement of the limit when its prefill step goes over it (no
//! config.json, so no estimate: MLX's CPU allocator itself never fails at the limit).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::{get, post, tiny_model_dir, tokenizer, SseStream};
use mlx_server::pool::{LoadedModel, ModelSpec, PoolConfig};
use mlx_server::{Server, ServerConfig};
use serde_json::{json, Value as Json};
use std::net::SocketAddr;

const PROMPTS: [&str; 4] = [
    "Once upon a time",
    "The capital of France is",
    "1, 2, 3, 4,",
    "def main():",
];

/// The tiny model served under a limit of 64 MB beside its weights, with memory
/// admission when `known_config` (its config.json given to the pool), without it
/// otherwise, and with `kv_bits` (KV-cache quantization: sequences run alone).
/// Returns the server and the limit.
async fn serve(
    known_config: bool,
    prompt_cache_size: usize,
    kv_bits: Option<i32>,
) -> (Server, u64) {
    let dir = tiny_model_dir();
    let (model, _) = mlx_models::load_model(dir).expect("tiny model");
    let config: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let weights = mlx_array::memory::active_memory() as u64;
    // 64 MB beside the weights: short requests fit (about 1.3 MB each by the
    // estimate), a 4000-token prompt prefilled in one chunk (about 140 MB of attention
    // scores alone) never does.
    let limit = weights + 64_000_000;
    let cfg = ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        model_id: "tiny".into(),
        memory_limit_bytes: Some(limit),
        prefill_step_size: 4096,
        decode_concurrency: 16,
        prompt_cache_size,
        kv_bits,
        ..Default::default()
    };
    let default = LoadedModel {
        model,
        tokenizer: tokenizer(),
        context_length: Some(4096),
        aliases: Vec::new(),
        config: known_config.then_some(config),
        draft: None,
    };
    let server = Server::start_pool(
        cfg,
        PoolConfig::default(),
        Some((ModelSpec::new("tiny"), default)),
        None,
    )
    .await
    .expect("server starts");
    (server, limit)
}

fn small(prompt: &str, stream: bool) -> Json {
    json!({"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0.0,
           "stream": stream})
}

/// Each prompt's greedy completion when it runs alone.
async fn alone(addr: SocketAddr) -> Vec<String> {
    let mut texts = Vec::new();
    for p in PROMPTS {
        let r = post(addr, "/v1/completions", &small(p, false)).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        texts.push(r.json()["choices"][0]["text"].as_str().unwrap().to_string());
    }
    texts
}

/// 64 streams (16 of each prompt) and, meanwhile, a 4000-token prompt: the large one
/// gets 503 with a message containing `expected`; every stream finishes with the text
/// its prompt gets alone; then a small request succeeds and `/health` is ok.
async fn burst_with_a_prompt_too_large(addr: SocketAddr, expected: &str) {
    let solo = alone(addr).await;
    let big_prompt: Vec<u32> = (0..4000).map(|i| 100 + (i % 500)).collect();
    let big = json!({"model": "tiny", "prompt": big_prompt, "max_tokens": 4});

    let streams: Vec<_> = (0..64)
        .map(|i| {
            let body = small(PROMPTS[i % PROMPTS.len()], true);
            tokio::spawn(async move {
                let mut s = SseStream::open(addr, "/v1/completions", &body).await;
                let status = s.status;
                (i, status, s.collect_data().await)
            })
        })
        .collect();
    let refused = post(addr, "/v1/completions", &big).await;
    assert_eq!(
        refused.status,
        503,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    let body = refused.json();
    assert_eq!(body["error"]["code"], "503", "{body}");
    let msg = body["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(expected) && msg.contains("memory"), "{msg}");

    for s in streams {
        let (i, status, data) = s.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Json> = data
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .map(|d| serde_json::from_str::<Json>(d).unwrap())
            .collect();
        assert!(chunks.iter().all(|c| c.get("error").is_none()), "{data:?}");
        let finish: Vec<&Json> = chunks
            .iter()
            .filter_map(|c| c["choices"][0].get("finish_reason"))
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish.len(), 1, "{data:?}");
        assert!(finish[0] == "length" || finish[0] == "stop", "{data:?}");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, solo[i % PROMPTS.len()], "stream {i}: {data:?}");
    }

    // The server serves on: a small request gets the same answer, the large one is
    // refused again.
    assert_eq!(alone(addr).await, solo);
    assert_eq!(post(addr, "/v1/completions", &big).await.status, 503);
    assert_eq!(get(addr, "/health").await.json()["status"], "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_estimated_too_large_for_the_memory_limit_gets_503_and_the_others_finish() {
    let (server, limit) = serve(true, 0, None).await;
    let addr = server.local_addr();
    let health = get(addr, "/health").await.json();
    assert_eq!(health["memory"]["limit_bytes"], json!(limit), "{health}");
    let headroom = health["memory"]["headroom_bytes"].as_u64().unwrap();
    assert!(headroom > 0 && headroom <= 64_000_000, "{health}");

    burst_with_a_prompt_too_large(addr, "not enough memory").await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefill_step_over_the_memory_limit_fails_only_its_request() {
    // The prompt cache on (its default size), so the failure also shrinks it.
    let (server, _) = serve(false, ServerConfig::default().prompt_cache_size, None).await;
    let addr = server.local_addr();
    burst_with_a_prompt_too_large(addr, "out of memory").await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefill_step_over_the_memory_limit_fails_only_its_request_with_a_quantized_kv_cache() {
    // --kv-bits: every sequence prefills and decodes alone.
    let (server, _) = serve(false, 0, Some(8)).await;
    let addr = server.local_addr();
    burst_with_a_prompt_too_large(addr, "out of memory").await;
    server.shutdown().await.unwrap();
}

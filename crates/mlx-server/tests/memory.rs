//! Memory that never kills the server: with MLX's memory limit set low
//! (`memory_limit_bytes`, the `--memory-limit-mb` flag), a prompt too large for it gets
//! 503 while 64 other streams finish, and the next request is served; `/health`
//! reports the headroom.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::{get, post, tiny_model_dir, tokenizer, SseStream};
use mlx_server::pool::{LoadedModel, ModelSpec, PoolConfig};
use mlx_server::{Server, ServerConfig};
use serde_json::{json, Value as Json};

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_too_large_for_the_memory_limit_gets_503_and_the_others_finish() {
    let dir = tiny_model_dir();
    let (model, _) = mlx_models::load_model(dir).expect("tiny model");
    let config: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let weights = mlx_array::memory::active_memory() as u64;
    // 64 MB beside the weights: short requests fit (about 1.3 MB each by the
    // estimate), a 4000-token prompt prefilled in one chunk (about 140 MB) never does.
    let limit = weights + 64_000_000;
    let cfg = ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        model_id: "tiny".into(),
        memory_limit_bytes: Some(limit),
        prefill_step_size: 4096,
        decode_concurrency: 16,
        prompt_cache_size: 0,
        ..Default::default()
    };
    let default = LoadedModel {
        model,
        tokenizer: tokenizer(),
        context_length: Some(4096),
        aliases: Vec::new(),
        config: Some(config),
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
    let addr = server.local_addr();

    let health = get(addr, "/health").await.json();
    assert_eq!(health["memory"]["limit_bytes"], json!(limit), "{health}");
    let headroom = health["memory"]["headroom_bytes"].as_u64().unwrap();
    assert!(headroom > 0 && headroom <= 64_000_000, "{health}");

    let small = json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 16,
                       "stream": true});
    let big_prompt: Vec<u32> = (0..4000).map(|i| 100 + (i % 500)).collect();
    let big = json!({"model": "tiny", "prompt": big_prompt, "max_tokens": 4});

    let streams = (0..64).map(|_| {
        let body = small.clone();
        tokio::spawn(async move {
            let mut s = SseStream::open(addr, "/v1/completions", &body).await;
            let status = s.status;
            (status, s.collect_data().await)
        })
    });
    let streams: Vec<_> = streams.collect();
    let refused = post(addr, "/v1/completions", &big).await;
    assert_eq!(
        refused.status,
        503,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    let msg = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("not enough memory"), "{msg}");

    for s in streams {
        let (status, data) = s.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let finish: Vec<Json> = data
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .map(|d| serde_json::from_str::<Json>(d).unwrap())
            .filter_map(|c| {
                c["choices"][0]
                    .get("finish_reason")
                    .filter(|f| !f.is_null())
                    .cloned()
            })
            .collect();
        assert_eq!(finish.len(), 1, "{data:?}");
        assert!(finish[0] == "length" || finish[0] == "stop", "{data:?}");
    }

    // The server serves on: a small request succeeds, the large one is refused again.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(post(addr, "/v1/completions", &big).await.status, 503);
    assert_eq!(get(addr, "/health").await.json()["status"], "ok");
    server.shutdown().await.unwrap();
}

//! A client that drops its stream midway cancels its generation: the slot is freed,
//! token production stops, the cancellation is counted, and the next request is served.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread")]
async fn dropped_stream_stops_its_generation() {
    // 20 ms per step: the essay (~600 tokens) would take ~12 s.
    let cfg = ServerConfig {
        decode_concurrency: 1,
        ..Default::default()
    };
    let server = scripted_server(cfg, Duration::from_millis(20)).await;
    let addr = server.local_addr();
    let body = json!({"messages": [{"role": "user", "content": "write an essay"}], "stream": true, "max_tokens": 2000});
    let mut s = SseStream::open(addr, "/v1/chat/completions", &body).await;
    for _ in 0..5 {
        assert!(s.next_data().await.is_some());
    }
    let produced_before = metric(addr, "mlx_server_generation_tokens_total").await;
    drop(s);
    let t = Instant::now();
    let cancelled = wait_metric(
        addr,
        "mlx_server_cancelled_total",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(cancelled, 1.0, "the cancellation is counted");
    // Well under the ~12 s the whole answer takes (a few steps of 20 ms).
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "cancelled after {:?}",
        t.elapsed()
    );
    let stopped_at = metric(addr, "mlx_server_generation_tokens_total").await;
    assert!(
        stopped_at - produced_before < 15.0,
        "{produced_before} -> {stopped_at}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        metric(addr, "mlx_server_generation_tokens_total").await,
        stopped_at,
        "no tokens after cancellation"
    );
    assert_eq!(
        metric(addr, "mlx_server_active_sequences").await,
        0.0,
        "the slot is free"
    );
    // With the only slot free again, the next request is served at once.
    let t = Instant::now();
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.json()["choices"][0]["message"]["content"], DEFAULT_ANSWER);
    assert!(t.elapsed() < Duration::from_secs(5));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn dropped_request_waiting_in_the_queue_never_runs() {
    let cfg = ServerConfig {
        decode_concurrency: 1,
        ..Default::default()
    };
    let server = scripted_server(cfg, Duration::from_millis(20)).await;
    let addr = server.local_addr();
    let essay = json!({"messages": [{"role": "user", "content": "write an essay"}], "stream": true, "max_tokens": 150});
    let mut running = SseStream::open(addr, "/v1/chat/completions", &essay).await;
    assert!(running.next_data().await.is_some());
    let waiting = SseStream::open(addr, "/v1/chat/completions", &essay).await;
    assert_eq!(waiting.status, 200);
    assert_eq!(
        wait_metric(addr, "mlx_server_queue_depth", 1.0, Duration::from_secs(5)).await,
        1.0,
        "queued behind the first"
    );
    drop(waiting);
    assert_eq!(
        wait_metric(
            addr,
            "mlx_server_cancelled_total",
            1.0,
            Duration::from_secs(5)
        )
        .await,
        1.0
    );
    assert_eq!(metric(addr, "mlx_server_queue_depth").await, 0.0);
    let data = running.collect_data().await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        metric(addr, "mlx_server_generation_tokens_total").await,
        150.0,
        "only the first request generated"
    );
    server.shutdown().await.unwrap();
}

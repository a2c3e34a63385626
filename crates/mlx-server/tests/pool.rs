//! The model pool: three tiny models under a memory budget that fits two (least
//! recently used unloaded first, the pinned one never), idle unloading, the load and
//! unload endpoints behind the API key, waiting for a model that is loading, a failed
//! load answered to its request only, and concurrent requests to different models.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::{get, post, request, tiny_model_dir, tokenizer};
use mlx_server::pool::{AllowedModels, LoadError, LoadedModel, ModelLoader, ModelSpec, PoolConfig};
use mlx_server::{Server, ServerConfig};
use serde_json::{json, Value as Json};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Loads the tiny llama for every model id, except `missing` (not found) and `broken`
/// (fails); counts loads; sleeps `delay` in each.
struct TinyLoader {
    dir: PathBuf,
    loads: AtomicUsize,
    delay: Duration,
    /// The (id, adapters) of every load.
    seen: std::sync::Mutex<Vec<(String, Option<String>)>>,
}

impl TinyLoader {
    fn new(delay: Duration) -> Arc<TinyLoader> {
        Arc::new(TinyLoader {
            dir: tiny_model_dir().to_path_buf(),
            loads: AtomicUsize::new(0),
            delay,
            seen: Default::default(),
        })
    }

    fn size(&self) -> u64 {
        std::fs::metadata(self.dir.join("model.safetensors"))
            .expect("tiny model")
            .len()
    }
}

impl ModelLoader for TinyLoader {
    fn load(&self, spec: &ModelSpec) -> Result<LoadedModel, LoadError> {
        std::thread::sleep(self.delay);
        match spec.path.as_str() {
            "missing" => return Err(LoadError::NotFound("no such directory".into())),
            "broken" => return Err(LoadError::Failed("the weights are corrupt".into())),
            _ => {}
        }
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.seen
            .lock()
            .unwrap()
            .push((spec.id.clone(), spec.adapter_path.clone()));
        let (model, _) =
            mlx_models::load_model(&self.dir).map_err(|e| LoadError::Failed(e.to_string()))?;
        Ok(LoadedModel {
            model,
            tokenizer: mlx_tokenizer::Tokenizer::from_dir(&self.dir)
                .map_err(|e| LoadError::Failed(e.to_string()))?,
            context_length: Some(4096),
            aliases: Vec::new(),
            config: None,
            draft: None,
        })
    }

    fn estimate_bytes(&self, spec: &ModelSpec) -> Option<u64> {
        // Models that never load have no weights to count.
        (!matches!(spec.path.as_str(), "missing" | "broken")).then(|| self.size())
    }

    fn cached_models(&self) -> Vec<String> {
        vec!["org/cached-model".into()]
    }
}

fn spec(id: &str, pinned: bool) -> ModelSpec {
    ModelSpec {
        pinned,
        ..ModelSpec::new(id)
    }
}

/// A server whose `--model` is `a` (pinned), with `b` and `c` configured and a budget
/// for two tiny models.
async fn three_models(loader: Arc<TinyLoader>, extra: PoolConfig, cfg: ServerConfig) -> Server {
    let (model, _) = mlx_models::load_model(tiny_model_dir()).expect("tiny model");
    let default = LoadedModel {
        model,
        tokenizer: tokenizer(),
        context_length: Some(4096),
        aliases: Vec::new(),
        config: None,
        draft: None,
    };
    let budget = loader.size() * 5 / 2;
    let mut models = vec![spec("b", false), spec("c", false)];
    models.extend(extra.models);
    let pool_cfg = PoolConfig {
        models,
        budget_bytes: Some(budget),
        ..extra
    };
    let cfg = ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        model_id: "a".into(),
        max_tokens: 6,
        ..cfg
    };
    Server::start_pool(
        cfg,
        pool_cfg,
        Some((spec("a", true), default)),
        Some(loader as Arc<dyn ModelLoader>),
    )
    .await
    .expect("server starts")
}

async fn states(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let list = get(addr, "/v1/models").await.json();
    list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn state_of(states: &[(String, String)], id: &str) -> String {
    states
        .iter()
        .find(|(i, _)| i == id)
        .map(|(_, s)| s.clone())
        .unwrap_or_else(|| panic!("{id} not listed in {states:?}"))
}

async fn complete(addr: std::net::SocketAddr, model: &str) -> (u16, Json) {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": model, "prompt": "Once upon a time", "max_tokens": 6}),
    )
    .await;
    (r.status, r.json())
}

#[tokio::test(flavor = "multi_thread")]
async fn lru_unloads_to_fit_the_budget_and_never_the_pinned_model() {
    let loader = TinyLoader::new(Duration::ZERO);
    let server = three_models(
        Arc::clone(&loader),
        PoolConfig::default(),
        Default::default(),
    )
    .await;
    let addr = server.local_addr();

    let s = states(addr).await;
    assert_eq!(state_of(&s, "a"), "loaded");
    assert_eq!(state_of(&s, "b"), "unloaded");
    assert_eq!(state_of(&s, "c"), "unloaded");
    assert_eq!(state_of(&s, "org/cached-model"), "unloaded");

    let (status, a) = complete(addr, "a").await;
    assert_eq!(status, 200, "{a}");
    let (status, b) = complete(addr, "b").await;
    assert_eq!(status, 200, "{b}");
    // Same weights, so the same greedy answer from each model's own engine.
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(b["model"], "b");
    assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
    let s = states(addr).await;
    assert_eq!(state_of(&s, "b"), "loaded");

    // c does not fit next to a and b: b (least recently used, not pinned) goes.
    let (status, c) = complete(addr, "c").await;
    assert_eq!(status, 200, "{c}");
    let s = states(addr).await;
    assert_eq!(state_of(&s, "a"), "loaded");
    assert_eq!(state_of(&s, "b"), "unloaded");
    assert_eq!(state_of(&s, "c"), "loaded");

    // Using a (pinned) and then b again unloads c, never a.
    assert_eq!(complete(addr, "a").await.0, 200);
    assert_eq!(complete(addr, "b").await.0, 200);
    let s = states(addr).await;
    assert_eq!(state_of(&s, "a"), "loaded");
    assert_eq!(state_of(&s, "b"), "loaded");
    assert_eq!(state_of(&s, "c"), "unloaded");
    assert_eq!(loader.loads.load(Ordering::SeqCst), 3);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_models_are_unloaded_after_their_timeout() {
    let loader = TinyLoader::new(Duration::ZERO);
    let extra = PoolConfig {
        models: vec![ModelSpec {
            idle_timeout: Some(Duration::from_millis(300)),
            ..ModelSpec::new("d")
        }],
        ..Default::default()
    };
    let server = three_models(loader, extra, Default::default()).await;
    let addr = server.local_addr();
    assert_eq!(complete(addr, "d").await.0, 200);
    assert_eq!(complete(addr, "b").await.0, 200);
    let mut gone = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if state_of(&states(addr).await, "d") == "unloaded" {
            gone = true;
            break;
        }
    }
    assert!(gone, "d was not unloaded after its idle timeout");
    let s = states(addr).await;
    // No timeout for b (none given, no --model-idle-timeout) and a is pinned.
    assert_eq!(state_of(&s, "a"), "loaded");
    assert_eq!(state_of(&s, "b"), "loaded");
    // It loads again on demand.
    assert_eq!(complete(addr, "d").await.0, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn load_and_unload_endpoints_need_the_api_key() {
    let loader = TinyLoader::new(Duration::ZERO);
    let cfg = ServerConfig {
        api_key: Some("sekrit".into()),
        ..Default::default()
    };
    let server = three_models(loader, PoolConfig::default(), cfg).await;
    let addr = server.local_addr();
    let auth = [("Authorization", "Bearer sekrit")];
    let r = request(addr, "POST", "/v1/models/b/load", &[], b"").await;
    assert_eq!(r.status, 401);
    let r = request(addr, "POST", "/v1/models/b/load", &auth, b"").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["state"], "loaded");
    let r = request(addr, "GET", "/v1/models/b", &auth, b"").await;
    assert_eq!(r.json()["state"], "loaded");
    let r = request(addr, "POST", "/v1/models/b/unload", &[], b"").await;
    assert_eq!(r.status, 401);
    let r = request(addr, "POST", "/v1/models/b/unload", &auth, b"").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["state"], "unloaded");
    let r = request(addr, "GET", "/v1/models/b", &auth, b"").await;
    assert_eq!(r.json()["state"], "unloaded");
    let r = request(addr, "POST", "/v1/models/nope/unload", &auth, b"").await;
    assert_eq!(r.status, 404);
    let r = request(addr, "GET", "/v1/models/b/load", &auth, b"").await;
    assert_eq!(r.status, 405);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_wait_for_loads_and_failures_stay_with_their_request() {
    let loader = TinyLoader::new(Duration::from_millis(400));
    let extra = PoolConfig {
        models: vec![ModelSpec::new("broken"), ModelSpec::new("missing")],
        allowed: AllowedModels::Only(vec!["org/allowed".into()]),
        ..Default::default()
    };
    let server = three_models(Arc::clone(&loader), extra, Default::default()).await;
    let addr = server.local_addr();
    // Four requests at once: two for b while it loads (one load), one for the loaded a,
    // one for a model whose load fails.
    let (r1, r2, r3, r4) = tokio::join!(
        complete(addr, "b"),
        complete(addr, "b"),
        complete(addr, "a"),
        complete(addr, "broken"),
    );
    assert_eq!(r1.0, 200, "{}", r1.1);
    assert_eq!(r2.0, 200, "{}", r2.1);
    assert_eq!(r1.1["choices"][0]["text"], r2.1["choices"][0]["text"]);
    assert_eq!(r3.0, 200, "{}", r3.1);
    assert_eq!(r4.0, 500, "{}", r4.1);
    let msg = r4.1["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`broken` failed to load") && msg.contains("corrupt"),
        "{msg}"
    );
    assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
    let (status, body) = complete(addr, "missing").await;
    assert_eq!(status, 404, "{body}");
    // Not configured and not allowed: 404 without trying to load.
    let (status, body) = complete(addr, "org/other").await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--allowed-models"));
    // Allowed by name: loaded on demand (c stays unloaded, b is unloaded to make room).
    let (status, body) = complete(addr, "org/allowed").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "org/allowed");
    let s = states(addr).await;
    assert_eq!(state_of(&s, "org/allowed"), "loaded");
    assert_eq!(state_of(&s, "a"), "loaded");
    assert_eq!(state_of(&s, "broken"), "unloaded");
    // The server kept serving.
    assert_eq!(complete(addr, "a").await.0, 200);
    assert!(server.is_healthy());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_in_use_is_not_unloaded() {
    let loader = TinyLoader::new(Duration::ZERO);
    let server = three_models(loader, PoolConfig::default(), Default::default()).await;
    let addr = server.local_addr();
    assert_eq!(complete(addr, "b").await.0, 200);
    // A long stream on b keeps it in use: c cannot make room, unloading b gets 409.
    let mut stream = common::SseStream::open(
        addr,
        "/v1/completions",
        &json!({"model": "b", "prompt": "hello", "max_tokens": 4000, "stream": true}),
    )
    .await;
    assert!(stream.next_data().await.is_some());
    let r = request(addr, "POST", "/v1/models/b/unload", &[], b"").await;
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
    let (status, body) = complete(addr, "c").await;
    assert_eq!(status, 503, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("`b`") && msg.contains("in use"), "{msg}");
    drop(stream);
    // Once the stream is gone, b can be unloaded and c loads.
    let mut ok = false;
    for _ in 0..100 {
        if complete(addr, "c").await.0 == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "c never loaded after b's stream ended");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn per_request_adapters_are_served_by_the_model_loaded_with_them() {
    let loader = TinyLoader::new(Duration::ZERO);
    let extra = PoolConfig {
        allowed: AllowedModels::Only(vec!["/adapters/one".into()]),
        ..Default::default()
    };
    let server = three_models(Arc::clone(&loader), extra, Default::default()).await;
    let addr = server.local_addr();
    let ask = |adapters: &str| {
        json!({"model": "b", "prompt": "Once upon a time", "max_tokens": 4,
               "adapters": adapters})
    };
    let r = post(addr, "/v1/completions", &ask("/adapters/one")).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["model"], "b");
    let r = post(addr, "/v1/completions", &ask("/adapters/one")).await;
    assert_eq!(r.status, 200);
    // Loaded once, as b's path with the adapters.
    assert_eq!(
        *loader.seen.lock().unwrap(),
        vec![(
            "b@/adapters/one".to_string(),
            Some("/adapters/one".to_string())
        )]
    );
    let m = get(addr, "/v1/models/b@/adapters/one").await.json();
    assert_eq!(m["state"], "loaded", "{m}");
    assert_eq!(m["adapters"], "/adapters/one");
    // Adapters that are not allowed: 400 naming the field, nothing loaded.
    let r = post(addr, "/v1/completions", &ask("/adapters/two")).await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["param"], "adapters");
    assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
    server.shutdown().await.unwrap();
}

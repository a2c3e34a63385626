//! The prompt cache beyond one process (tiny model on the CPU): the disk tier
//! (`--prompt-cache-dir`) is found again after a restart and gives the same tokens as no
//! cache; truncated and damaged files are ignored and removed; the byte budget evicts the
//! least recently used files; `--prompt-cache-file` and `--warm-prompt` fill the cache
//! before the first request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

/// Token ids and log-probabilities of a chat answer, and its cached prompt tokens.
struct Answer {
    ids: Vec<u64>,
    logprobs: Vec<f64>,
    cached: u64,
    prompt_tokens: u64,
}

async fn answer(addr: std::net::SocketAddr, prompt: &str) -> Answer {
    let body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8,
        "temperature": 0.0,
        "logprobs": true,
    });
    let r = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs in {v}"))
        .clone();
    Answer {
        ids: content.iter().map(|c| c["id"].as_u64().unwrap()).collect(),
        logprobs: content
            .iter()
            .map(|c| c["logprob"].as_f64().unwrap())
            .collect(),
        cached: v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap(),
    }
}

fn with_dir(dir: &Path) -> ServerConfig {
    ServerConfig {
        prompt_cache_dir: Some(dir.to_path_buf()),
        ..Default::default()
    }
}

/// The answers of a server without any prompt cache.
async fn uncached(prompts: &[&str]) -> Vec<Answer> {
    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        prompt_cache_size: 0,
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let mut out = Vec::new();
    for p in prompts {
        out.push(answer(server.local_addr(), p).await);
    }
    server.shutdown().await.unwrap();
    out
}

fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

const PROMPTS: [&str; 3] = [
    "Why is the sky blue? Explain it to a child in three sentences.",
    "Write a short poem about a lighthouse keeper and the sea.",
    "List three facts about the moon and one about the sun.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_finds_its_disk_cache_and_answers_the_same() {
    let want = uncached(&PROMPTS[..1]).await;
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny_model();
    let server = start(model, tok, with_dir(dir.path())).await;
    let first = answer(server.local_addr(), PROMPTS[0]).await;
    assert_eq!(first.cached, 0);
    assert_eq!(first.ids, want[0].ids);
    server.shutdown().await.unwrap();
    assert_eq!(
        cache_files(dir.path()).len(),
        1,
        "one file per stored prompt"
    );

    let (model, tok) = tiny_model();
    let server = start(model, tok, with_dir(dir.path())).await;
    let again = answer(server.local_addr(), PROMPTS[0]).await;
    assert_eq!(
        again.cached,
        again.prompt_tokens - 1,
        "the cache from disk covers the prompt but its last token"
    );
    assert_eq!(again.ids, want[0].ids, "same tokens as without a cache");
    assert_eq!(again.logprobs, first.logprobs);
    let m = String::from_utf8(get(server.local_addr(), "/metrics").await.body).unwrap();
    assert!(
        m.contains("mlx_server_prompt_cache_disk_hits_total 1"),
        "{m}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn truncated_and_damaged_cache_files_are_ignored_and_removed() {
    let want = uncached(&PROMPTS[..2]).await;
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny_model();
    let server = start(model, tok, with_dir(dir.path())).await;
    for p in &PROMPTS[..2] {
        answer(server.local_addr(), p).await;
    }
    server.shutdown().await.unwrap();
    let files = cache_files(dir.path());
    assert_eq!(files.len(), 2);
    // One file loses its tail; the other keeps its length but its header is garbage.
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() / 2]).unwrap();
    let mut bytes = std::fs::read(&files[1]).unwrap();
    bytes[8..40].fill(b'#');
    std::fs::write(&files[1], &bytes).unwrap();

    let (model, tok) = tiny_model();
    let server = start(model, tok, with_dir(dir.path())).await;
    for f in &files {
        assert!(!f.exists(), "{} should be removed", f.display());
    }
    // Nothing came from disk: the first prompt finds nothing, the second only the chat
    // template's opening that it shares with the first (from memory).
    let shared = template_prefix(PROMPTS[0], PROMPTS[1]);
    for ((p, w), cached) in PROMPTS[..2].iter().zip(&want).zip([0, shared]) {
        let a = answer(server.local_addr(), p).await;
        assert_eq!(a.cached, cached, "{p}: nothing usable was left on disk");
        assert_eq!(a.ids, w.ids, "{p}");
    }
    let m = String::from_utf8(get(server.local_addr(), "/metrics").await.body).unwrap();
    assert!(
        m.contains("mlx_server_prompt_cache_disk_hits_total 0"),
        "{m}"
    );
    server.shutdown().await.unwrap();
    assert_eq!(cache_files(dir.path()).len(), 2, "written again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_disk_budget_evicts_the_least_recently_used_files() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny_model();
    let server = start(model, tok, with_dir(dir.path())).await;
    answer(server.local_addr(), PROMPTS[0]).await;
    server.shutdown().await.unwrap();
    let one = std::fs::metadata(&cache_files(dir.path())[0])
        .unwrap()
        .len();

    // Room for about two files like the first.
    let budget = one * 2 + one / 3;
    let cfg = |d: &Path| ServerConfig {
        prompt_cache_disk_bytes: budget,
        ..with_dir(d)
    };
    let (model, tok) = tiny_model();
    let server = start(model, tok, cfg(dir.path())).await;
    for p in &PROMPTS[1..] {
        answer(server.local_addr(), p).await;
    }
    server.shutdown().await.unwrap();
    let files = cache_files(dir.path());
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(total <= budget, "{total} bytes on disk, budget {budget}");
    assert_eq!(files.len(), 2, "{files:?}");

    let (model, tok) = tiny_model();
    let server = start(model, tok, cfg(dir.path())).await;
    let addr = server.local_addr();
    // The newest stayed; the oldest went: only the chat template's opening, shared
    // with the others, is found for it.
    let newest = answer(addr, PROMPTS[2]).await;
    assert_eq!(newest.cached, newest.prompt_tokens - 1);
    let oldest = answer(addr, PROMPTS[0]).await;
    assert_eq!(oldest.cached, template_prefix(PROMPTS[0], PROMPTS[1]));
    server.shutdown().await.unwrap();
}

/// The tokens that the chat prompts of `a` and `b` share.
fn template_prefix(a: &str, b: &str) -> u64 {
    let tok = tokenizer();
    let (a, b) = (chat_tokens(&tok, a), chat_tokens(&tok, b));
    a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64
}

/// The chat prompt of `text` as the server renders it.
fn chat_tokens(tok: &mlx_tokenizer::Tokenizer, text: &str) -> Vec<u32> {
    let messages = vec![json!({"role": "user", "content": text})];
    let opts = mlx_tokenizer::ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    tok.apply_chat_template_ids(&messages, &opts).unwrap()
}

/// A prompt-cache file like mlx-cache-prompt's: `tokens` through the model, saved with
/// the model name and the tokens in the metadata.
fn write_prompt_cache_file(path: &Path, tokens: &[u32], with_tokens: bool) {
    let (model, _) = tiny_model();
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None).unwrap();
    let x = mlx_array::Array::from_slice(tokens, &[1, tokens.len() as i32]).unwrap();
    model.forward(&x, &mut caches).unwrap();
    let state: Vec<_> = caches.iter().flat_map(|c| c.state()).collect();
    mlx_array::transforms::eval(&state.iter().collect::<Vec<_>>()).unwrap();
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("model".to_string(), "default_model".to_string());
    if with_tokens {
        meta.insert("tokens".to_string(), mlx_cache::encode_tokens(tokens));
    }
    mlx_cache::save_prompt_cache(path, &caches, &meta).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_cache_file_is_preloaded_and_answers_the_same() {
    let want = uncached(&PROMPTS[..1]).await;
    let tok = tokenizer();
    let full = chat_tokens(&tok, PROMPTS[0]);
    let prefix = &full[..full.len() - 4];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.safetensors");
    write_prompt_cache_file(&file, prefix, true);

    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        prompt_cache_file: Some(file.clone()),
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let a = answer(server.local_addr(), PROMPTS[0]).await;
    assert_eq!(a.cached as usize, prefix.len());
    assert_eq!(a.ids, want[0].ids, "same tokens as without a cache");
    server.shutdown().await.unwrap();

    // A file of mlx_lm.cache_prompt records no tokens: refused, saying so.
    write_prompt_cache_file(&file, prefix, false);
    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        prompt_cache_file: Some(file.clone()),
        port: 0,
        ..Default::default()
    };
    let err = match mlx_server::Server::start(cfg, model, tok).await {
        Ok(_) => panic!("a file without tokens was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("mlx-cache-prompt"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn warm_prompts_are_prefilled_before_the_first_request() {
    let want = uncached(&PROMPTS[..2]).await;
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("warm.txt");
    std::fs::write(&text, "unused: a text warm prompt").unwrap();
    let chat = dir.path().join("warm.json");
    let body: Json = json!({"messages": [{"role": "user", "content": PROMPTS[1]}]});
    std::fs::write(&chat, body.to_string()).unwrap();
    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        warm_prompts: vec![text, chat],
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let a = answer(server.local_addr(), PROMPTS[1]).await;
    assert_eq!(
        a.cached,
        a.prompt_tokens - 1,
        "the warm chat prompt is cached"
    );
    assert_eq!(a.ids, want[1].ids);
    let b = answer(server.local_addr(), PROMPTS[0]).await;
    assert_eq!(b.ids, want[0].ids);
    server.shutdown().await.unwrap();

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"messages\": 3}").unwrap();
    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        warm_prompts: vec![bad],
        port: 0,
        ..Default::default()
    };
    let err = match mlx_server::Server::start(cfg, model, tok).await {
        Ok(_) => panic!("a bad warm prompt was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("--warm-prompt") && err.contains("messages"),
        "{err}"
    );
}

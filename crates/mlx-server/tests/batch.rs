//! Batched decoding in the server (tiny model on the CPU): requests with their own
//! sampler settings, logits processors, seeds and log-probabilities decode in one batch
//! and each gets exactly what it gets alone, also when prompts are prefilled together in
//! right-padded chunks; a finished row's KV cache, extracted from the batch, is stored
//! and reused by a later prompt; sliding-window (rotating) caches wrap inside the batch;
//! models whose layers share caches (fewer caches than layers) batch too.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};

/// Token ids and log-probabilities (with the top alternatives) of a chat answer.
type Answer = (Vec<u64>, Vec<f64>, Vec<Vec<(u64, f64)>>);

async fn answer(addr: std::net::SocketAddr, body: &Json) -> Answer {
    let r = post(addr, "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs in {v}"))
        .clone();
    let ids = content.iter().map(|c| c["id"].as_u64().unwrap()).collect();
    let lps = content
        .iter()
        .map(|c| c["logprob"].as_f64().unwrap())
        .collect();
    let tops = content
        .iter()
        .map(|c| {
            c["top_logprobs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| (t["id"].as_u64().unwrap(), t["logprob"].as_f64().unwrap()))
                .collect()
        })
        .collect();
    (ids, lps, tops)
}

fn request(prompt: &str, extra: Json) -> Json {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 10,
        "temperature": 0.0,
        "logprobs": true,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_requests_decode_together_exactly_as_alone() {
    let (model, tok) = tiny_model();
    let cfg = ServerConfig {
        prompt_cache_size: 0,
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let addr = server.local_addr();
    let first = request("Name three rivers.", json!({"top_logprobs": 3}));
    let plain = answer(addr, &first).await;
    // Banning the second token changes the answer from there on.
    let banned = plain.0[1].to_string();
    let bodies = [
        first,
        request(
            "Name three rivers.",
            json!({"repetition_penalty": 1.4, "logit_bias": {banned: -100.0}}),
        ),
        request(
            "Tell me a story about a fox.",
            json!({"temperature": 0.9, "top_p": 0.9, "seed": 42}),
        ),
        request(
            "Count to five.",
            json!({"temperature": 0.7, "top_k": 20, "seed": 3, "presence_penalty": 0.5}),
        ),
        request(
            "Count to five.",
            json!({"frequency_penalty": 0.8, "max_tokens": 6}),
        ),
    ];
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(answer(addr, b).await);
    }
    assert_eq!(alone[0], plain);
    assert_eq!(
        alone[0].0[..1],
        alone[1].0[..1],
        "the bias leaves the first token"
    );
    assert_ne!(
        alone[0].0[1], alone[1].0[1],
        "the bias bans the second token"
    );
    assert_eq!(alone[0].2.iter().map(Vec::len).max(), Some(3));
    let decode_stats = || async {
        (
            metric(addr, "mlx_server_decode_steps_total").await,
            metric(addr, "mlx_server_decode_rows_total").await,
        )
    };
    let (steps0, rows0) = decode_stats().await;
    assert_eq!(steps0, rows0, "alone, every step decodes one sequence");
    let tasks: Vec<_> = (0..3 * bodies.len())
        .map(|k| {
            let body = bodies[k % bodies.len()].clone();
            tokio::spawn(async move { (k % 5, answer(addr, &body).await) })
        })
        .collect();
    for t in tasks {
        let (i, got) = t.await.unwrap();
        assert_eq!(got.0, alone[i].0, "request {i}: tokens differ from alone");
        assert_eq!(got.1, alone[i].1, "request {i}: logprobs differ from alone");
        let sorted = |t: &Vec<Vec<(u64, f64)>>| {
            t.iter()
                .map(|v| {
                    let mut v = v.clone();
                    v.sort_by_key(|a| a.0);
                    v
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            sorted(&got.2),
            sorted(&alone[i].2),
            "request {i}: top logprobs"
        );
    }
    let (steps, rows) = decode_stats().await;
    let (steps, rows) = (steps - steps0, rows - rows0);
    assert!(
        rows >= 3.0 * steps,
        "15 concurrent requests were not decoded together: {rows} rows in {steps} steps"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caches_extracted_from_the_batch_are_reused() {
    let (model, tok) = tiny_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let addr = server.local_addr();
    let prompts = [
        "Why is the sky blue?",
        "What is rust?",
        "Say something nice.",
    ];
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let body = request(p, json!({"max_tokens": 8}));
            tokio::spawn(async move { answer(addr, &body).await })
        })
        .collect();
    let mut first = Vec::new();
    for t in tasks {
        first.push(t.await.unwrap());
    }
    for (p, want) in prompts.iter().zip(&first) {
        let body = request(p, json!({"max_tokens": 8}));
        let r = post(addr, "/v1/chat/completions", &body).await.json();
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            cached,
            prompt_tokens - 1,
            "{p}: the stored cache covers the prompt"
        );
        let again = answer(addr, &body).await;
        assert_eq!(again.0, want.0, "{p}: same tokens from the cached prefix");
        assert_eq!(again.1, want.1, "{p}: same logprobs from the cached prefix");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prompts_prefilled_together_in_padded_chunks_answer_as_alone() {
    let (model, tok) = tiny_model();
    // Chunks of 5 tokens: every prompt takes several, of different lengths, so the
    // rows are right-padded and leave the prefill batch at different loops.
    let cfg = ServerConfig {
        prefill_step_size: 5,
        prompt_concurrency: 4,
        prompt_cache_size: 0,
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let addr = server.local_addr();
    let prompts = [
        "Hi.",
        "What is the tallest mountain on Earth?",
        "Write one sentence about the ocean, the wind and the moon at night.",
        "Why?",
        "List the planets of the solar system in order from the sun outwards.",
        "Name a color.",
    ];
    let bodies: Vec<Json> = prompts
        .iter()
        .map(|p| request(p, json!({"max_tokens": 6})))
        .collect();
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(answer(addr, b).await);
    }
    let tasks: Vec<_> = bodies
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, body)| tokio::spawn(async move { (i, answer(addr, &body).await) }))
        .collect();
    for t in tasks {
        let (i, got) = t.await.unwrap();
        assert_eq!(got.0, alone[i].0, "prompt {i}: tokens differ from alone");
        assert_eq!(got.1, alone[i].1, "prompt {i}: logprobs differ from alone");
    }
    server.shutdown().await.unwrap();
}

/// The tiny model with a sliding window of 8 on its first layer (rotating caches).
fn sliding_model() -> (Box<dyn mlx_models::LanguageModel>, mlx_tokenizer::Tokenizer) {
    let src = tiny_model_dir();
    let dir = common::shared_dir("tiny-llama-sliding", include_str!("batch.rs"), |dir| {
        for f in [
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let text = std::fs::read_to_string(src.join("config.json")).unwrap();
        let mut config: Json = serde_json::from_str(&text).unwrap();
        config["layer_types"] = json!(["sliding_attention", "full_attention"]);
        config["sliding_window"] = json!(8);
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    });
    let (model, _) = mlx_models::load_model(&dir).expect("loading the sliding model");
    let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).expect("tokenizer");
    (model, tok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_window_rows_wrap_in_the_batch_and_answer_as_alone() {
    let (model, tok) = sliding_model();
    assert!(matches!(
        model.cache_specs()[0],
        mlx_models::CacheSpec::Rotating { max_size: 8, .. }
    ));
    let cfg = ServerConfig {
        prefill_step_size: 6,
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let addr = server.local_addr();
    let prompts = [
        "Tell me about the moon.",
        "What is two plus two?",
        "Describe a long walk along a windy beach in winter.",
        "Hello!",
    ];
    // 12 tokens after prompts of 10-20: every window wraps while decoding.
    let bodies: Vec<Json> = prompts
        .iter()
        .map(|p| request(p, json!({"max_tokens": 12})))
        .collect();
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(answer(addr, b).await);
    }
    let n = bodies.len();
    let tasks: Vec<_> = (0..2 * n)
        .map(|k| {
            let body = bodies[k % n].clone();
            tokio::spawn(async move { (k % n, answer(addr, &body).await) })
        })
        .collect();
    for t in tasks {
        let (i, got) = t.await.unwrap();
        // Same tokens; the log-probabilities agree to float rounding (a wrapped batch
        // buffer holds the window in another order than a single sequence's).
        assert_eq!(got.0, alone[i].0, "prompt {i}: tokens differ from alone");
        for (g, w) in got.1.iter().zip(&alone[i].1) {
            assert!((g - w).abs() < 1e-4, "prompt {i}: logprob {g} vs {w} alone");
        }
    }
    // A prompt continuing one of them reuses the rotating caches extracted from the
    // batch (a sliding-window cache past its window is not trimmable, so only a stored
    // entry that is a prefix of the new prompt can serve).
    let messages = json!([{"role": "user", "content": prompts[2]}]);
    let opts = mlx_tokenizer::ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let mut ids: Vec<u64> = tokenizer()
        .apply_chat_template_ids(messages.as_array().unwrap(), &opts)
        .unwrap()
        .into_iter()
        .map(u64::from)
        .collect();
    let stored = ids.len() + alone[2].0.len();
    ids.extend(&alone[2].0);
    ids.extend([785, 3974, 13]);
    let body = json!({"prompt": ids, "max_tokens": 4, "temperature": 0});
    let r = post(addr, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(stored as u64),
        "{v}"
    );
    server.shutdown().await.unwrap();
}

/// A tiny Llama 4 (random weights, the test tokenizer's vocabulary): three chunked
/// layers with a chunk of 8 positions, then a global one.
fn llama4_model() -> (Box<dyn mlx_models::LanguageModel>, mlx_tokenizer::Tokenizer) {
    let src = tiny_model_dir();
    let dir = common::shared_dir("tiny-llama4", include_str!("batch.rs"), |dir| {
        let text = std::fs::read_to_string(src.join("config.json")).unwrap();
        let vocab = serde_json::from_str::<Json>(&text).unwrap()["vocab_size"].clone();
        let config = json!({
            "model_type": "llama4",
            "text_config": {
                "model_type": "llama4_text", "attention_bias": false, "attention_chunk_size": 8,
                "head_dim": 16, "hidden_size": 64, "interleave_moe_layer_step": 2,
                "intermediate_size": 32, "intermediate_size_mlp": 64,
                "max_position_embeddings": 4096, "num_attention_heads": 4,
                "num_experts_per_tok": 1, "num_hidden_layers": 4, "num_key_value_heads": 2,
                "num_local_experts": 4, "rms_norm_eps": 1e-5, "rope_scaling": null,
                "rope_theta": 500000.0, "use_qk_norm": true, "vocab_size": vocab,
                "floor_scale": 8
            }
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let arch = mlx_models::build_model(&config).unwrap();
        let key = mlx_array::random::key(7).unwrap();
        let params = arch.parameters();
        let keys = mlx_array::random::split(&key, params.len() as i32).unwrap();
        let weights: Vec<(String, mlx_array::Array)> = params
            .iter()
            .enumerate()
            .map(|(i, (name, p))| {
                let shape = p.shape();
                let w = if name.ends_with("norm.weight") {
                    mlx_array::ops::ones(&shape, mlx_array::Dtype::Float32).unwrap()
                } else {
                    let k = keys
                        .slice(&[i as i32, 0], &[i as i32 + 1, 2], None)
                        .unwrap()
                        .squeeze(Some(&[0]))
                        .unwrap();
                    let s = mlx_array::Array::from_slice(&[0.3f32], &[1]).unwrap();
                    let d = mlx_array::Dtype::Float32;
                    mlx_array::random::normal(&shape, d, None, Some(&s), Some(&k)).unwrap()
                };
                (name.clone(), w)
            })
            .collect();
        let refs: Vec<(&str, &mlx_array::Array)> =
            weights.iter().map(|(k, v)| (k.as_str(), v)).collect();
        mlx_array::io::save_safetensors(dir.join("model.safetensors"), refs, [("format", "mlx")])
            .unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    });
    let (model, _) = mlx_models::load_model(&dir).expect("loading the llama4 model");
    let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).expect("tokenizer");
    (model, tok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chunked_attention_models_serve_concurrent_requests_one_at_a_time_as_alone() {
    let (model, tok) = llama4_model();
    assert!(matches!(
        model.cache_specs()[0],
        mlx_models::CacheSpec::Chunked { chunk_size: 8 }
    ));
    // mlx-lm's ChunkedKVCache has no `merge`: its server does not batch such models.
    let chunked = mlx_cache::make_prompt_cache(&model.cache_specs(), None).unwrap();
    assert!(!mlx_cache::is_batchable(chunked[0].as_ref()));
    let server = start(model, tok, ServerConfig::default()).await;
    let addr = server.local_addr();
    let prompts = [
        "Tell me about the moon.",
        "Describe a long walk along a windy beach in winter.",
        "Hello!",
    ];
    // Prompts and answers longer than the chunk: the caches drop their front.
    let bodies: Vec<Json> = prompts
        .iter()
        .map(|p| request(p, json!({"max_tokens": 12})))
        .collect();
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(answer(addr, b).await);
    }
    let n = bodies.len();
    let tasks: Vec<_> = (0..2 * n)
        .map(|k| {
            let body = bodies[k % n].clone();
            tokio::spawn(async move { (k % n, answer(addr, &body).await) })
        })
        .collect();
    for t in tasks {
        let (i, got) = t.await.unwrap();
        assert_eq!(got.0, alone[i].0, "prompt {i}: tokens differ from alone");
        assert_eq!(got.1, alone[i].1, "prompt {i}: logprobs differ from alone");
    }
    let steps = metric(addr, "mlx_server_decode_steps_total").await;
    let rows = metric(addr, "mlx_server_decode_rows_total").await;
    assert!(steps > 0.0);
    assert_eq!(steps, rows, "every decoding step ran one sequence");
}

/// The text of a greedy completion of `ids` (token ids, no template).
async fn complete_ids(addr: std::net::SocketAddr, ids: &[u64], max_tokens: u64) -> String {
    let body = json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0});
    let r = post(addr, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Gemma 4's layers share KV caches (the model has fewer caches than layers, a
/// sliding window of 4 among them): requests decoded together in the server's batch
/// answer as they do alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shared_kv_cache_models_batch_and_answer_as_alone() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for name in [
        "gemma4_text-small-f32-moe",
        "gemma4_text-small-f32",
        "gemma3n-small-f32",
    ] {
        let dir = root.join("goldens/models").join(name);
        let (model, _) = mlx_models::load_model(&dir).expect("golden model");
        // The MoE layout shares no caches but has sliding and full layers with their
        // own head sizes and keys as values.
        let shares = !name.ends_with("-moe");
        assert_eq!(
            model.cache_specs().len() < model.num_layers(),
            shares,
            "{name}"
        );
        let tok = mlx_tokenizer::Tokenizer::from_dir(root.join("goldens/generate/tokenizer"))
            .expect("tokenizer");
        let cfg = ServerConfig {
            prefill_step_size: 3,
            prompt_cache_size: 0,
            ..Default::default()
        };
        let server = start(model, tok, cfg).await;
        let addr = server.local_addr();
        let prompts: Vec<Vec<u64>> = [5u64, 1, 9, 7, 3]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                (0..n)
                    .map(|j| (i as u64 * 31 + j * 17 + 3) % 120 + 1)
                    .collect()
            })
            .collect();
        let mut alone = Vec::new();
        for p in &prompts {
            alone.push(complete_ids(addr, p, 8).await);
        }
        assert!(
            alone.iter().any(|t| !t.is_empty()),
            "{name}: no text at all"
        );
        let tasks: Vec<_> = prompts
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, p)| tokio::spawn(async move { (i, complete_ids(addr, &p, 8).await) }))
            .collect();
        for t in tasks {
            let (i, got) = t.await.unwrap();
            assert_eq!(got, alone[i], "{name} prompt {i}: differs from alone");
        }
        server.shutdown().await.unwrap();
    }
}

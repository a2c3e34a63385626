//! The server's tokens equal the engine's `generate_step` port (mlx-lm's op sequence)
//! for the same prompt, with plain and quantized KV caches, and a follow-up that reuses
//! the prompt cache still answers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_engine::{GenerateOptions, KvQuantization, TokenGenerator, TokenIterator};
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};

/// Greedy tokens of `mlx_engine::TokenGenerator` (no EOS handling: `max` tokens).
fn engine_tokens(prompt: &[u32], max: usize, kv: Option<KvQuantization>) -> Vec<u32> {
    let (model, _tok) = tiny_model();
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None).unwrap();
    let opts = GenerateOptions {
        max_tokens: max as i64,
        kv_quantization: kv,
        ..Default::default()
    };
    let mut gen = TokenGenerator::new(model.as_ref(), prompt, &mut caches, opts).unwrap();
    let mut out = Vec::new();
    while let Some((t, _)) = gen.next_token().unwrap() {
        out.push(t);
    }
    out
}

/// A completion whose prompt is given as token ids.
async fn completion(addr: std::net::SocketAddr, prompt: &[u32], max: usize) -> Json {
    let body = json!({"prompt": prompt, "max_tokens": max, "temperature": 0});
    let r = post(addr, "/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

async fn chat_ids(addr: std::net::SocketAddr, messages: &Json, max: usize) -> (Vec<u32>, Json) {
    let body = json!({"messages": messages, "max_tokens": max, "logprobs": true});
    let v = post(addr, "/v1/chat/completions", &body).await.json();
    let ids = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap() as u32)
        .collect();
    (ids, v)
}

#[tokio::test(flavor = "multi_thread")]
async fn server_tokens_equal_the_engine_generate_loop() {
    let tok = tokenizer();
    let messages = json!([{"role": "user", "content": "Tell me about the moon."}]);
    let prompt = tok
        .apply_chat_template_ids(
            messages.as_array().unwrap(),
            &mlx_tokenizer::ChatOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    for kv in [
        None,
        Some(KvQuantization {
            bits: 8,
            group_size: 32,
            start: 0,
        }),
    ] {
        let want = engine_tokens(&prompt, 12, kv);
        let (model, tok) = tiny_model();
        let cfg = ServerConfig {
            kv_bits: kv.map(|q| q.bits),
            kv_group_size: 32,
            quantized_kv_start: 0,
            ..Default::default()
        };
        let server = start(model, tok, cfg).await;
        let addr = server.local_addr();
        let (got, v) = chat_ids(addr, &messages, 12).await;
        assert_eq!(got, want, "kv {kv:?}: {v}");
        let v = completion(addr, &prompt, 4).await;
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 4);
        // A follow-up turn: its prefix comes from the prompt cache.
        let mut follow = messages.as_array().unwrap().clone();
        follow.push(json!({"role": "assistant", "content": v["choices"][0]["text"]}));
        follow.push(json!({"role": "user", "content": "And the sun?"}));
        let (ids, v) = chat_ids(addr, &Json::Array(follow), 6).await;
        assert_eq!(ids.len(), 6, "{v}");
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached >= prompt.len() as u64,
            "cached {cached} of a {}-token shared prefix",
            prompt.len()
        );
        server.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_parameters_take_effect_and_seeds_reproduce() {
    let (model, tok) = tiny_model();
    let server = start(
        model,
        tok,
        ServerConfig {
            prompt_cache_size: 0,
            ..Default::default()
        },
    )
    .await;
    let addr = server.local_addr();
    let messages = json!([{"role": "user", "content": "Pick some words."}]);
    let ask = |extra: Json| {
        let mut body = json!({"messages": messages, "max_tokens": 8, "logprobs": true});
        if let (Some(b), Json::Object(e)) = (body.as_object_mut(), extra) {
            b.extend(e);
        }
        async move {
            let v = post(addr, "/v1/chat/completions", &body).await.json();
            let ids: Vec<u64> = v["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap_or_else(|| panic!("{v}"))
                .iter()
                .map(|c| c["id"].as_u64().unwrap())
                .collect();
            ids
        }
    };
    let greedy = ask(json!({})).await;
    assert_eq!(greedy.len(), 8);
    // top_k = 1 keeps only the argmax, whatever the temperature.
    assert_eq!(ask(json!({"temperature": 1.5, "top_k": 1})).await, greedy);
    // A seed reproduces a sampled answer, alone or among other seeded requests.
    let seeded = ask(json!({"temperature": 1.0, "seed": 7})).await;
    assert_eq!(ask(json!({"temperature": 1.0, "seed": 7})).await, seeded);
    assert_ne!(
        ask(json!({"temperature": 1.0, "seed": 8})).await,
        seeded,
        "another seed, another answer"
    );
    let together: Vec<_> = (0..4)
        .map(|i| tokio::spawn(ask(json!({"temperature": 1.0, "seed": 7 + (i % 2)}))))
        .collect();
    let mut outs = Vec::new();
    for t in together {
        outs.push(t.await.unwrap());
    }
    assert_eq!(outs[0], seeded);
    assert_eq!(outs[2], seeded);
    assert_eq!(outs[1], outs[3]);
    // A large logit bias forces its token.
    let forced = ask(json!({"logit_bias": {"1000": 1000.0}})).await;
    assert_eq!(forced, vec![1000; 8]);
    // Penalties run through mlx-sample's processors.
    let penalized =
        ask(json!({"repetition_penalty": 5.0, "presence_penalty": 2.0, "frequency_penalty": 2.0}))
            .await;
    assert_eq!(penalized.len(), 8);
    server.shutdown().await.unwrap();
}

/// mlx-lm 0.32.2's greedy answer with the default model (SmolLM2-135M-Instruct as
/// converted by mlx-hub) to this chat, from `mlx_lm.generate.stream_generate` over the
/// chat-templated prompt (37 tokens), `max_tokens=12`.
const MLX_LM_FRANCE: &str = "The capital of France is Paris.";

#[tokio::test(flavor = "multi_thread")]
async fn default_model_answers_like_mlx_lm() {
    let (model, tok) = default_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12});
    let v = post(server.local_addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], MLX_LM_FRANCE, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 37);
    server.shutdown().await.unwrap();
}

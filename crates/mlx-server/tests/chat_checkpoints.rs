//! Prompt-cache checkpoints at message boundaries (mlx-lm's prompt segments): the
//! second turn of a conversation whose chat template drops earlier reasoning (Qwen3's)
//! reuses the first turn's system prompt and user message, and another conversation
//! with the same system prompt reuses that, even when the caches cannot be trimmed
//! (a sliding-window layer past its window), with the same tokens as without a cache.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_server::ServerConfig;
use serde_json::{json, Value as Json};

/// The tiny model with a sliding window of 8 on its first layer: its caches past the
/// window cannot be trimmed, so only stored prefixes of a new prompt can serve it.
fn sliding_model() -> (Box<dyn mlx_models::LanguageModel>, mlx_tokenizer::Tokenizer) {
    let src = tiny_model_dir();
    let dir = shared_dir(
        "tiny-llama-sliding-checkpoints",
        include_str!("chat_checkpoints.rs"),
        |dir| {
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
        },
    );
    let (model, _) = mlx_models::load_model(&dir).expect("loading the sliding model");
    (model, mlx_tokenizer::Tokenizer::from_dir(&dir).unwrap())
}

/// Token ids and cached prompt tokens of a chat answer.
async fn chat(addr: std::net::SocketAddr, messages: &Json) -> (Vec<u64>, u64, String) {
    let body = json!({
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0.0,
        "logprobs": true,
    });
    let r = post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let ids = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (ids, cached, text)
}

fn prompt_ids(messages: &Json) -> Vec<u32> {
    let opts = mlx_tokenizer::ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    tokenizer()
        .apply_chat_template_ids(messages.as_array().unwrap(), &opts)
        .unwrap()
}

const SYSTEM: &str = "You are a careful assistant who answers in one short sentence.";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_second_turn_reuses_the_first_turns_system_prompt_and_user_message() {
    let turn1 = json!([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What colour is the sky on a clear day?"},
    ]);
    let turn2 = json!([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What colour is the sky on a clear day?"},
        {"role": "assistant", "content": "<think>\nThe user asks about the sky.\n</think>\n\nBlue."},
        {"role": "user", "content": "And at night?"},
    ]);
    let other = json!([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a large ocean."},
    ]);
    let (p1, p2, p3) = (prompt_ids(&turn1), prompt_ids(&turn2), prompt_ids(&other));
    // The template drops the first answer's reasoning, and renders the first turn as
    // it was (up to its generation prompt's last token).
    let text2 = tokenizer().decode(&p2, false).unwrap();
    assert!(!text2.contains("The user asks"), "{text2}");
    assert!(p2.starts_with(&p1[..p1.len() - 1]));
    let system_end = p1.iter().zip(&p3).take_while(|(a, b)| a == b).count();

    let (model, tok) = sliding_model();
    let cfg = ServerConfig {
        prompt_cache_size: 0,
        ..Default::default()
    };
    let server = start(model, tok, cfg).await;
    let want2 = chat(server.local_addr(), &turn2).await.0;
    let want3 = chat(server.local_addr(), &other).await.0;
    server.shutdown().await.unwrap();

    let (model, tok) = sliding_model();
    let server = start(model, tok, ServerConfig::default()).await;
    let addr = server.local_addr();
    let (_, cached, _) = chat(addr, &turn1).await;
    assert_eq!(cached, 0);
    let (ids, cached, _) = chat(addr, &turn2).await;
    assert_eq!(
        cached as usize,
        p1.len() - 1,
        "turn 2 reuses turn 1's system prompt and user message"
    );
    assert_eq!(ids, want2, "same tokens as without a cache");
    let (ids, cached, _) = chat(addr, &other).await;
    assert_eq!(cached as usize, system_end, "the system prompt is reused");
    assert_eq!(ids, want3, "same tokens as without a cache");
    server.shutdown().await.unwrap();
}

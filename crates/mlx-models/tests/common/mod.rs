//! Shared helpers: tiny configs and random weights.
#![allow(dead_code)]
use mlx_array::{random, Array, Dtype};
use mlx_models::{build_model, Architecture, LanguageModel};
use mlx_nn::{KvCache, Module};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A tiny config of each architecture.
pub fn tiny(model_type: &str) -> Value {
    let mut c = json!({
        "model_type": model_type,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 64,
        "max_position_embeddings": 128,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "head_dim": 8,
    });
    let extra = match model_type {
        "llama" => {
            json!({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 3})
        }
        "gemma2" => json!({"query_pre_attn_scalar": 8.0}),
        "gemma3_text" => {
            json!({"query_pre_attn_scalar": 8.0, "sliding_window": 3, "sliding_window_pattern": 2})
        }
        "qwen3_moe" => json!({"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                              "mlp_only_layers": [0], "moe_intermediate_size": 16, "norm_topk_prob": true}),
        "mixtral" => json!({"num_local_experts": 4, "num_experts_per_tok": 2}),
        _ => json!({}),
    };
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    if model_type == "gemma3" {
        let mut text = tiny("gemma3_text");
        text["model_type"] = json!("gemma3_text");
        return json!({"model_type": "gemma3", "vocab_size": 64, "text_config": text});
    }
    c
}

/// Random weights for every parameter of `model` (norm weights near one).
pub fn random_weights(model: &dyn Module, seed: u64) -> BTreeMap<String, Array> {
    let key = random::key(seed).unwrap();
    let shapes = model.parameter_shapes();
    let keys = random::split(&key, shapes.len() as i32).unwrap();
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let k = keys
                .take(&Array::scalar(i as i32).unwrap(), Some(0))
                .unwrap();
            let scale = Array::scalar(0.3f32).unwrap();
            let mut w =
                random::normal(&shape, Dtype::Float32, None, Some(&scale), Some(&k)).unwrap();
            if name.ends_with("norm.weight") {
                w = w.add(1.0f32).unwrap();
            }
            (name, w)
        })
        .collect()
}

/// A model of `config` with random weights.
pub fn random_model(config: &Value, seed: u64) -> Box<dyn Architecture> {
    let mut m = build_model(config).unwrap();
    let w = random_weights(m.as_ref(), seed);
    m.load_weights(w, true).unwrap();
    m
}

/// mlx-lm's `make_prompt_cache(model)`.
pub fn caches(model: &dyn LanguageModel) -> Vec<Box<dyn KvCache>> {
    mlx_cache::make_prompt_cache(&model.cache_specs(), None).unwrap()
}

/// Token ids `[rows, len]`.
pub fn tokens(rows: &[&[i32]]) -> Array {
    let flat: Vec<i32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Array::from_slice(&flat, &[rows.len() as i32, rows[0].len() as i32]).unwrap()
}

/// A fresh scratch directory, removed when dropped.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mlx-models-{name}-"))
        .tempdir()
        .unwrap()
}

/// Largest absolute difference.
pub fn max_diff(a: &Array, b: &Array) -> f32 {
    let a = a.astype(Dtype::Float32).unwrap();
    let b = b.astype(Dtype::Float32).unwrap();
    a.subtract(&b)
        .unwrap()
        .abs()
        .unwrap()
        .max(None, false)
        .unwrap()
        .item::<f32>()
        .unwrap()
}

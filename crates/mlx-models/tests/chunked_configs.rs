#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Llama 4's configs: mlx-lm's cache layout (`make_cache`: a `ChunkedKVCache` for the
//! chunked layers, a `KVCache` for every fourth), and configs mlx-lm cannot run
//! refused at build time with an error naming the key.
use mlx_models::{build_model, CacheSpec};
use serde_json::{json, Value};

fn err(c: &Value) -> String {
    match build_model(c) {
        Ok(_) => panic!("{c} should be refused"),
        Err(e) => e.to_string(),
    }
}

fn llama4(text: Value) -> Value {
    let mut t = json!({
        "model_type": "llama4_text", "attention_bias": false, "attention_chunk_size": 8,
        "head_dim": 8, "hidden_size": 32, "interleave_moe_layer_step": 2,
        "intermediate_size": 16, "intermediate_size_mlp": 32, "max_position_embeddings": 64,
        "num_attention_heads": 4, "num_experts_per_tok": 1, "num_hidden_layers": 5,
        "num_key_value_heads": 2, "num_local_experts": 4, "rms_norm_eps": 1e-5,
        "rope_scaling": null, "rope_theta": 500000.0, "use_qk_norm": true, "vocab_size": 64,
    });
    for (k, v) in text.as_object().into_iter().flatten() {
        t[k] = v.clone();
    }
    json!({"model_type": "llama4", "text_config": t})
}

#[test]
fn every_fourth_llama4_layer_has_a_plain_cache_the_others_a_chunked_one() {
    let m = build_model(&llama4(json!({}))).unwrap();
    let c = CacheSpec::Chunked { chunk_size: 8 };
    assert_eq!(
        m.cache_specs(),
        vec![c, c, c, CacheSpec::Standard, c],
        "mlx-lm's make_cache"
    );
    assert_eq!(m.model_type(), "llama4");
}

#[test]
fn llama4_configs_mlx_lm_cannot_run_are_refused_naming_the_key() {
    let e = err(&llama4(json!({"num_hidden_layers": 3})));
    assert!(
        e.contains("num_hidden_layers") && e.contains("at least 4"),
        "{e}"
    );
    let e = err(&llama4(json!({"num_experts_per_tok": 2})));
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = err(&llama4(json!({"attention_chunk_size": 0})));
    assert!(e.contains("attention_chunk_size"), "{e}");
    let mut c = llama4(json!({}));
    c["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("intermediate_size_mlp");
    let e = err(&c);
    assert!(e.contains("intermediate_size_mlp"), "{e}");
}

#[test]
fn llama4_text_needs_a_no_rope_flag_per_layer() {
    let c = json!({
        "model_type": "llama4_text", "hidden_size": 32, "num_attention_heads": 4,
        "num_hidden_layers": 3, "vocab_size": 64, "intermediate_size": 16,
        "intermediate_size_mlp": 32, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "head_dim": 8, "tie_word_embeddings": true,
        "no_rope_layers": [1, 0], "use_qk_norm": true,
    });
    let e = err(&c);
    assert!(e.contains("no_rope_layers"), "{e}");
    let mut ok = c.clone();
    ok["no_rope_layers"] = json!([1, 0, 1]);
    let m = build_model(&ok).unwrap();
    assert_eq!(m.cache_specs(), vec![CacheSpec::Standard; 3]);
}

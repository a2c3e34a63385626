#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Gemma 4 and Gemma 3n: later layers read an earlier layer's keys and values, so
//! `cache_specs` (mlx-lm's `make_cache`) has fewer entries than the model has layers;
//! a cache list of the wrong length and impossible sharing layouts are refused with an
//! error naming the problem.
use mlx_models::{build_model, load_model, CacheSpec};
use serde_json::json;
use std::path::PathBuf;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/models")
        .join(name)
}

#[test]
fn gemma4_text_has_one_cache_per_layer_with_its_own_keys() {
    let (m, _) = load_model(golden("gemma4_text-small-f32")).unwrap();
    // Layers S S F S S F, the last three shared: layers 0..3 own caches.
    assert_eq!(m.num_layers(), 6);
    let window = CacheSpec::Rotating {
        max_size: 4,
        keep: 0,
    };
    assert_eq!(m.cache_specs(), vec![window, window, CacheSpec::Standard]);
}

#[test]
fn gemma3n_has_one_cache_per_layer_before_the_shared_ones() {
    let (m, _) = load_model(golden("gemma3n-small-f32")).unwrap();
    assert_eq!(m.num_layers(), 4);
    let window = CacheSpec::Rotating {
        max_size: 4,
        keep: 0,
    };
    assert_eq!(m.cache_specs(), vec![window, CacheSpec::Standard]);
}

#[test]
fn a_cache_per_layer_is_refused_where_layers_share_caches() {
    for name in ["gemma4_text-small-f32", "gemma3n-small-f32"] {
        let (m, _) = load_model(golden(name)).unwrap();
        let one_per_layer = vec![CacheSpec::Standard; m.num_layers()];
        let mut caches = mlx_cache::make_prompt_cache(&one_per_layer, None).unwrap();
        let tokens = mlx_array::Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
        let err = m.forward(&tokens, &mut caches).unwrap_err().to_string();
        let want = format!("wants {} caches", m.cache_specs().len());
        assert!(err.contains(&want), "{name}: {err}");
    }
}

#[test]
fn a_shared_layer_without_an_earlier_layer_of_its_type_is_refused() {
    // S S F with two shared layers: layer 2 (full) has no full layer before it.
    let c = json!({
        "model_type": "gemma4_text", "hidden_size": 32, "num_hidden_layers": 3,
        "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "global_head_dim": 8, "vocab_size": 64,
        "vocab_size_per_layer_input": 64, "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 4, "sliding_window_pattern": 3,
    });
    let err = build_model(&c).err().expect("refused").to_string();
    assert!(err.contains("full_attention"), "{err}");
    let c = json!({
        "model_type": "gemma4_text", "num_hidden_layers": 3, "num_kv_shared_layers": 4,
    });
    let err = build_model(&c).err().expect("refused").to_string();
    assert!(err.contains("num_kv_shared_layers"), "{err}");
}

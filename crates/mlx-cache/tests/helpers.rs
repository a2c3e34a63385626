//! The list-level helpers: make_prompt_cache, trimming, quantizing on the fly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops::ones, Dtype};
use mlx_cache::{
    can_trim_prompt_cache, make_prompt_cache, maybe_quantize_kv_cache, trim_prompt_cache,
    CacheError, CacheSpec, PromptCache, RotatingKVCache,
};

fn fill(caches: &mut PromptCache, n: i32) {
    let k = ones(&[1, 1, n, 32], Dtype::Float32).expect("ones");
    for c in caches.iter_mut() {
        c.update_and_fetch(&k, &k).expect("update");
    }
}

fn classes(c: &PromptCache) -> Vec<&'static str> {
    c.iter().map(|c| c.class_name()).collect()
}

#[test]
fn max_kv_size_gives_rotating_caches_keeping_four_to_standard_models() {
    let specs = [CacheSpec::Standard; 3];
    let c = make_prompt_cache(&specs, Some(64)).expect("make");
    assert_eq!(classes(&c), ["RotatingKVCache"; 3]);
    let r = c[0]
        .as_any()
        .downcast_ref::<RotatingKVCache>()
        .expect("rotating");
    assert_eq!((r.max_size(), r.keep()), (64, 4));
    let c = make_prompt_cache(&specs, None).expect("make");
    assert_eq!(classes(&c), ["KVCache"; 3]);
}

#[test]
fn models_with_sliding_layers_keep_their_own_layout_like_mlx_lm_make_cache() {
    let specs = [
        CacheSpec::Rotating {
            max_size: 16,
            keep: 0,
        },
        CacheSpec::Standard,
    ];
    for max in [None, Some(64)] {
        let c = make_prompt_cache(&specs, max).expect("make");
        assert_eq!(classes(&c), ["RotatingKVCache", "KVCache"]);
        let r = c[0]
            .as_any()
            .downcast_ref::<RotatingKVCache>()
            .expect("rotating");
        assert_eq!((r.max_size(), r.keep()), (16, 0));
    }
    assert!(make_prompt_cache(&specs, Some(0)).is_err());
}

#[test]
fn trim_prompt_cache_trims_all_or_nothing() {
    let mut c = make_prompt_cache(&[CacheSpec::Standard; 2], None).expect("make");
    fill(&mut c, 5);
    assert!(can_trim_prompt_cache(&c));
    assert_eq!(trim_prompt_cache(&mut c, 3), 3);
    assert_eq!(c.iter().map(|c| c.offset()).collect::<Vec<_>>(), [2, 2]);
    assert_eq!(trim_prompt_cache(&mut c, 10), 2);

    // A rotating cache that has wrapped cannot be trimmed, so nothing is.
    let specs = [
        CacheSpec::Standard,
        CacheSpec::Rotating {
            max_size: 4,
            keep: 0,
        },
    ];
    let mut c = make_prompt_cache(&specs, None).expect("make");
    fill(&mut c, 6);
    assert!(!can_trim_prompt_cache(&c));
    assert_eq!(trim_prompt_cache(&mut c, 2), 0);
    assert_eq!(c[0].offset(), 6);
    assert_eq!(trim_prompt_cache(&mut [], 2), 0);
}

#[test]
fn maybe_quantize_converts_standard_caches_past_the_start() {
    let mut c = make_prompt_cache(&[CacheSpec::Standard; 2], None).expect("make");
    fill(&mut c, 5);
    maybe_quantize_kv_cache(&mut c, 0, 32, None).expect("no bits: no-op");
    assert_eq!(classes(&c), ["KVCache"; 2]);
    maybe_quantize_kv_cache(&mut c, 6, 32, Some(4)).expect("below start: no-op");
    assert_eq!(classes(&c), ["KVCache"; 2]);
    maybe_quantize_kv_cache(&mut c, 5, 32, Some(4)).expect("quantize");
    assert_eq!(classes(&c), ["QuantizedKVCache"; 2]);
    assert_eq!(c[0].offset(), 5);

    let mut r = make_prompt_cache(&[CacheSpec::Standard], Some(8)).expect("make");
    fill(&mut r, 5);
    match maybe_quantize_kv_cache(&mut r, 0, 32, Some(4)) {
        Err(CacheError::Unsupported {
            class: "RotatingKVCache",
            ..
        }) => {}
        other => panic!("mlx-lm refuses to quantize a rotating cache, got {other:?}"),
    }
}

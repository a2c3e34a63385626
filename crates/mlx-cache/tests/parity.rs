//! Update sequences replayed against goldens from mlx-lm (xtask/py/cache_oracle.py):
//! returned keys/values, masks and bookkeeping must equal Python's bit for bit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::{assert_bits_eq, load_golden};
use mlx_array::Array;
use mlx_cache::{
    AttnMask, ConcatenateKVCache, KVCache, KvCache, KvFetch, QuantizedKVCache, RotatingKVCache,
};
use serde_json::Value;
use std::collections::BTreeMap;

const MASK_VARIANTS: [(bool, Option<i32>); 3] = [(false, None), (true, None), (false, Some(8))];

fn int(v: &Value, key: &str) -> i32 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("golden field {key} missing in {v}")) as i32
}

fn make(spec: &Value) -> Box<dyn KvCache> {
    match spec["class"].as_str() {
        Some("KVCache") => Box::new(KVCache::new()),
        Some("RotatingKVCache") => Box::new(RotatingKVCache::new(
            int(spec, "max_size"),
            int(spec, "keep"),
        )),
        Some("QuantizedKVCache") => Box::new(QuantizedKVCache::new(
            int(spec, "group_size"),
            int(spec, "bits"),
        )),
        Some("ConcatenateKVCache") => Box::new(ConcatenateKVCache::new()),
        other => panic!("unknown class {other:?}"),
    }
}

fn get<'a>(arrays: &'a BTreeMap<String, Array>, key: &str) -> &'a Array {
    arrays
        .get(key)
        .unwrap_or_else(|| panic!("golden tensor {key} missing"))
}

fn replay(name: &str) {
    let (arrays, meta) = load_golden(&format!("{name}.safetensors"));
    let spec: Value = serde_json::from_str(&meta["spec"]).expect("spec json");
    let ops: Value = serde_json::from_str(&meta["ops"]).expect("ops json");
    let mut cache = make(&spec);
    for (step, op) in ops.as_array().expect("ops list").iter().enumerate() {
        let at = format!("{name} step {step} ({op})");
        match op["op"].as_str() {
            Some("update") => {
                let s = int(op, "S");
                for (vi, (ret, win)) in MASK_VARIANTS.iter().enumerate() {
                    let want = op["masks"][vi].as_str().expect("mask kind");
                    let got = cache.make_mask(s, *ret, *win).expect("make_mask");
                    match (&got, want) {
                        (AttnMask::None, "none") | (AttnMask::Causal, "causal") => {}
                        (AttnMask::Array(m), "array") => assert_bits_eq(
                            m,
                            get(&arrays, &format!("mask.{step}.{vi}")),
                            &format!("{at} mask {vi}"),
                        ),
                        _ => panic!("{at} mask {vi}: got {got:?}, mlx-lm gave {want}"),
                    }
                }
                let k = get(&arrays, &format!("in.{step}.k"));
                let v = get(&arrays, &format!("in.{step}.v"));
                let fetched = cache.update_and_fetch(k, v).expect("update_and_fetch");
                if op["check"].as_bool() == Some(true) {
                    match fetched {
                        KvFetch::Plain { keys, values } => {
                            assert_bits_eq(&keys, get(&arrays, &format!("out.{step}.k")), &at);
                            assert_bits_eq(&values, get(&arrays, &format!("out.{step}.v")), &at);
                        }
                        KvFetch::Quantized { keys, values, .. } => {
                            let (k, v) = ([keys.0, keys.1, keys.2], [values.0, values.1, values.2]);
                            for j in 0..3 {
                                let wk = get(&arrays, &format!("out.{step}.k.{j}"));
                                let wv = get(&arrays, &format!("out.{step}.v.{j}"));
                                assert_bits_eq(&k[j], wk, &format!("{at} keys[{j}]"));
                                assert_bits_eq(&v[j], wv, &format!("{at} values[{j}]"));
                            }
                        }
                    }
                }
            }
            Some("trim") => assert_eq!(cache.trim(int(op, "n")), int(op, "trimmed"), "{at}"),
            Some("to_quantized") => {
                let kv = cache
                    .as_any()
                    .downcast_ref::<KVCache>()
                    .expect("to_quantized on KVCache");
                let q = kv
                    .to_quantized(int(op, "group_size"), int(op, "bits"))
                    .expect("quantize");
                cache = Box::new(q);
            }
            other => panic!("unknown op {other:?}"),
        }
        assert_eq!(
            cache.class_name(),
            op["class"].as_str().expect("class"),
            "{at}"
        );
        assert_eq!(cache.offset(), int(op, "offset"), "{at}: offset");
        assert_eq!(cache.size(), int(op, "size"), "{at}: size");
        assert_eq!(
            cache.is_trimmable(),
            op["trimmable"].as_bool().expect("bool"),
            "{at}"
        );
        assert_eq!(
            cache.nbytes() as i64,
            op["nbytes"].as_i64().expect("nbytes"),
            "{at}"
        );
        assert_eq!(
            cache.is_empty(),
            op["empty"].as_bool().expect("bool"),
            "{at}: empty"
        );
        if let Some(r) = cache.as_any().downcast_ref::<RotatingKVCache>() {
            assert_eq!(r.idx(), int(op, "idx"), "{at}: _idx");
        }
    }
}

#[test]
fn kv_cache_matches_mlx_lm_across_step_boundaries_and_trims() {
    replay("kv_f16");
}

#[test]
fn rotating_cache_matches_mlx_lm_when_wrapping_with_keep() {
    replay("rotating_16_keep4");
}

#[test]
fn rotating_cache_matches_mlx_lm_with_prefill_larger_than_window() {
    replay("rotating_8_keep0");
}

#[test]
fn rotating_cache_matches_mlx_lm_when_growing_past_256() {
    replay("rotating_300_keep4");
}

#[test]
fn quantized_cache_matches_mlx_lm_4bit() {
    replay("quantized_32_4");
}

#[test]
fn quantized_cache_matches_mlx_lm_8bit_bf16() {
    replay("quantized_64_8_bf16");
}

#[test]
fn kv_cache_converted_to_quantized_matches_mlx_lm() {
    replay("kv_to_quantized");
}

#[test]
fn concatenate_cache_matches_mlx_lm() {
    replay("concatenate");
}

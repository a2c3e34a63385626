//! Batch caches replayed against goldens from mlx-lm's `BatchKVCache` and
//! `BatchRotatingKVCache` (xtask/py/batch_cache_oracle.py): merge, update, masks,
//! filter, extend, extract, trim and right-padded prefill chunks (prepare / finalize)
//! must leave the same buffers and bookkeeping as Python, bit for bit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::{assert_bits_eq, load_golden};
use mlx_array::Array;
use mlx_cache::{
    AttnMask, BatchKVCache, BatchRotatingKVCache, KVCache, KvCache, KvFetch, RopePosition,
    RotatingKVCache,
};
use serde_json::Value;
use std::collections::BTreeMap;

const WINDOWS: [Option<i32>; 2] = [None, Some(3)];

enum Batch {
    Kv(BatchKVCache),
    Rot(BatchRotatingKVCache),
}

impl Batch {
    fn cache(&self) -> &dyn KvCache {
        match self {
            Batch::Kv(c) => c,
            Batch::Rot(c) => c,
        }
    }
    fn cache_mut(&mut self) -> &mut dyn KvCache {
        match self {
            Batch::Kv(c) => c,
            Batch::Rot(c) => c,
        }
    }
    fn buffers(&self) -> Option<(&Array, &Array)> {
        match self {
            Batch::Kv(c) => c.keys().zip(c.values()),
            Batch::Rot(c) => c.keys().zip(c.values()),
        }
    }
    fn offsets(&self) -> Vec<i32> {
        match self {
            Batch::Kv(c) => c.offsets().to_vec(),
            Batch::Rot(c) => c.offsets().to_vec(),
        }
    }
    fn left_padding(&self) -> Vec<i32> {
        match self {
            Batch::Kv(c) => c.left_padding().to_vec(),
            Batch::Rot(c) => c.left_padding().to_vec(),
        }
    }
    fn idx(&self) -> i32 {
        match self {
            Batch::Kv(c) => c.idx(),
            Batch::Rot(c) => c.idx(),
        }
    }
}

fn get<'a>(arrays: &'a BTreeMap<String, Array>, key: &str) -> &'a Array {
    arrays
        .get(key)
        .unwrap_or_else(|| panic!("golden tensor {key} missing"))
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_i64().expect("int") as i32)
        .collect()
}

/// Merges single caches filled with the recorded updates of `step`.
fn merged(arrays: &BTreeMap<String, Array>, step: usize, rows: &Value, window: i32) -> Batch {
    let rows = rows.as_array().expect("rows");
    if window == 0 {
        let singles: Vec<KVCache> = rows
            .iter()
            .enumerate()
            .map(|(j, fills)| {
                let mut c = KVCache::new();
                for u in 0..fills.as_array().expect("fills").len() {
                    let k = get(arrays, &format!("single.{step}.{j}.k.{u}"));
                    let v = get(arrays, &format!("single.{step}.{j}.v.{u}"));
                    c.update(k, v).expect("single update");
                }
                c
            })
            .collect();
        let refs: Vec<&KVCache> = singles.iter().collect();
        Batch::Kv(BatchKVCache::merge(&refs).expect("merge"))
    } else {
        let singles: Vec<RotatingKVCache> = rows
            .iter()
            .enumerate()
            .map(|(j, fills)| {
                let mut c = RotatingKVCache::new(window, 0);
                for u in 0..fills.as_array().expect("fills").len() {
                    let k = get(arrays, &format!("single.{step}.{j}.k.{u}"));
                    let v = get(arrays, &format!("single.{step}.{j}.v.{u}"));
                    c.update(k, v).expect("single update");
                }
                c
            })
            .collect();
        let refs: Vec<&RotatingKVCache> = singles.iter().collect();
        Batch::Rot(BatchRotatingKVCache::merge(&refs).expect("merge"))
    }
}

fn replay(name: &str) {
    let (arrays, meta) = load_golden(&format!("batch_{name}.safetensors"));
    let ops: Value = serde_json::from_str(&meta["ops"]).expect("ops json");
    let kind: Value = serde_json::from_str(&meta["kind"]).expect("kind json");
    let window = kind.as_i64().map_or(0, |w| w as i32);
    let mut cache: Option<Batch> = None;
    for (step, op) in ops.as_array().expect("ops").iter().enumerate() {
        let at = format!("{name} step {step} ({})", op["op"]);
        match op["op"].as_str() {
            Some("merge") => cache = Some(merged(&arrays, step, &op["rows"], window)),
            Some("extend") => {
                let other = merged(&arrays, step, &op["rows"], window);
                match (cache.as_mut().expect("a batch"), other) {
                    (Batch::Kv(a), Batch::Kv(b)) => a.extend(&b).expect("extend"),
                    (Batch::Rot(a), Batch::Rot(mut b)) => a.extend(&mut b).expect("extend"),
                    _ => unreachable!("one kind per scenario"),
                }
            }
            Some("update") => {
                let c = cache.as_mut().expect("a batch");
                let s = op["S"].as_i64().expect("S") as i32;
                let check = op["check"].as_bool() != Some(false);
                if check {
                    for (w, win) in WINDOWS.iter().enumerate() {
                        match c.cache().make_mask(s, false, *win).expect("mask") {
                            AttnMask::Array(m) => {
                                assert_bits_eq(&m, get(&arrays, &format!("mask.{step}.{w}")), &at)
                            }
                            // A decoding step of rows none of which is padded: mlx-lm's
                            // mask is all true, which attention without one equals.
                            AttnMask::None if s == 1 && win.is_none() => {
                                let want = get(&arrays, &format!("mask.{step}.{w}"))
                                    .astype(mlx_array::Dtype::Int32)
                                    .unwrap()
                                    .to_vec::<i32>()
                                    .unwrap();
                                assert!(want.iter().all(|&x| x == 1), "{at}: {want:?}");
                            }
                            // A decoding step of padded rows: mlx-lm's mask, and each row's
                            // padding, where the mask turns true.
                            AttnMask::LeftPadded { mask, left_padding }
                                if s == 1 && win.is_none() =>
                            {
                                assert_bits_eq(
                                    &mask,
                                    get(&arrays, &format!("mask.{step}.{w}")),
                                    &at,
                                );
                                let lp = left_padding.to_vec::<i32>().unwrap();
                                assert_eq!(lp, c.left_padding(), "{at}");
                                let rows = mask.astype(mlx_array::Dtype::Int32).unwrap();
                                let len = rows.dim(-1).unwrap() as usize;
                                let rows = rows.to_vec::<i32>().unwrap();
                                for (r, &l) in rows.chunks(len).zip(&lp) {
                                    let want: Vec<i32> =
                                        (0..len as i32).map(|j| (j >= l) as i32).collect();
                                    assert_eq!(r, &want[..], "{at}: padding {l}");
                                }
                            }
                            other => panic!("{at}: batch masks are arrays, got {other:?}"),
                        }
                    }
                    match c.cache().rope_offset().expect("rope offset") {
                        RopePosition::PerRow(o) => {
                            assert_eq!(o.to_vec::<i32>().unwrap(), c.offsets(), "{at}")
                        }
                        RopePosition::Scalar(_) => panic!("{at}: batch offsets are per row"),
                    }
                }
                let k = get(&arrays, &format!("in.{step}.k"));
                let v = get(&arrays, &format!("in.{step}.v"));
                let KvFetch::Plain { keys, values } =
                    c.cache_mut().update_and_fetch(k, v).expect("update")
                else {
                    panic!("{at}: batch caches are plain");
                };
                if check {
                    assert_bits_eq(&keys, get(&arrays, &format!("out.{step}.k")), &at);
                    assert_bits_eq(&values, get(&arrays, &format!("out.{step}.v")), &at);
                }
            }
            Some("filter") => {
                let keep: Vec<usize> = ints(&op["keep"]).iter().map(|&i| i as usize).collect();
                match cache.as_mut().expect("a batch") {
                    Batch::Kv(c) => c.filter(&keep).expect("filter"),
                    Batch::Rot(c) => c.filter(&keep).expect("filter"),
                }
            }
            Some("extract") => {
                let row = op["row"].as_i64().expect("row") as usize;
                let (k, v, offset, idx) = match cache.as_ref().expect("a batch") {
                    Batch::Kv(c) => {
                        let r = c.extract(row).expect("extract");
                        let (k, v) = (r.keys().cloned(), r.values().cloned());
                        (k, v, r.offset(), r.offset())
                    }
                    Batch::Rot(c) => {
                        let r = c.extract(row).expect("extract");
                        let (k, v) = (r.keys().cloned(), r.values().cloned());
                        (k, v, r.offset(), r.idx())
                    }
                };
                assert_bits_eq(
                    &k.expect("keys"),
                    get(&arrays, &format!("extract.{step}.k")),
                    &at,
                );
                assert_bits_eq(
                    &v.expect("values"),
                    get(&arrays, &format!("extract.{step}.v")),
                    &at,
                );
                assert_eq!(
                    offset as i64,
                    op["extract_offset"].as_i64().unwrap(),
                    "{at}"
                );
                assert_eq!(idx as i64, op["extract_idx"].as_i64().unwrap(), "{at}");
            }
            Some("prepare") => {
                let opt = |k: &str| (!op[k].is_null()).then(|| ints(&op[k]));
                let (lp, len, rp) = (opt("pad_left"), opt("chunk_lengths"), opt("pad_right"));
                let (lp, len, rp) = (lp.as_deref(), len.as_deref(), rp.as_deref());
                match cache.as_mut().expect("a batch") {
                    Batch::Kv(c) => c.prepare(lp, len, rp).expect("prepare"),
                    Batch::Rot(c) => c.prepare(lp, len, rp).expect("prepare"),
                }
            }
            Some("finalize") => match cache.as_mut().expect("a batch") {
                Batch::Kv(c) => c.finalize().expect("finalize"),
                Batch::Rot(c) => c.finalize().expect("finalize"),
            },
            Some("trim") => {
                let n = op["n"].as_i64().expect("n") as i32;
                let got = cache.as_mut().expect("a batch").cache_mut().trim(n);
                assert_eq!(got as i64, op["trimmed"].as_i64().unwrap(), "{at}");
            }
            other => panic!("unknown op {other:?}"),
        }
        let c = cache.as_ref().expect("a batch");
        assert_eq!(c.offsets(), ints(&op["offset"]), "{at}: offset");
        assert_eq!(
            c.left_padding(),
            ints(&op["left_padding"]),
            "{at}: left_padding"
        );
        assert_eq!(c.idx() as i64, op["idx"].as_i64().unwrap(), "{at}: _idx");
        assert_eq!(
            c.cache().size() as i64,
            op["size"].as_i64().unwrap(),
            "{at}: size"
        );
        assert_eq!(
            Some(c.cache().is_trimmable()),
            op["trimmable"].as_bool(),
            "{at}: trimmable"
        );
        assert_eq!(Some(c.cache().is_empty()), op["empty"].as_bool(), "{at}");
        if let Batch::Rot(r) = c {
            assert_eq!(
                r.offset() as i64,
                op["written"].as_i64().unwrap(),
                "{at}: _offset"
            );
            assert_eq!(Some(r.rotated()), op["rotated"].as_bool(), "{at}: rotated");
        }
        if op["op"] != "update" {
            match (c.buffers(), arrays.get(&format!("state.{step}.k"))) {
                (Some((k, v)), Some(want_k)) => {
                    assert_bits_eq(k, want_k, &format!("{at}: keys buffer"));
                    let want_v = get(&arrays, &format!("state.{step}.v"));
                    assert_bits_eq(v, want_v, &format!("{at}: values buffer"));
                }
                (None, None) => {}
                (got, want) => panic!(
                    "{at}: buffers present here {}, in mlx-lm {}",
                    got.is_some(),
                    want.is_some()
                ),
            }
        }
    }
}

#[test]
fn batch_kv_cache_matches_mlx_lm_f16() {
    replay("kv");
}

#[test]
fn batch_kv_cache_matches_mlx_lm_f32() {
    replay("kv_f32");
}

#[test]
fn batch_rotating_cache_matches_mlx_lm_through_wraps_filters_and_extends() {
    replay("rotating_6");
}

#[test]
fn right_padded_prefill_chunks_roll_like_mlx_lm() {
    replay("kv_prefill");
}

#[test]
fn right_padded_prefill_chunks_never_evict_real_positions_like_mlx_lm() {
    replay("rotating_6_prefill");
}

#[test]
fn batch_rotating_cache_extends_an_empty_batch_like_mlx_lm() {
    replay("rotating_5_empty");
}

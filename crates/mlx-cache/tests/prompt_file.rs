//! Prompt-cache files: mlx-lm's files load here, ours load in mlx-lm, bad files are
//! refused.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::{assert_bits_eq, golden_dir, load_golden, mlx_python};
use mlx_array::{io, random, Array, Dtype};
use mlx_cache::{
    load_prompt_cache, save_prompt_cache, CacheError, ConcatenateKVCache, KVCache, KvCache,
    KvFetch, QuantizedKVCache, RotatingKVCache,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A fresh file path named like `name` (stem and extension kept), removed when dropped.
fn temp_path(name: &str) -> tempfile::TempPath {
    let (stem, ext) = name.rsplit_once('.').unwrap_or((name, ""));
    tempfile::Builder::new()
        .prefix(&format!("mlx-cache-test-{stem}-"))
        .suffix(&format!(".{ext}"))
        .tempfile()
        .expect("temp file")
        .into_temp_path()
}

/// Flattens what a cache returns into `"{i}.k"`/`"{i}.v"` (quantized: `.k.0..2`).
fn record(out: &mut BTreeMap<String, Array>, i: usize, f: KvFetch) {
    match f {
        KvFetch::Plain { keys, values } => {
            out.insert(format!("{i}.k"), keys);
            out.insert(format!("{i}.v"), values);
        }
        KvFetch::Quantized { keys, values, .. } => {
            for (j, (k, v)) in [(keys.0, values.0), (keys.1, values.1), (keys.2, values.2)]
                .into_iter()
                .enumerate()
            {
                out.insert(format!("{i}.k.{j}"), k);
                out.insert(format!("{i}.v.{j}"), v);
            }
        }
    }
}

/// Applies the updates `"{i}.k"/"{i}.v"` to the caches that have one.
fn apply(
    caches: &mut [Box<dyn KvCache>],
    updates: &BTreeMap<String, Array>,
) -> BTreeMap<String, Array> {
    let mut out = BTreeMap::new();
    for (i, c) in caches.iter_mut().enumerate() {
        if let (Some(k), Some(v)) = (
            updates.get(&format!("{i}.k")),
            updates.get(&format!("{i}.v")),
        ) {
            record(&mut out, i, c.update_and_fetch(k, v).expect("update"));
        }
    }
    out
}

fn assert_same_outputs(got: &BTreeMap<String, Array>, want: &BTreeMap<String, Array>) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (k, w) in want {
        assert_bits_eq(&got[k], w, k);
    }
}

fn check_info(caches: &[Box<dyn KvCache>], info: &Value) {
    let info = info.as_array().expect("info list");
    assert_eq!(caches.len(), info.len());
    for (c, e) in caches.iter().zip(info) {
        assert_eq!(c.class_name(), e["class"].as_str().expect("class"));
        if let Some(off) = e["offset"].as_i64() {
            assert_eq!(i64::from(c.offset()), off, "{e}");
        }
        if let Some(r) = c.as_any().downcast_ref::<RotatingKVCache>() {
            assert_eq!(i64::from(r.keep()), e["keep"].as_i64().expect("keep"));
            assert_eq!(
                i64::from(r.max_size()),
                e["max_size"].as_i64().expect("max_size")
            );
            assert_eq!(i64::from(r.idx()), e["idx"].as_i64().expect("idx"));
        }
        if let Some(q) = c.as_any().downcast_ref::<QuantizedKVCache>() {
            assert_eq!(
                i64::from(q.group_size()),
                e["group_size"].as_i64().expect("gs")
            );
            assert_eq!(i64::from(q.bits()), e["bits"].as_i64().expect("bits"));
        }
    }
}

#[test]
fn prompt_cache_written_by_mlx_lm_loads_and_continues_identically() {
    let path = golden_dir().join("prompt_cache_mlx_lm.safetensors");
    let (mut caches, meta) = load_prompt_cache(&path).expect("load mlx-lm file");
    assert_eq!(meta.get("model").map(String::as_str), Some("tiny-model"));
    assert_eq!(
        meta.get("chat_template").map(String::as_str),
        Some("{{ messages }}")
    );
    assert_eq!(meta.len(), 3);
    let classes: Vec<&str> = caches.iter().map(|c| c.class_name()).collect();
    assert_eq!(
        classes,
        [
            "KVCache",
            "RotatingKVCache",
            "QuantizedKVCache",
            "ConcatenateKVCache",
            "KVCache",
            "RotatingKVCache",
            "QuantizedKVCache"
        ]
    );
    assert!(caches[4].is_empty() && caches[6].is_empty());

    let (updates, _) = load_golden("prompt_cache_updates.safetensors");
    let got = apply(&mut caches, &updates);
    let (want, want_meta) = load_golden("prompt_cache_expected.safetensors");
    assert_same_outputs(&got, &want);
    check_info(
        &caches,
        &serde_json::from_str(&want_meta["info"]).expect("info json"),
    );
}

#[test]
fn saving_a_loaded_mlx_lm_file_reproduces_its_tensors_and_metadata() {
    let path = golden_dir().join("prompt_cache_mlx_lm.safetensors");
    let (caches, meta) = load_prompt_cache(&path).expect("load");
    let ours = temp_path("resaved.safetensors");
    save_prompt_cache(&ours, &caches, &meta).expect("save");
    let (a_py, m_py) = io::load_safetensors(&path).expect("read python file");
    let (a_rs, m_rs) = io::load_safetensors(&ours).expect("read our file");
    assert_eq!(m_rs, m_py, "metadata differs from mlx-lm's");
    assert_eq!(
        a_rs.keys().collect::<Vec<_>>(),
        a_py.keys().collect::<Vec<_>>()
    );
    for (k, w) in &a_py {
        assert_bits_eq(&a_rs[k], w, k);
    }
}

/// Caches built from scratch in Rust: filled, wrapped, quantized and empty ones.
fn rust_caches() -> Vec<Box<dyn KvCache>> {
    random::seed(3).expect("seed");
    let n = |shape: &[i32], dt: Dtype| {
        random::normal(shape, Dtype::Float32, None, None, None)
            .and_then(|a| a.astype(dt))
            .expect("normal")
    };
    let mut kv = KVCache::new();
    kv.update(
        &n(&[1, 2, 7, 4], Dtype::Bfloat16),
        &n(&[1, 2, 7, 4], Dtype::Bfloat16),
    )
    .expect("u");
    let mut rot = RotatingKVCache::new(6, 1);
    rot.update(
        &n(&[1, 1, 4, 4], Dtype::Float16),
        &n(&[1, 1, 4, 4], Dtype::Float16),
    )
    .expect("u");
    for _ in 0..5 {
        rot.update(
            &n(&[1, 1, 1, 4], Dtype::Float16),
            &n(&[1, 1, 1, 4], Dtype::Float16),
        )
        .expect("u");
    }
    let mut q = QuantizedKVCache::new(64, 8);
    q.update(
        &n(&[1, 1, 2, 64], Dtype::Float32),
        &n(&[1, 1, 2, 64], Dtype::Float32),
    )
    .expect("u");
    let mut cat = ConcatenateKVCache::new();
    cat.update(
        &n(&[1, 1, 3, 4], Dtype::Float32),
        &n(&[1, 1, 3, 4], Dtype::Float32),
    )
    .expect("u");
    let mut kvq = KVCache::new();
    kvq.update(
        &n(&[1, 1, 3, 32], Dtype::Float32),
        &n(&[1, 1, 3, 32], Dtype::Float32),
    )
    .expect("u");
    let kvq = kvq.to_quantized(32, 4).expect("to_quantized");
    vec![
        Box::new(kv),
        Box::new(rot),
        Box::new(q),
        Box::new(cat),
        Box::new(kvq),
        Box::new(KVCache::new()),
        Box::new(RotatingKVCache::new(16, 4)),
    ]
}

fn rust_updates() -> BTreeMap<String, Array> {
    random::seed(4).expect("seed");
    let shapes = [
        (2, 4, Dtype::Bfloat16),
        (1, 4, Dtype::Float16),
        (1, 64, Dtype::Float32),
        (1, 4, Dtype::Float32),
        (1, 32, Dtype::Float32),
        (1, 4, Dtype::Float32),
        (1, 4, Dtype::Float32),
    ];
    let mut m = BTreeMap::new();
    for (i, (h, d, dt)) in shapes.into_iter().enumerate() {
        for kv in ["k", "v"] {
            let a = random::normal(&[1, h, 1, d], Dtype::Float32, None, None, None)
                .and_then(|a| a.astype(dt))
                .expect("normal");
            m.insert(format!("{i}.{kv}"), a);
        }
    }
    m
}

#[test]
fn mlx_lm_loads_our_prompt_cache_files() {
    let python = mlx_python();
    let mut caches = rust_caches();
    let meta: BTreeMap<String, String> = [("model", "ours"), ("tokenizer_config", "{\"x\": 1}")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let file = temp_path("ours.safetensors");
    save_prompt_cache(&file, &caches, &meta).expect("save");
    let updates = rust_updates();
    let upd_file = temp_path("updates.safetensors");
    io::save_safetensors(&upd_file, updates.iter().map(|(k, a)| (k.as_str(), a)), [])
        .expect("save updates");
    let out_file = temp_path("python_out.safetensors");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../xtask/py/cache_oracle.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args(["check-file"])
        .args([&file, &upd_file, &out_file])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "mlx-lm could not load our file:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (want, want_meta) = io::load_safetensors(&out_file).expect("python output");
    let py_meta: BTreeMap<String, String> =
        serde_json::from_str(&want_meta["metadata"]).expect("metadata json");
    assert_eq!(py_meta, meta);
    let got = apply(&mut caches, &updates);
    assert_same_outputs(&got, &want);
    check_info(
        &caches,
        &serde_json::from_str(&want_meta["info"]).expect("info json"),
    );
}

#[test]
fn our_files_round_trip_through_our_loader() {
    let caches = rust_caches();
    let file = temp_path("roundtrip.safetensors");
    save_prompt_cache(&file, &caches, &BTreeMap::new()).expect("save");
    let (mut loaded, meta) = load_prompt_cache(&file).expect("load");
    assert!(meta.is_empty());
    let mut caches = caches;
    let updates = rust_updates();
    assert_same_outputs(&apply(&mut loaded, &updates), &apply(&mut caches, &updates));
}

fn write_raw(name: &str, arrays: &[(&str, Array)], meta: &[(&str, &str)]) -> tempfile::TempPath {
    let p = temp_path(name);
    io::save_safetensors(
        &p,
        arrays.iter().map(|(k, a)| (*k, a)),
        meta.iter().copied(),
    )
    .expect("write raw");
    p
}

fn load_err(p: &std::path::Path) -> CacheError {
    match load_prompt_cache(p) {
        Ok(_) => panic!("{} should have been refused", p.display()),
        Err(e) => e,
    }
}

fn int(v: i32) -> Array {
    Array::scalar_i64(v.into(), Dtype::Int32).expect("scalar")
}

#[test]
fn unknown_cache_class_is_refused() {
    let p = write_raw(
        "unknown.safetensors",
        &[("0.0", int(1))],
        &[
            ("1.0", "NoSuchCache"),
            ("2.0", ""),
            ("2.1.0", "0.0"),
            ("2.1.1", "scalar"),
        ],
    );
    match load_err(&p) {
        CacheError::UnknownClass {
            class, index: 0, ..
        } => assert_eq!(class, "NoSuchCache"),
        other => panic!("expected UnknownClass, got {other:?}"),
    }
}

#[test]
fn file_from_old_mlx_lm_layout_is_refused_as_stale() {
    // mlx-lm before the scalar list stored [metadata, meta_state, classes].
    let k = mlx_array::ops::zeros(&[1, 1, 2, 4], Dtype::Float32).expect("zeros");
    let p = write_raw(
        "stale.safetensors",
        &[("0.0", k.clone()), ("0.1", k)],
        &[("0.model", "m"), ("2.0", "KVCache")],
    );
    let err = load_err(&p);
    assert!(err.to_string().contains("older mlx-lm"), "{err}");
}

#[test]
fn missing_state_and_foreign_metadata_are_refused_with_the_key() {
    let p = write_raw(
        "missing.safetensors",
        &[],
        &[("1.0", "KVCache"), ("2.0", "")],
    );
    let err = load_err(&p);
    assert!(err.to_string().contains("0.0` is missing"), "{err}");

    let p = write_raw("foreign.safetensors", &[("w", int(1))], &[("format", "pt")]);
    let err = load_err(&p);
    assert!(err.to_string().contains("`format`"), "{err}");

    let k = mlx_array::ops::zeros(&[1, 1, 2, 4], Dtype::Float32).expect("zeros");
    let p = write_raw(
        "offset.safetensors",
        &[("0.0", k.clone()), ("0.1", k), ("0.2", int(9))],
        &[
            ("1.0", "KVCache"),
            ("2.0", ""),
            ("2.1.0", "0.2"),
            ("2.1.1", "scalar"),
        ],
    );
    let err = load_err(&p);
    assert!(err.to_string().contains("offset 9"), "{err}");
}

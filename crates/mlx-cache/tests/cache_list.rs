//! `CacheList` (mlx-lm's class): trimming and size as mlx-lm's, batching cache by cache,
//! and prompt-cache files that mlx-lm 0.32.2 writes and reads the same way (its
//! `save_prompt_cache` / `load_prompt_cache` run with `$MLX_PYTHON`, else
//! `.venv/bin/python`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops, Array, Dtype};
use mlx_cache::{
    load_prompt_cache, make_prompt_cache, save_prompt_cache, ArraysCache, BatchPromptCache,
    CacheList, CacheSpec, KVCache, KvCache,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> String {
    std::env::var("MLX_PYTHON")
        .unwrap_or_else(|_| root().join(".venv/bin/python").display().to_string())
}

fn arange(shape: &[i32], start: f64) -> Array {
    let n: i32 = shape.iter().product();
    ops::arange(start, start + n as f64, 1.0, Dtype::Float32)
        .and_then(|a| a.reshape(shape))
        .expect("arange")
}

fn kv(n: i32, start: f64) -> KVCache {
    let mut c = KVCache::new();
    let k = arange(&[1, 1, n, 4], start);
    c.update(&k, &k.multiply(2.0).expect("values"))
        .expect("update");
    c
}

/// `CacheList(KVCache with 2 positions, ArraysCache(2) with slot 0 set)`.
fn sample() -> CacheList {
    let mut a = ArraysCache::new(2);
    a.arrays_mut()
        .expect("slots")
        .set(0, arange(&[1, 3, 4], 100.0))
        .expect("set");
    CacheList::new(vec![Box::new(kv(2, 0.0)), Box::new(a)])
}

#[test]
fn trim_trims_every_cache_and_reports_the_last() {
    let mut l = CacheList::new(vec![Box::new(kv(5, 0.0)), Box::new(kv(3, 0.0))]);
    assert!(l.is_trimmable());
    assert_eq!(l.size(), 5);
    assert_eq!(l.trim(4), 3, "the last cache held only 3");
    let offsets: Vec<i32> = l.caches().iter().map(|c| c.offset()).collect();
    assert_eq!(offsets, vec![1, 0]);
    assert!(
        !sample().is_trimmable(),
        "a recurrent state cannot be trimmed"
    );
}

#[test]
fn make_prompt_cache_builds_the_listed_caches() {
    let spec = CacheSpec::List(&[CacheSpec::Arrays { size: 2 }, CacheSpec::Standard]);
    let c = make_prompt_cache(&[spec], Some(8)).expect("caches");
    let subs = c[0].sub_caches().expect("a CacheList");
    let classes: Vec<&str> = subs.iter().map(|c| c.class_name()).collect();
    assert_eq!(classes, vec!["ArraysCache", "KVCache"]);
    assert!(c[0].is_empty());
}

/// Keys (`j = 0`) or values (`j = 1`) of the positions a cache holds.
fn held(c: &dyn KvCache, j: usize) -> Array {
    let a = &c.state()[j];
    a.slice_axis(2, 0, c.offset()).expect("slice")
}

#[test]
fn a_batch_of_lists_extracts_each_row_back() {
    let rows: Vec<Vec<Box<dyn KvCache>>> = (0..2)
        .map(|i| {
            vec![Box::new(CacheList::new(vec![
                Box::new(kv(2 + i, 10.0 * i as f64)),
                Box::new(kv(1 + i, 50.0 * i as f64)),
            ])) as Box<dyn KvCache>]
        })
        .collect();
    let refs: Vec<&[Box<dyn KvCache>]> = rows.iter().map(|r| r.as_slice()).collect();
    let mut batch = BatchPromptCache::merge(&refs).expect("merge");
    let subs = batch.layers()[0].sub_caches().expect("a batched CacheList");
    assert_eq!(subs[0].class_name(), "BatchKVCache");
    for (i, want) in rows.iter().enumerate() {
        let got = batch.extract(i).expect("extract");
        let (g, w) = (got[0].sub_caches().unwrap(), want[0].sub_caches().unwrap());
        for (a, b) in g.iter().zip(w) {
            assert_eq!(a.offset(), b.offset(), "row {i}");
            for j in 0..2 {
                let (x, y) = (held(a.as_ref(), j), held(b.as_ref(), j));
                assert!(
                    x.array_equal(&y, false).unwrap().item::<bool>().unwrap(),
                    "row {i}"
                );
            }
        }
    }
    batch.filter(&[1]).expect("filter");
    let got = batch.extract(0).expect("extract");
    assert_eq!(got[0].sub_caches().unwrap()[1].offset(), 2);
}

const PY_WRITE: &str = r#"
import sys
import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, save_prompt_cache
k = KVCache()
keys = mx.arange(8, dtype=mx.float32).reshape(1, 1, 2, 4)
k.update_and_fetch(keys, keys * 2)
a = ArraysCache(2)
a[0] = mx.arange(100, 112, dtype=mx.float32).reshape(1, 3, 4)
save_prompt_cache(sys.argv[1], [CacheList(k, a)], {"note": "list"})
"#;

const PY_READ: &str = r#"
import sys
from mlx_lm.models.cache import load_prompt_cache
c, meta = load_prompt_cache(sys.argv[1], return_metadata=True)
k, a = c[0].caches
print(type(c[0]).__name__, type(k).__name__, type(a).__name__, k.offset,
      k.keys[..., :k.offset, :].tolist(), a.cache[0].tolist(), a.cache[1], meta["note"])
"#;

fn run_python(script: &str, path: &Path) -> String {
    let out = Command::new(python())
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("run mlx-lm (set MLX_PYTHON to the .venv's python)");
    assert!(
        out.status.success(),
        "mlx-lm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn prompt_cache_files_are_mlx_lm_s_both_ways() {
    let dir = std::env::temp_dir().join(format!("cache_list_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ours, theirs) = (dir.join("ours.safetensors"), dir.join("theirs.safetensors"));
    let meta = BTreeMap::from([("note".to_string(), "list".to_string())]);
    let caches: Vec<Box<dyn KvCache>> = vec![Box::new(sample())];
    save_prompt_cache(&ours, &caches, &meta).expect("save");
    run_python(PY_WRITE, &theirs);

    // The same tensors and metadata as mlx-lm's file.
    let (ta, tm) = mlx_array::io::load_safetensors(&theirs).unwrap();
    let (oa, om) = mlx_array::io::load_safetensors(&ours).unwrap();
    assert_eq!(om, tm, "metadata");
    assert_eq!(oa.keys().collect::<Vec<_>>(), ta.keys().collect::<Vec<_>>());
    for (k, a) in &oa {
        let b = &ta[k];
        assert_eq!(a.dtype(), b.dtype(), "{k}");
        assert!(
            a.array_equal(b, false).unwrap().item::<bool>().unwrap(),
            "{k}"
        );
    }

    // mlx-lm's file loads here as a CacheList of the same caches ...
    let (loaded, user) = load_prompt_cache(&theirs).expect("load mlx-lm's file");
    assert_eq!(user, meta);
    let subs = loaded[0].sub_caches().expect("a CacheList");
    assert_eq!(subs[0].offset(), 2);
    let want = sample();
    for (g, w) in subs.iter().zip(want.caches()) {
        assert_eq!(g.class_name(), w.class_name());
        for (a, b) in g.state().iter().zip(w.state()) {
            assert!(a.array_equal(&b, false).unwrap().item::<bool>().unwrap());
        }
    }
    // ... and ours in mlx-lm.
    let line = run_python(PY_READ, &ours);
    assert_eq!(
        line.trim(),
        "CacheList KVCache ArraysCache 2 [[[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]]] \
         [[[100.0, 101.0, 102.0, 103.0], [104.0, 105.0, 106.0, 107.0], \
         [108.0, 109.0, 110.0, 111.0]]] None list"
    );
    std::fs::remove_dir_all(&dir).ok();
}

//! `BatchPromptCache` bookkeeping: which caches can join a batch, and how rows are
//! merged, dropped, appended and taken out across layers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops::ones, Array, Dtype};
use mlx_cache::{
    is_batchable, BatchKVCache, BatchPromptCache, CacheError, KVCache, KvCache, QuantizedKVCache,
    RotatingKVCache,
};

fn filled(n: i32, value: f32) -> KVCache {
    let mut c = KVCache::new();
    if n > 0 {
        let k = ones(&[1, 1, n, 2], Dtype::Float32)
            .and_then(|a| a.multiply(value))
            .expect("keys");
        c.update(&k, &k).expect("update");
    }
    c
}

fn row(layers: &[i32], value: f32) -> Vec<Box<dyn KvCache>> {
    layers
        .iter()
        .map(|&n| Box::new(filled(n, value)) as Box<dyn KvCache>)
        .collect()
}

fn values_of(c: &dyn KvCache) -> Vec<f32> {
    let k: &Array = &c.state()[0];
    k.to_vec::<f32>().expect("read")
}

#[test]
fn only_plain_and_keep_zero_rotating_caches_can_join_a_batch() {
    assert!(is_batchable(&KVCache::new()));
    assert!(is_batchable(&RotatingKVCache::new(8, 0)));
    assert!(!is_batchable(&RotatingKVCache::new(8, 4)));
    assert!(!is_batchable(&QuantizedKVCache::new(64, 8)));
    let rows = [row(&[2], 1.0)];
    let mut q: Vec<Box<dyn KvCache>> = vec![Box::new(QuantizedKVCache::new(64, 8))];
    q[0].update_and_fetch(
        &ones(&[1, 1, 2, 64], Dtype::Float32).unwrap(),
        &ones(&[1, 1, 2, 64], Dtype::Float32).unwrap(),
    )
    .unwrap();
    let refs: Vec<&[Box<dyn KvCache>]> = vec![&rows[0], &q];
    let err = BatchPromptCache::merge(&refs).unwrap_err();
    assert!(matches!(err, CacheError::Unsupported { .. }), "{err}");
}

#[test]
fn rows_merge_filter_extend_and_extract_across_layers() {
    let (a, b, c) = (row(&[3, 3], 1.0), row(&[1, 1], 2.0), row(&[2, 2], 3.0));
    let mut batch = BatchPromptCache::merge(&[&a[..], &b[..]]).expect("merge");
    assert_eq!(batch.rows(), 2);
    assert_eq!(batch.layers().len(), 2);
    let first = batch.layers()[0]
        .as_any()
        .downcast_ref::<BatchKVCache>()
        .expect("a BatchKVCache");
    assert_eq!(first.left_padding(), &[0, 2]);
    assert_eq!(first.offsets(), &[3, 1]);
    batch
        .extend(BatchPromptCache::merge(&[&c[..]]).expect("merge"))
        .expect("extend");
    assert_eq!(batch.rows(), 3);
    // Row 2 (value 3.0, two positions) comes back alone, without padding.
    let out = batch.extract(2).expect("extract");
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].offset(), 2);
    assert_eq!(values_of(out[1].as_ref()), vec![3.0; 4]);
    batch.filter(&[2, 1]).expect("filter");
    assert_eq!(batch.rows(), 2);
    assert_eq!(
        values_of(batch.extract(1).expect("extract")[0].as_ref()),
        vec![2.0; 2]
    );
    assert!(batch.extract(2).is_err(), "row 2 is gone");
    assert!(batch.filter(&[5]).is_err());
    batch.filter(&[]).expect("filter to nothing");
    assert!(batch.is_empty());
    assert!(batch.layers().is_empty());
}

#[test]
fn merging_rows_with_different_layer_counts_is_refused() {
    let (a, b) = (row(&[2, 2], 1.0), row(&[2], 1.0));
    let err = BatchPromptCache::merge(&[&a[..], &b[..]]).unwrap_err();
    assert!(
        err.to_string().contains("row 1 has 1 layer caches"),
        "{err}"
    );
}

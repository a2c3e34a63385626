//! Behaviour of the standard KVCache that does not need Python.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops::arange, Array, Dtype};
use mlx_cache::{KVCache, KvCache, KvFetch};

fn ramp(start: i32, s: i32, d: i32) -> Array {
    arange(
        f64::from(start * d),
        f64::from((start + s) * d),
        1.0,
        Dtype::Float32,
    )
    .and_then(|a| a.reshape(&[1, 1, s, d]))
    .expect("ramp")
}

#[test]
fn kv_cache_grows_in_steps_of_256_and_returns_written_prefix() {
    let mut c = KVCache::new();
    let (k, v) = c.update(&ramp(0, 3, 2), &ramp(0, 3, 2)).expect("update");
    assert_eq!(k.shape(), vec![1, 1, 3, 2]);
    assert_eq!(c.keys().expect("buffer").shape(), vec![1, 1, 256, 2]);
    assert_eq!(
        k.to_vec::<f32>().expect("read"),
        (0..6).map(|x| x as f32).collect::<Vec<_>>()
    );
    assert_eq!(
        v.to_vec::<f32>().expect("read"),
        k.to_vec::<f32>().expect("read")
    );

    // Crossing the 256 boundary grows the buffer by another step.
    let KvFetch::Plain { keys, .. } = c
        .update_and_fetch(&ramp(3, 300, 2), &ramp(3, 300, 2))
        .expect("update")
    else {
        panic!("KVCache must return plain keys");
    };
    assert_eq!(keys.shape(), vec![1, 1, 303, 2]);
    assert_eq!(c.offset(), 303);
    // 3 is not a multiple of 256, so the buffer was cut to 3 and grown by 2 steps.
    assert_eq!(c.keys().expect("buffer").shape(), vec![1, 1, 515, 2]);
    let want: Vec<f32> = (0..606).map(|x| x as f32).collect();
    assert_eq!(keys.to_vec::<f32>().expect("read"), want);

    assert_eq!(c.trim(5), 5);
    assert_eq!(c.offset(), 298);
    let (k, _) = c
        .update(&ramp(1000, 1, 2), &ramp(1000, 1, 2))
        .expect("update");
    assert_eq!(k.shape(), vec![1, 1, 299, 2]);
    let got = k.to_vec::<f32>().expect("read");
    assert_eq!(&got[596..], &[2000.0, 2001.0]);
}

//! Helpers shared by mlx-nn's bit-for-bit tests.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // a test fails by panicking
use mlx_array::{random, Array, Dtype};

/// Normal random values of `shape` from `seed`, drawn in float32 and cast to `dtype`.
pub fn randn(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let k = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&k))
        .unwrap()
        .astype(dtype)
        .unwrap()
}

/// The float32 bit patterns of `a`'s values (exact for bfloat16 and float16 too).
pub fn bits(a: &Array) -> Vec<u32> {
    a.astype(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

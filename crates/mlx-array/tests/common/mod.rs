//! What the kernel tests of this crate share (included with `mod common;`).
#![allow(dead_code)] // each test file uses part of it
#![allow(clippy::unwrap_used)] // a test fails by panicking
use mlx_array::{random, Array, Dtype};

/// Standard normal values drawn in float32 from key `seed`, cast to `dtype`.
pub fn normal(shape: &[i32], dtype: Dtype, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&key))
        .unwrap()
        .astype(dtype)
        .unwrap()
}

/// [`normal`] in bfloat16, the activations and weights most kernel tests use.
pub fn bf16_normal(shape: &[i32], seed: u64) -> Array {
    normal(shape, Dtype::Bfloat16, seed)
}

//! Our attention kernel over left-padded rows (`mlx_array::fast::sdpa_padded`,
//! shim/fast_sdpa.cpp) runs only on a CUDA device and declines everything else: on the
//! CPU, and for calls it does not cover (a query of more than one position, a head size it
//! has no form for, paddings of the wrong length). Its results are checked against MLX's
//! masked attention on a CUDA device by `mlx-engine`'s `sdpa_pad_check`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::fast::sdpa_padded;
use mlx_array::{Array, Device, DeviceType};
mod common;
use common::bf16_normal;

#[test]
fn padded_attention_declines_what_it_does_not_cover() {
    let gpu = Device::default_device().unwrap().kind == DeviceType::Gpu;
    let (b, hq, hkv, d, l) = (4, 8, 2, 128, 40);
    let lp = Array::from_slice(&[0i32, 3, 10, 39], &[b]).unwrap();
    let k = bf16_normal(&[b, hkv, l, d], 2);
    let v = bf16_normal(&[b, hkv, l, d], 3);
    let one = bf16_normal(&[b, hq, 1, d], 1);
    // Covered on a CUDA device only.
    assert_eq!(sdpa_padded(&one, &k, &v, 0.1, &lp).unwrap().is_some(), gpu);
    // Two query positions, a head size of 96, paddings for 3 rows: never.
    let two = bf16_normal(&[b, hq, 2, d], 4);
    assert!(sdpa_padded(&two, &k, &v, 0.1, &lp).unwrap().is_none());
    let (k96, v96, q96) = (
        bf16_normal(&[b, hkv, l, 96], 5),
        bf16_normal(&[b, hkv, l, 96], 6),
        bf16_normal(&[b, hq, 1, 96], 7),
    );
    assert!(sdpa_padded(&q96, &k96, &v96, 0.1, &lp).unwrap().is_none());
    let lp3 = Array::from_slice(&[0i32, 1, 2], &[3]).unwrap();
    assert!(sdpa_padded(&one, &k, &v, 0.1, &lp3).unwrap().is_none());
}

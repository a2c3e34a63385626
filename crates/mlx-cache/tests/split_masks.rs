//! A batch cache's masks for a few positions a row while attention splits them one query
//! at a time (`MLX_SDPA_SPLIT_QUERIES`, forced here so that the CPU takes the path): causal
//! where no row is padded, the mask with the padding alongside where some row is, and
//! mlx-lm's array otherwise (a window, too many positions). Attention under each gives
//! what mlx-lm's array mask gives. Every test in this file forces the split (the setting
//! is read once a process).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use mlx_array::fast::{self, SdpaMask};
use mlx_array::{random, Array, Dtype};
use mlx_cache::{batch_causal_mask, AttnMask, BatchKVCache, KvCache, KvFetch};
use mlx_nn::attention::scaled_dot_product_attention;

const HEADS: i32 = 4;
const KV_HEADS: i32 = 2;
const DIM: i32 = 64;

fn force_split() {
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("MLX_SDPA_SPLIT_QUERIES", "force") };
}

fn normal(shape: &[i32]) -> Array {
    random::normal(shape, Dtype::Float32, None, None, None).unwrap()
}

/// A batch cache of `left_padding.len()` rows holding `before` positions.
fn filled(left_padding: &[i32], before: i32) -> BatchKVCache {
    let b = left_padding.len() as i32;
    let mut c = BatchKVCache::new(left_padding);
    c.update_and_fetch(
        &normal(&[b, KV_HEADS, before, DIM]),
        &normal(&[b, KV_HEADS, before, DIM]),
    )
    .unwrap();
    c
}

/// `n` more positions a row (a verification's), as a model's layer takes them after
/// asking for the mask: the keys and values attention sees.
fn verify(c: &mut BatchKVCache, n: i32) -> KvFetch {
    let b = c.left_padding().len() as i32;
    c.update_and_fetch(
        &normal(&[b, KV_HEADS, n, DIM]),
        &normal(&[b, KV_HEADS, n, DIM]),
    )
    .unwrap()
}

/// Attention of `q` under `mask` against the fused call under mlx-lm's array mask.
fn assert_attends_as_the_array(q: &Array, fetch: &KvFetch, mask: &AttnMask, array: &Array) {
    assert_attends_as_the_array_within(q, fetch, mask, array, 1e-5, 1e-6);
}

/// The same within `rtol` / `atol`, compared in float32.
fn assert_attends_as_the_array_within(
    q: &Array,
    fetch: &KvFetch,
    mask: &AttnMask,
    array: &Array,
    rtol: f64,
    atol: f64,
) {
    let KvFetch::Plain { keys, values } = fetch else {
        panic!("a plain fetch")
    };
    let got = scaled_dot_product_attention(q, fetch, 0.125, mask, None).unwrap();
    let want =
        fast::scaled_dot_product_attention(q, keys, values, 0.125, SdpaMask::Array(array), None)
            .unwrap();
    assert_eq!(got.shape(), want.shape());
    let f32 = |a: &Array| a.astype(Dtype::Float32).unwrap();
    let close = f32(&got)
        .allclose(&f32(&want), rtol, atol, false)
        .unwrap()
        .item::<bool>()
        .unwrap();
    assert!(
        close,
        "{mask:?} ({}): attention differs from the array mask's",
        q.dtype()
    );
}

#[test]
fn unpadded_rows_verify_under_a_causal_mask() {
    force_split();
    random::seed(3).unwrap();
    let mut c = filled(&[0, 0], 7);
    let mask = c.make_mask(4, false, None).unwrap();
    assert!(matches!(mask, AttnMask::Causal), "{mask:?}");
    // Decoding keeps no mask; a window or more positions than the split takes, the array.
    assert!(matches!(
        c.make_mask(1, false, None).unwrap(),
        AttnMask::None
    ));
    assert!(matches!(
        c.make_mask(4, false, Some(3)).unwrap(),
        AttnMask::Array(_)
    ));
    assert!(matches!(
        c.make_mask(66, false, None).unwrap(),
        AttnMask::Array(_)
    ));
    let fetch = verify(&mut c, 4);
    let q = normal(&[2, HEADS, 4, DIM]);
    let array = batch_causal_mask(4, 7, None, &[0, 0]).unwrap();
    assert_attends_as_the_array(&q, &fetch, &mask, &array);
}

#[test]
fn padded_rows_verify_with_their_padding_alongside() {
    force_split();
    random::seed(5).unwrap();
    let pads = [3, 0, 6];
    let mut c = filled(&pads, 9);
    let mask = c.make_mask(5, false, None).unwrap();
    let array = batch_causal_mask(5, 9, None, &pads).unwrap();
    let AttnMask::LeftPadded {
        mask: m,
        left_padding,
    } = &mask
    else {
        panic!("padded rows: {mask:?}")
    };
    assert_eq!(left_padding.to_vec::<i32>().unwrap(), pads);
    assert!(m
        .array_equal(&array, false)
        .unwrap()
        .item::<bool>()
        .unwrap());
    let fetch = verify(&mut c, 5);
    let q = normal(&[3, HEADS, 5, DIM]);
    assert_attends_as_the_array(&q, &fetch, &mask, &array);
    // In bfloat16 too (the dtype the GPU's kernel takes; the CPU declines it).
    let bf = |a: &Array| a.astype(Dtype::Bfloat16).unwrap();
    let KvFetch::Plain { keys, values } = &fetch else {
        panic!("a plain fetch")
    };
    let fetch16 = KvFetch::Plain {
        keys: bf(keys),
        values: bf(values),
    };
    assert_attends_as_the_array_within(&bf(&q), &fetch16, &mask, &array, 2e-2, 2e-2);
}

/// A short prompt's prefill in a left-padded batch (from position 0): a query before its
/// row's first key would see no key of its row through the padded-rows kernel, so the
/// batch keeps mlx-lm's array there (under which MLX attends to every key evenly); once
/// every query sees a key of its row (the same rows a step later), the padding goes
/// beside the mask.
#[test]
fn a_left_padded_prefill_keeps_the_array() {
    force_split();
    random::seed(9).unwrap();
    let pads = [0, 3];
    let mut c = BatchKVCache::new(&pads);
    let mask = c.make_mask(5, false, None).unwrap();
    assert!(matches!(mask, AttnMask::Array(_)), "{mask:?}");
    let fetch = verify(&mut c, 5);
    let q = normal(&[2, HEADS, 5, DIM]);
    let array = batch_causal_mask(5, 0, None, &pads).unwrap();
    assert_attends_as_the_array(&q, &fetch, &mask, &array);
    // Rows padded by at most the positions held: each query sees a key of its row.
    assert!(matches!(
        c.make_mask(2, false, None).unwrap(),
        AttnMask::LeftPadded { .. }
    ));
}

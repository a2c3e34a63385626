//! Our attention kernel over left-padded rows (`mlx_array::fast::sdpa_padded`,
//! `crates/mlx-sys/shim/fast_sdpa.cpp`; 1, 2, 3 and 4 query heads a block below) against
//! MLX's attention with the boolean padding mask batched decoding uses today: for each
//! shape (rows, query / key-value heads, head size, keys) and random paddings, the largest
//! error of each against a float32 reference of the same masked attention, and the time
//! of each (median of rounds of 64 evaluations). Exits 1 when ours is missing where it
//! should apply or errs by more than twice MLX's error plus one bfloat16 step.
//!
//! Then a speculative verification's attention (a few queries a row, causal over the
//! rows' padding) as `mlx_nn::attention` runs it with `MLX_SDPA_SPLIT_QUERIES=1` (each
//! query our padded-rows kernel, or MLX's one-query kernel where no row is padded) against
//! MLX's fused call under mlx-lm's array mask (cuDNN), with the same checks; and, for the
//! padded rows, the queries as one launch of our kernel (the default;
//! `MLX_SDPA_PADDED_QUERIES=0`: a launch a query) against a launch a query: every bit
//! equal.
//!
//! ```sh
//! cargo run --release -p mlx-engine --example sdpa_pad_check -- [ITERS]
//! ```
//! Needs a CUDA device (on the CPU it says so and exits 0).
#[path = "common/qmm.rs"]
mod common;

use common::{scaled_normal, time_us, Res};
use mlx_array::fast::{scaled_dot_product_attention, sdpa_padded, SdpaMask};
use mlx_array::ops::arange;
use mlx_array::{transforms, Array, Device, DeviceType, Dtype};
use mlx_nn::cache::{AttnMask, KvFetch};

/// Rows, query heads, key-value heads, head size, keys.
const SHAPES: [(i32, i32, i32, i32, i32); 8] = [
    (8, 32, 8, 128, 256),
    (8, 32, 8, 128, 1100),
    (32, 32, 8, 128, 300),
    (1, 32, 8, 128, 64),
    (16, 14, 2, 64, 500),
    (4, 16, 16, 64, 40),
    (8, 32, 8, 64, 200),
    (6, 9, 3, 64, 120),
];

/// The boolean mask `position >= left_padding[b]`, `[B, 1, 1, L]`.
fn padding_mask(lp: &Array, b: i32, l: i32) -> Res<Array> {
    let pos = arange(0.0, l as f64, 1.0, Dtype::Int32)?.reshape(&[1, 1, 1, l])?;
    Ok(pos.greater_equal(&lp.reshape(&[b, 1, 1, 1])?)?)
}

/// Queries `[B, Hq, N, D]`, and keys and values `[B, Hkv, L, D]` as views of a longer
/// buffer (as a KV cache hands them out), from `seed`.
fn qkv(b: i32, hq: i32, hkv: i32, d: i32, n: i32, l: i32, seed: u64) -> Res<[Array; 3]> {
    let q = scaled_normal(&[b, hq, n, d], seed, 1.0)?;
    let kbuf = scaled_normal(&[b, hkv, l + 37, d], seed + 1, 1.0)?;
    let vbuf = scaled_normal(&[b, hkv, l + 37, d], seed + 2, 1.0)?;
    let k = kbuf.slice(&[0, 0, 0, 0], &[b, hkv, l, d], None)?;
    let v = vbuf.slice(&[0, 0, 0, 0], &[b, hkv, l, d], None)?;
    Ok([q, k, v])
}

/// The masked attention in float32, the reference both sides' errors are taken from.
fn reference(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Array) -> Res<Array> {
    let f32 = |a: &Array| a.astype(Dtype::Float32);
    Ok(scaled_dot_product_attention(
        &f32(q)?,
        &f32(k)?,
        &f32(v)?,
        scale,
        SdpaMask::Array(mask),
        None,
    )?)
}

/// The time of MLX's attention under the array `mask` (what `time_us` reports).
fn time_masked(
    iters: usize,
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: &Array,
) -> Res<f64> {
    time_us(iters, &|| {
        Ok(scaled_dot_product_attention(
            q,
            k,
            v,
            scale,
            SdpaMask::Array(mask),
            None,
        )?)
    })
}

/// The largest absolute difference of `a` from `reference`.
fn max_err(a: &Array, reference: &Array) -> Res<f64> {
    Ok(a.astype(Dtype::Float32)?
        .subtract(reference)?
        .abs()?
        .max(None, false)?
        .item::<f32>()? as f64)
}

fn main() -> Res<()> {
    let iters: usize = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    if Device::default_device()?.kind != DeviceType::Gpu {
        println!("sdpa_pad_check: needs a CUDA device (the kernel is CUDA's); nothing checked");
        return Ok(());
    }
    let mut failed = false;
    println!("| B | Hq / Hkv | D | L | err ours | err MLX | us ours | us MLX |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (i, &(b, hq, hkv, d, l)) in SHAPES.iter().enumerate() {
        let seed = 10 * i as u64;
        let [q, k, v] = qkv(b, hq, hkv, d, 1, l, seed)?;
        // Paddings from 0 to most of the keys (row 0 unpadded), the last key always seen.
        let pads: Vec<i32> = (0..b)
            .map(|r| (r * 7919) % l.max(1) * (r % 3) / 3)
            .collect();
        let lp = Array::from_slice(&pads, &[b])?;
        let mask = padding_mask(&lp, b, l)?;
        let scale = 1.0 / (d as f32).sqrt();
        let reference = reference(&q, &k, &v, scale, &mask)?;
        let mlx = scaled_dot_product_attention(&q, &k, &v, scale, SdpaMask::Array(&mask), None)?;
        let Some(ours) = sdpa_padded(&q, &k, &v, scale, &lp)? else {
            println!("| {b} | {hq} / {hkv} | {d} | {l} | not taken | | | |");
            failed = true;
            continue;
        };
        transforms::eval(&[&reference, &mlx, &ours])?;
        let (e_ours, e_mlx) = (max_err(&ours, &reference)?, max_err(&mlx, &reference)?);
        let t_ours = time_us(iters, &|| {
            Ok(sdpa_padded(&q, &k, &v, scale, &lp)?.ok_or("gone")?)
        })?;
        let t_mlx = time_masked(iters, &q, &k, &v, scale, &mask)?;
        // One bfloat16 step at the outputs' size (~1) on top of twice MLX's error (a NaN
        // fails too).
        let within = e_ours <= 2.0 * e_mlx + 1.0 / 128.0;
        failed |= !within;
        println!(
            "| {b} | {hq} / {hkv} | {d} | {l} | {e_ours:.2e} | {e_mlx:.2e} | {t_ours:.1} | {t_mlx:.1} |"
        );
    }
    failed |= verification_cases(iters)?;
    println!("RESULT: {}", if failed { "FAIL" } else { "PASS" });
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// A verification's queries over padded rows as one launch of our kernel against a launch
/// a query over the keys up to its position (what the split ran before
/// `MLX_SDPA_PADDED_QUERIES`): every bit must be equal. Prints a line; whether it failed.
fn one_launch_case(
    iters: usize,
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    pads: &[i32],
) -> Res<bool> {
    let (b, n, l) = (q.dim(0)?, q.dim(2)?, k.dim(2)?);
    let lp = Array::from_slice(pads, &[b])?;
    let one = || -> Res<Array> { Ok(sdpa_padded(q, k, v, scale, &lp)?.ok_or("not taken")?) };
    let each = || -> Res<Array> {
        let rows = (0..n)
            .map(|i| {
                let visible = l - n + i + 1;
                let row = sdpa_padded(
                    &q.slice_axis(2, i, i + 1)?,
                    &k.slice_axis(2, 0, visible)?,
                    &v.slice_axis(2, 0, visible)?,
                    scale,
                    &lp,
                )?;
                Ok(row.ok_or("not taken")?)
            })
            .collect::<Res<Vec<_>>>()?;
        Ok(mlx_array::ops::concatenate(
            &rows.iter().collect::<Vec<_>>(),
            2,
        )?)
    };
    let (a, e) = (one()?, each()?);
    let same = a.array_equal(&e, false)?.item::<bool>()?;
    let (t_one, t_each) = (time_us(iters, &one)?, time_us(iters, &each)?);
    println!(
        "  one launch for {n} queries of {b} rows: {} a launch a query; us {t_one:.1} against {t_each:.1}",
        if same { "identical to" } else { "DIFFERS from" }
    );
    Ok(!same)
}

/// Rows, queries a row, query / key-value heads, head size, keys (the queries' included).
const VERIFY_SHAPES: [(i32, i32, i32, i32, i32, i32); 6] = [
    (1, 4, 32, 8, 128, 600),
    (8, 4, 32, 8, 128, 600),
    (8, 8, 32, 8, 128, 1100),
    (32, 4, 32, 8, 128, 300),
    (4, 4, 14, 2, 64, 500),
    (2, 2, 9, 3, 64, 120),
];

/// The verification cases; whether any failed.
fn verification_cases(iters: usize) -> Res<bool> {
    let split = std::env::var("MLX_SDPA_SPLIT_QUERIES").as_deref() == Ok("1");
    let one_launch = std::env::var("MLX_SDPA_PADDED_QUERIES").as_deref() != Ok("0");
    println!();
    println!(
        "verification (MLX_SDPA_SPLIT_QUERIES={})",
        if split { "1" } else { "unset" }
    );
    println!("| B | N | Hq / Hkv | D | L | padded | err split | err MLX | us split | us MLX |");
    println!("| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |");
    let mut failed = false;
    for (i, &(b, n, hq, hkv, d, l)) in VERIFY_SHAPES.iter().enumerate() {
        for padded in [false, true] {
            let seed = 1000 + 10 * i as u64 + padded as u64;
            let [q, k, v] = qkv(b, hq, hkv, d, n, l, seed)?;
            let pads: Vec<i32> = (0..b)
                .map(|r| {
                    if padded {
                        (r * 7919) % (l - n) * (r % 3) / 3
                    } else {
                        0
                    }
                })
                .collect();
            // mlx-lm's batch mask: query `i` sees keys `pads[b] ..= l - n + i`.
            let mask = mlx_cache::batch_causal_mask(n, l - n, None, &pads)?;
            let attn_mask = if padded {
                AttnMask::LeftPadded {
                    mask: mask.clone(),
                    left_padding: Array::from_slice(&pads, &[b])?,
                }
            } else {
                AttnMask::Causal
            };
            let scale = 1.0 / (d as f32).sqrt();
            let reference = reference(&q, &k, &v, scale, &mask)?;
            let fetch = KvFetch::Plain {
                keys: k.clone(),
                values: v.clone(),
            };
            let ours_of = || {
                mlx_nn::attention::scaled_dot_product_attention(
                    &q,
                    &fetch,
                    scale as f64,
                    &attn_mask,
                    None,
                )
            };
            let launches = mlx_array::fast::sdpa_padded_launches();
            let ours = ours_of()?;
            let took = mlx_array::fast::sdpa_padded_launches() - launches;
            if padded {
                failed |= one_launch_case(iters, &q, &k, &v, scale, &pads)?;
            }
            let mlx =
                scaled_dot_product_attention(&q, &k, &v, scale, SdpaMask::Array(&mask), None)?;
            transforms::eval(&[&reference, &mlx, &ours])?;
            let (e_ours, e_mlx) = (max_err(&ours, &reference)?, max_err(&mlx, &reference)?);
            let t_ours = time_us(iters, &|| Ok(ours_of()?))?;
            let t_mlx = time_masked(iters, &q, &k, &v, scale, &mask)?;
            // With the split on, padded rows must have run our kernel: one launch for the
            // queries by default, a launch a query with `MLX_SDPA_PADDED_QUERIES=0`.
            let want = if one_launch { 1 } else { n as u64 };
            let missing = split && padded && took != want;
            let within = e_ours <= 2.0 * e_mlx + 1.0 / 128.0;
            failed |= missing || !within;
            println!(
                "| {b} | {n} | {hq} / {hkv} | {d} | {l} | {padded}{} | {e_ours:.2e} | {e_mlx:.2e} | {t_ours:.1} | {t_mlx:.1} |",
                if missing { " (kernel not taken)" } else { "" }
            );
        }
    }
    Ok(failed)
}

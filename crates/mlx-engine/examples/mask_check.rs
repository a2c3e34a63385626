//! Our grammar-mask kernel (`mlx_array::fast::masked_logits`,
//! `crates/mlx-sys/shim/fast_mask.cpp`, on by default) against the ops the decoding
//! step uses without it (`constrain::expand_mask_words` then `constrain::apply_mask`): for
//! each shape (rows, vocabulary, some not a multiple of 32) and dtype, random logits and
//! random bitsets (with rows allowing nothing, everything, and a few tokens), whether every
//! output's bits are equal, and the time of each (building, queueing and running: median
//! of rounds of 64). Exits 1 when a result differs or the kernel is not taken where it
//! should be.
//!
//! ```sh
//! cargo run --release -p mlx-engine --example mask_check -- [ITERS]
//! ```
//! Needs a CUDA device (on the CPU it says so and exits 0).
#[path = "common/qmm.rs"]
mod common;

use common::{time_us, Res};
use mlx_array::fast::{masked_logits, set_fast_mask};
use mlx_array::{random, transforms, Array, Device, DeviceType, Dtype};
use mlx_engine::constrain::{apply_mask, expand_mask_words};

/// Rows, vocabulary.
const SHAPES: [(i32, i32); 6] = [
    (1, 151_936),
    (32, 151_936),
    (1, 128_256),
    (32, 128_256),
    (8, 49_152),
    (3, 1_001),
];

fn main() -> Res<()> {
    let iters: usize = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    if Device::default_device()?.kind != DeviceType::Gpu {
        println!("mask_check: needs a CUDA device (the kernel is CUDA's); nothing checked");
        return Ok(());
    }
    set_fast_mask(true);
    let mut failed = false;
    println!("| rows | vocab | dtype | equal | us ours | us ops |");
    println!("| ---: | ---: | --- | --- | ---: | ---: |");
    for (i, &(r, v)) in SHAPES.iter().enumerate() {
        let n = (v as usize).div_ceil(32);
        // Bitsets: row 0 allows nothing, row 1 everything, row 2 a few tokens, the rest
        // random words (bits past the vocabulary set too: they must be ignored).
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        };
        let mut words = vec![0u32; r as usize * n];
        for (row, w) in words.chunks_exact_mut(n).enumerate() {
            match row {
                0 => {}
                1 => w.fill(u32::MAX),
                2 => {
                    for t in [0usize, 31, 32, v as usize - 1] {
                        w[t / 32] |= 1 << (t % 32);
                    }
                }
                _ => w.iter_mut().for_each(|x| *x = next()),
            }
        }
        let words = Array::from_slice(&words, &[r, n as i32, 1])?;
        for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
            let key = random::key(i as u64)?;
            let logits = random::normal(&[r, v], Dtype::Float32, None, None, Some(&key))?
                .multiply(&Array::scalar(8.0f32)?)?
                .astype(dtype)?;
            transforms::eval(&[&logits, &words])?;
            let ops = || -> Res<Array> {
                Ok(apply_mask(
                    &expand_mask_words(&words, v as usize)?,
                    &logits,
                )?)
            };
            let Some(ours) = masked_logits(&words, &logits)? else {
                println!("| {r} | {v} | {dtype:?} | not taken | | |");
                failed = true;
                continue;
            };
            let theirs = ops()?;
            transforms::eval(&[&ours, &theirs])?;
            // Bits compared as unsigned integers of the dtype's width.
            let bits = |a: &Array| -> Res<Vec<u32>> {
                Ok(match dtype {
                    Dtype::Float32 => a.view(Dtype::Uint32)?.to_vec::<u32>()?,
                    _ => a
                        .view(Dtype::Uint16)?
                        .astype(Dtype::Uint32)?
                        .to_vec::<u32>()?,
                })
            };
            let equal = ours.shape() == theirs.shape() && bits(&ours)? == bits(&theirs)?;
            failed |= !equal;
            let t_ours = time_us(
                iters,
                &|| Ok(masked_logits(&words, &logits)?.ok_or("gone")?),
            )?;
            let t_ops = time_us(iters, &ops)?;
            println!("| {r} | {v} | {dtype:?} | {equal} | {t_ours:.1} | {t_ops:.1} |");
        }
    }
    println!("RESULT: {}", if failed { "FAIL" } else { "PASS" });
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

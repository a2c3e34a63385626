//! Our tiled CUDA kernel for 4-bit products of 33 or more rows and its gathered forms
//! (`mlx_array::quant::set_fast_qgemm`, shim/fast_qmm.cpp) must stay out of the way
//! wherever it does not apply: off the CUDA backend every product is MLX's own. Its
//! bit-identity with MLX's `qmm_sm80` is checked on a CUDA device by `mlx-engine`'s
//! `qgemm_check` (benchmarks/GPU.md, session 24); these tests run on any backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::quant::{
    fast_gather_qgemm_launches, fast_qgemm_launches, gather_qmm, quantize, quantized_matmul,
    set_fast_qgemm, QuantMode, Quantized,
};
use mlx_array::{Array, Device, DeviceType, Dtype};
use std::sync::{Mutex, MutexGuard};
mod common;
use common::bf16_normal;

/// The switch is process-wide: under `cargo test` (threads) these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `a` and `b` hold the same bits (bfloat16 values compared as uint16).
fn same_bits(a: &Array, b: &Array) -> bool {
    a.view(Dtype::Uint16)
        .unwrap()
        .array_equal(&b.view(Dtype::Uint16).unwrap(), false)
        .unwrap()
        .item::<bool>()
        .unwrap()
}

fn product(x: &Array, q: &Quantized, gs: i32) -> Array {
    let y = quantized_matmul(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        true,
        Some(gs),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    y.eval().unwrap();
    y
}

#[test]
fn off_the_cuda_backend_mlx_runs_the_product() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build (CUDA or Metal): covered by qgemm_check on the device.
        return;
    }
    // Shapes around the kernel's floor on a CUDA device (33 rows), N % 128 == 0, K % 64 == 0.
    let (n, k) = (256, 512);
    for gs in [32, 64, 128] {
        let q = quantize(
            &bf16_normal(&[n, k], 1),
            Some(gs),
            Some(4),
            QuantMode::Affine,
        )
        .unwrap();
        for m in [8, 33] {
            let x = bf16_normal(&[1, m, k], 2 + m as u64);
            set_fast_qgemm(false);
            let theirs = product(&x, &q, gs);
            set_fast_qgemm(true);
            let before = fast_qgemm_launches();
            let ours = product(&x, &q, gs);
            assert_eq!(
                fast_qgemm_launches(),
                before,
                "group {gs}, {m} rows: taken on the CPU"
            );
            assert_eq!(ours.shape(), vec![1, m, n]);
            assert!(
                same_bits(&ours, &theirs),
                "group {gs}, {m} rows: other bits"
            );
        }
    }
}

/// `gather_qmm(x, experts q, rhs_indices=idx)` with the tiled kernel's switch `on`.
fn gathered(x: &Array, q: &Quantized, idx: &Array, sorted: bool, on: bool) -> Array {
    set_fast_qgemm(on);
    let y = gather_qmm(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        None,
        Some(idx),
        true,
        Some(64),
        Some(4),
        QuantMode::Affine,
        sorted,
    )
    .unwrap();
    y.eval().unwrap();
    y
}

/// The gathered forms (mixture-of-experts products as mlx-lm's layers make them, sorted
/// and unsorted): off the CUDA backend they are never taken (the CPU's own product runs,
/// MLX's or cpu_gemv.cpp's of MLX's arithmetic).
#[test]
fn off_the_cuda_backend_mlx_runs_the_gathered_product() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        return;
    }
    // 4 experts of 128 x 256, 64 sorted rows (16 an expert): a product the chunks take on
    // CUDA.
    let (e, n, k, m) = (4, 128, 256, 64);
    let q = quantize(
        &bf16_normal(&[e, n, k], 7),
        Some(64),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    let x = bf16_normal(&[m, 1, k], 8);
    let idx = Array::from_slice(
        &(0..m).map(|i| (i * e / m) as u32).collect::<Vec<_>>(),
        &[m],
    )
    .unwrap();
    let theirs = gathered(&x, &q, &idx, true, false);
    let before = fast_gather_qgemm_launches();
    let ours = gathered(&x, &q, &idx, true, true);
    assert_eq!(fast_gather_qgemm_launches(), before, "taken on the CPU");
    assert_eq!(ours.shape(), vec![m, 1, n]);
    assert!(same_bits(&ours, &theirs), "other bits");

    // Unsorted, one row of x for each of 2 tokens' top 4 of 8 experts of 136 x 256 (N not
    // a multiple of 128): 8 rows, which the runs take on CUDA.
    let (e, n) = (8, 136);
    let q = quantize(
        &bf16_normal(&[e, n, k], 9),
        Some(64),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    let x = bf16_normal(&[2, 1, 1, k], 10);
    let idx = Array::from_slice(&[5u32, 1, 7, 2, 0, 6, 3, 4], &[2, 4]).unwrap();
    let theirs = gathered(&x, &q, &idx, false, false);
    let before = fast_gather_qgemm_launches();
    let ours = gathered(&x, &q, &idx, false, true);
    assert_eq!(fast_gather_qgemm_launches(), before, "taken on the CPU");
    assert_eq!(ours.shape(), vec![2, 4, 1, n]);
    assert!(same_bits(&ours, &theirs), "other bits");
}

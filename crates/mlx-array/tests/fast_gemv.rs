//! Our one-row CUDA kernel for dense matmuls (`mlx_array::fast::set_gemv`,
//! shim/fast_gemv.cpp) must stay out of the way wherever it does not apply. Its
//! bit-identity with MLX's `gemv` kernel is checked on a CUDA device by `mlx-engine`'s
//! `fused_check MODEL ... gemv` (benchmarks/GPU.md, session 23); these tests run on any
//! backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::fast::{gemv_enabled, gemv_launches, set_gemv};
use mlx_array::{random, Array, Device, DeviceType, Dtype};
use std::sync::{Mutex, MutexGuard};

/// The switch is process-wide: under `cargo test` (threads) these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn normal(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&key))
        .unwrap()
        .astype(dtype)
        .unwrap()
}

/// `x @ w.T` of a shape the kernel takes on a CUDA device (one row, K a multiple of 128,
/// over the size floor), evaluated: (with the kernel on, with it off).
fn both(dtype: Dtype, evaluated_t: bool) -> (Array, Array) {
    let (n, k) = (4096, 1024);
    let w = normal(&[n, k], 1, dtype);
    let x = normal(&[1, 1, k], 2, dtype);
    w.eval().unwrap();
    let run = |on: bool| {
        set_gemv(on);
        let wt = w.transpose(None).unwrap();
        if evaluated_t {
            wt.eval().unwrap();
        }
        let y = x.matmul(&wt).unwrap();
        y.eval().unwrap();
        y
    };
    let ours = run(true);
    let theirs = run(false);
    set_gemv(true);
    (ours, theirs)
}

#[test]
fn the_switch_turns_it_on_and_off() {
    let _g = serial();
    set_gemv(false);
    assert!(!gemv_enabled());
    set_gemv(true);
    assert!(gemv_enabled());
}

#[test]
fn it_never_runs_off_the_gpu_and_leaves_the_product_as_it_was() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build (CUDA or Metal): covered by fused_check on the device.
        return;
    }
    for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
        for evaluated_t in [false, true] {
            let before = gemv_launches();
            let (ours, theirs) = both(dtype, evaluated_t);
            assert_eq!(gemv_launches(), before, "{dtype:?}: taken on the CPU");
            assert_eq!(ours.shape(), vec![1, 1, 4096]);
            assert!(ours.array_equal(&theirs, false).unwrap().item::<bool>().unwrap());
        }
    }
}

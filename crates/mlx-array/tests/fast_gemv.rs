//! Our one-row CUDA kernel for dense matmuls with their residual add or swiglu
//! (`mlx_array::fast::{matmul_add, matmul_swiglu}`, shim/fast_gemv.cpp) must stay out of
//! the way wherever it does not apply: there `matmul_add` is MLX's `add` of the residual
//! and the product, and `matmul_swiglu` declines. Its
//! bit-identity with MLX's `gemv` kernel is checked on a CUDA device by `mlx-engine`'s
//! `fused_check MODEL ... gemv` (benchmarks/GPU.md, session 23); these tests run on any
//! backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::fast::{gemv_enabled, gemv_launches, matmul_add, matmul_swiglu, set_gemv};
use mlx_array::{Device, DeviceType, Dtype};
use std::sync::{Mutex, MutexGuard};
mod common;
use common::normal;

/// The switch is process-wide: under `cargo test` (threads) these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `residual + x @ w.T` and the fused swiglu of a shape the kernel takes on a CUDA device
/// (one row, K a multiple of 128, over the size floor), evaluated, with the kernel on,
/// against `residual + x @ w.T` built from MLX's ops.
fn check(dtype: Dtype, evaluated_t: bool) {
    let (n, k) = (4096, 1024);
    let w = normal(&[n, k], dtype, 1);
    let x = normal(&[1, 1, k], dtype, 2);
    let r = normal(&[1, 1, n], dtype, 3);
    w.eval().unwrap();
    set_gemv(true);
    let wt = w.transpose(None).unwrap();
    if evaluated_t {
        wt.eval().unwrap();
    }
    let before = gemv_launches();
    let ours = matmul_add(&x, &wt, &r).unwrap();
    ours.eval().unwrap();
    assert!(
        matmul_swiglu(&x, &wt).unwrap().is_none(),
        "{dtype:?}: swiglu taken"
    );
    assert_eq!(gemv_launches(), before, "{dtype:?}: taken on the CPU");
    let theirs = r.add(&x.matmul(&wt).unwrap()).unwrap();
    assert_eq!(ours.shape(), vec![1, 1, 4096]);
    assert!(ours
        .array_equal(&theirs, false)
        .unwrap()
        .item::<bool>()
        .unwrap());
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
fn off_the_cuda_backend_mlx_runs_the_product_and_the_op() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build (CUDA or Metal): covered by fused_check on the device.
        return;
    }
    for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
        for evaluated_t in [false, true] {
            check(dtype, evaluated_t);
        }
    }
}

#[test]
fn the_rows_form_is_off_by_default_and_settable() {
    let _g = serial();
    use mlx_array::fast::{gemv_rows, set_gemv_rows, GemvRows};
    // The scripts/test.sh environment leaves MLX_FAST_GEMV_ROWS unset.
    if std::env::var_os("MLX_FAST_GEMV_ROWS").is_none() {
        assert_eq!(gemv_rows(), GemvRows::Off);
    }
    for mode in [GemvRows::All, GemvRows::Batch, GemvRows::Off] {
        set_gemv_rows(mode);
        assert_eq!(gemv_rows(), mode);
    }
}

/// With the rows form on, products of several rows off the CUDA backend are still MLX's
/// (the same values as MLX's matmul, no launch of ours), in every form.
#[test]
fn off_the_cuda_backend_the_rows_form_stays_out() {
    let _g = serial();
    use mlx_array::fast::{set_gemv_rows, GemvRows};
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        return;
    }
    let (n, k) = (4096, 1024);
    let w = normal(&[n, k], Dtype::Bfloat16, 4);
    w.eval().unwrap();
    let wt = w.transpose(None).unwrap();
    for mode in [GemvRows::All, GemvRows::Batch] {
        set_gemv_rows(mode);
        for shape in [[1, 4, k], [4, 1, k]] {
            let x = normal(&shape, Dtype::Bfloat16, 5);
            let r = normal(&[shape[0], shape[1], n], Dtype::Bfloat16, 6);
            let before = gemv_launches();
            let plain = x.matmul(&wt).unwrap();
            let add = matmul_add(&x, &wt, &r).unwrap();
            assert!(matmul_swiglu(&x, &wt).unwrap().is_none());
            plain.eval().unwrap();
            add.eval().unwrap();
            assert_eq!(
                gemv_launches(),
                before,
                "{mode:?} {shape:?}: taken on the CPU"
            );
            set_gemv_rows(GemvRows::Off);
            let theirs = x.matmul(&wt).unwrap();
            assert!(plain
                .array_equal(&theirs, false)
                .unwrap()
                .item::<bool>()
                .unwrap());
            let theirs_add = r.add(&theirs).unwrap();
            assert!(add
                .array_equal(&theirs_add, false)
                .unwrap()
                .item::<bool>()
                .unwrap());
            set_gemv_rows(mode);
        }
    }
    set_gemv_rows(GemvRows::Off);
}

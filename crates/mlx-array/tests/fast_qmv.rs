//! Our one-row CUDA kernel for 4-bit `quantized_matmul` (`set_fast_qmv`, shim/fast_qmv.cpp)
//! must stay out of the way wherever it does not apply. Its bit-identity with MLX's `qmv`
//! kernel is checked on a CUDA device by `mlx-engine`'s `fused_check MODEL ... qmv`
//! (every projection shape of Qwen2.5-0.5B / Llama-3.2-1B / Llama-3.1-8B, three group sizes,
//! identical on the H200: benchmarks/GPU.md, run 6); these tests run on any backend.
use mlx_array::quant::{
    fast_qmv_enabled, fast_qmv_launches, quantize, quantized_matmul, set_fast_qmv, QuantMode,
    Quantized,
};
use mlx_array::{random, Array, Device, DeviceType, Dtype};
use std::sync::{Mutex, MutexGuard};

/// The switch is process-wide: under `cargo test` (threads) these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Standard normal bfloat16 values.
fn bf16_normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&key))
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap()
}

/// `x @ dequantize(q).T` (4-bit, group 64), evaluated.
fn qmm(x: &Array, q: &Quantized) -> Array {
    let y = quantized_matmul(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        true,
        Some(64),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    y.eval().unwrap();
    y
}

fn quantized(n: i32, k: i32, seed: u64) -> Quantized {
    quantize(
        &bf16_normal(&[n, k], seed),
        Some(64),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap()
}

/// A one-row product of a shape the kernel takes on a CUDA device (bfloat16, 4-bit
/// affine, group 64): (with the kernel on, with it off).
fn both(k: i32, n: i32) -> (Array, Array) {
    let q = quantized(n, k, 3);
    let x = bf16_normal(&[1, 1, k], 4);
    set_fast_qmv(true);
    let ours = qmm(&x, &q);
    set_fast_qmv(false);
    let theirs = qmm(&x, &q);
    set_fast_qmv(true);
    (ours, theirs)
}

#[test]
fn the_switch_reads_back() {
    let _g = serial();
    set_fast_qmv(false);
    assert!(!fast_qmv_enabled());
    set_fast_qmv(true);
    assert!(fast_qmv_enabled());
}

#[test]
fn off_the_cuda_backend_mlx_runs_the_product() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build (CUDA or Metal): covered by fused_check on the device.
        return;
    }
    let before = fast_qmv_launches();
    let (ours, theirs) = both(4096, 2048);
    assert_eq!(
        fast_qmv_launches(),
        before,
        "the custom kernel must not run on the CPU"
    );
    assert_eq!(ours.shape(), vec![1, 1, 2048]);
    assert!(ours
        .array_equal(&theirs, false)
        .unwrap()
        .item::<bool>()
        .unwrap());
}

#[test]
fn shapes_it_does_not_cover_leave_mlx_in_charge() {
    let _g = serial();
    set_fast_qmv(true);
    let q = quantized(256, 512, 5);
    let before = fast_qmv_launches();
    // Several rows, a small weight, float32 activations: never ours, on any device.
    let f32_row = random::normal(&[1, 512], Dtype::Float32, None, None, None).unwrap();
    for x in [
        bf16_normal(&[3, 512], 6),
        bf16_normal(&[1, 512], 7),
        f32_row,
    ] {
        assert_eq!(*qmm(&x, &q).shape().last().unwrap(), 256);
    }
    assert_eq!(fast_qmv_launches(), before);
}

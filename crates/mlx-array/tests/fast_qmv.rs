//! Our one-row CUDA kernel for 4-bit `quantized_matmul` (`set_fast_qmv`, shim/fast_qmv.cpp)
//! must stay out of the way wherever it does not apply. Its bit-identity with MLX's `qmv`
//! kernel is checked on a CUDA device by `mlx-engine`'s `fused_check MODEL ... qmv`
//! (every projection shape of Qwen2.5-0.5B / Llama-3.2-1B / Llama-3.1-8B, three group sizes,
//! identical on the H200: benchmarks/GPU.md, run 6); these tests run on any backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::quant::{
    fast_qmm_enabled, fast_qmm_launches, fast_qmm_mma, fast_qmm_mma_launches, fast_qmv_enabled,
    fast_qmv_launches, quantize, quantized_matmul, quantized_matmul_add, quantized_matmul_many,
    set_fast_qmm, set_fast_qmm_max_rows, set_fast_qmm_mma, set_fast_qmv, set_fast_qmv_residual,
    QmmMma, QuantMode, Quantized, QuantizedWeight,
};
use mlx_array::{random, Array, Device, DeviceType, Dtype};
use std::sync::{Mutex, MutexGuard};
mod common;
use common::bf16_normal;

/// The switch is process-wide: under `cargo test` (threads) these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
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
fn off_the_cuda_backend_a_pending_rms_norm_stays_mlxs() {
    // MLX_FAST_QMV_NORM: only a CUDA launch takes in the norm of its input; elsewhere the
    // products of a pending rms_norm (one weight, a group, a swiglu pair) are MLX's, and
    // equal to the same products of the evaluated norm.
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build: covered by fused_check ... norm on the device.
        return;
    }
    use mlx_array::fast::rms_norm;
    use mlx_array::quant::{
        fast_qmv_norm_launches, quantized_matmul_swiglu, set_fast_qmv_norm, GateUp,
    };
    let (k, n) = (512, 256);
    let qs = [quantized(n, k, 11), quantized(n, k, 12)];
    let ws: Vec<QuantizedWeight<'_>> = qs.iter().map(QuantizedWeight::from).collect();
    let x = bf16_normal(&[1, 1, k], 13);
    let nw = bf16_normal(&[k], 14);
    let products = |h: &Array| -> Vec<Array> {
        let mut ys = vec![qmm(h, &qs[0])];
        ys.extend(quantized_matmul_many(h, &ws, Some(64), Some(4), QuantMode::Affine).unwrap());
        match quantized_matmul_swiglu(h, ws[0], ws[1], Some(64), Some(4), QuantMode::Affine)
            .unwrap()
        {
            GateUp::Swiglu(y) => ys.push(y),
            GateUp::Products(g, u) => ys.extend([g, u]),
        }
        ys.iter().for_each(|y| y.eval().unwrap());
        ys
    };
    set_fast_qmv(true);
    set_fast_qmv_norm(true);
    let before = fast_qmv_norm_launches();
    let pending = products(&rms_norm(&x, Some(&nw), 1e-5).unwrap());
    assert_eq!(
        fast_qmv_norm_launches(),
        before,
        "no norm in a launch off CUDA"
    );
    set_fast_qmv_norm(false);
    let h = rms_norm(&x, Some(&nw), 1e-5).unwrap();
    h.eval().unwrap();
    let evaluated = products(&h);
    assert_eq!(pending.len(), evaluated.len());
    for (a, b) in pending.iter().zip(&evaluated) {
        assert!(a.array_equal(b, false).unwrap().item::<bool>().unwrap());
    }
}

#[test]
fn shapes_it_does_not_cover_leave_mlx_in_charge() {
    let _g = serial();
    set_fast_qmv(true);
    let q = quantized(256, 512, 5);
    let before = fast_qmv_launches();
    // Several rows (the multi-row kernel's, counted apart), float32 activations: never the
    // one-row kernels, on any device.
    let f32_row = random::normal(&[1, 512], Dtype::Float32, None, None, None).unwrap();
    for x in [bf16_normal(&[3, 512], 6), f32_row] {
        assert_eq!(*qmm(&x, &q).shape().last().unwrap(), 256);
    }
    assert_eq!(fast_qmv_launches(), before);
}

#[test]
fn the_multi_row_switch_reads_back() {
    let _g = serial();
    set_fast_qmm(false);
    assert!(!fast_qmm_enabled());
    set_fast_qmm(true);
    assert!(fast_qmm_enabled());
}

#[test]
fn the_tensor_core_form_is_on_by_default_and_reads_back() {
    let _g = serial();
    // MLX_FAST_QMM_MMA is unset in the test environment: the default is on.
    if std::env::var_os("MLX_FAST_QMM_MMA").is_none() {
        assert_eq!(fast_qmm_mma(), QmmMma::On);
    }
    for mode in [QmmMma::Off, QmmMma::Force, QmmMma::On] {
        set_fast_qmm_mma(mode);
        assert_eq!(fast_qmm_mma(), mode);
    }
}

#[test]
fn off_the_cuda_backend_the_tensor_core_form_never_runs() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build: covered by qmm_mma_check on the device.
        return;
    }
    let q = quantized(256, 512, 28);
    let before = fast_qmm_mma_launches();
    // Forced, products of several rows (one sequence's and several) keep MLX's bits here.
    for shape in [[1, 2, 512], [4, 8, 512], [1, 40, 512]] {
        let x = bf16_normal(&shape, 29);
        set_fast_qmm_mma(QmmMma::Force);
        let forced = qmm(&x, &q);
        set_fast_qmm_mma(QmmMma::Off);
        let off = qmm(&x, &q);
        assert!(forced
            .array_equal(&off, false)
            .unwrap()
            .item::<bool>()
            .unwrap());
    }
    set_fast_qmm_mma(QmmMma::On);
    assert_eq!(
        fast_qmm_mma_launches(),
        before,
        "the tensor-core form must not run on the CPU"
    );
}

#[test]
fn off_the_cuda_backend_multi_row_products_stay_mlxs() {
    let _g = serial();
    if Device::default_device().unwrap().kind == DeviceType::Gpu {
        // A GPU build: covered by qmm_rows_check on the device.
        return;
    }
    set_fast_qmv(true);
    let q = quantized(256, 512, 26);
    let before = fast_qmm_launches();
    // 2..32 rows (batch dimensions included) and a bound of 64: the same arrays with the
    // kernel on and off, and it never runs.
    set_fast_qmm_max_rows(64);
    for shape in [[1, 2, 512], [4, 8, 512], [1, 40, 512]] {
        let x = bf16_normal(&shape, 27);
        set_fast_qmm(true);
        let on = qmm(&x, &q);
        set_fast_qmm(false);
        let off = qmm(&x, &q);
        assert_eq!(on.shape(), vec![shape[0], shape[1], 256]);
        assert!(on.array_equal(&off, false).unwrap().item::<bool>().unwrap());
    }
    set_fast_qmm(true);
    set_fast_qmm_max_rows(32);
    assert_eq!(
        fast_qmm_launches(),
        before,
        "the multi-row kernel must not run on the CPU"
    );
}

#[test]
fn quantized_matmul_many_gives_each_products_own_array() {
    let _g = serial();
    set_fast_qmv(true);
    // q/k/v-like: three weights of one K, one of them with fewer rows.
    let qs = [
        quantized(256, 512, 8),
        quantized(64, 512, 9),
        quantized(64, 512, 10),
    ];
    let ws: Vec<_> = qs.iter().map(QuantizedWeight::from).collect();
    for x in [bf16_normal(&[1, 1, 512], 11), bf16_normal(&[2, 3, 512], 12)] {
        let many = quantized_matmul_many(&x, &ws, Some(64), Some(4), QuantMode::Affine).unwrap();
        assert_eq!(many.len(), 3);
        for (y, q) in many.iter().zip(&qs) {
            let one = qmm(&x, q);
            assert_eq!(y.shape(), one.shape());
            assert!(y.array_equal(&one, false).unwrap().item::<bool>().unwrap());
        }
    }
}

#[test]
fn quantized_matmul_many_checks_its_operands() {
    let _g = serial();
    let a = quantized(64, 512, 13);
    let b = quantized(64, 512, 14);
    let x = bf16_normal(&[1, 1, 512], 15);
    // Biases on one weight only.
    let mixed = [
        QuantizedWeight::from(&a),
        QuantizedWeight {
            biases: None,
            ..QuantizedWeight::from(&b)
        },
    ];
    let err = quantized_matmul_many(&x, &mixed, Some(64), Some(4), QuantMode::Affine)
        .unwrap_err()
        .to_string();
    assert!(err.contains("biases"), "{err}");
    // A weight of another K: MLX's own shape error, not a crash.
    let c = quantized(64, 1024, 16);
    let err = quantized_matmul_many(
        &x,
        &[QuantizedWeight::from(&a), QuantizedWeight::from(&c)],
        Some(64),
        Some(4),
        QuantMode::Affine,
    );
    assert!(err.is_err());
    // No weights: no arrays.
    assert!(
        quantized_matmul_many(&x, &[], Some(64), Some(4), QuantMode::Affine)
            .unwrap()
            .is_empty()
    );
}

fn qmm_add(x: &Array, q: &Quantized, r: &Array) -> mlx_array::Result<Array> {
    let y = quantized_matmul_add(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        r,
        Some(64),
        Some(4),
        QuantMode::Affine,
    )?;
    y.eval()?;
    Ok(y)
}

#[test]
fn quantized_matmul_add_is_the_residual_plus_the_product() {
    let _g = serial();
    let q = quantized(128, 512, 17);
    for residual_kernel in [false, true] {
        set_fast_qmv_residual(residual_kernel);
        // One row, several rows, and a residual that broadcasts (MLX's add decides).
        for (x, r) in [
            (bf16_normal(&[1, 1, 512], 18), bf16_normal(&[1, 1, 128], 19)),
            (bf16_normal(&[2, 3, 512], 20), bf16_normal(&[2, 3, 128], 21)),
            (bf16_normal(&[1, 1, 512], 22), bf16_normal(&[128], 23)),
        ] {
            let fused = qmm_add(&x, &q, &r).unwrap();
            let two_ops = r.add(&qmm(&x, &q)).unwrap();
            assert_eq!(fused.shape(), two_ops.shape());
            assert!(fused
                .array_equal(&two_ops, false)
                .unwrap()
                .item::<bool>()
                .unwrap());
        }
        // A residual that cannot be added: MLX's broadcast error, as the two ops give it.
        let err = qmm_add(
            &bf16_normal(&[1, 1, 512], 24),
            &q,
            &bf16_normal(&[1, 1, 7], 25),
        );
        assert!(err.is_err());
    }
    set_fast_qmv_residual(true);
}

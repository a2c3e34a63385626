//! Our few-row CPU matmul (`fast::set_cpu_gemv`, shim/cpu_gemv.cpp) against MLX's own CPU
//! matmul and addmm, bit for bit: float32, bfloat16 and float16; 1 to 300 rows; ragged
//! K and N; the weight as a transposed view (linear layers), contiguous, or strided; a
//! strided input; biases of every broadcast shape; and gradients through it. Also the
//! quantized products, plain and gathered (mixture-of-experts `gather_qmm`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::fast::{cpu_gemv_enabled, cpu_gemv_uses, set_cpu_gemv};
use mlx_array::ops::addmm;
use mlx_array::transforms::value_and_grad;
use mlx_array::{Array, Device, DeviceType, Dtype};
use std::sync::{Mutex, MutexGuard};
mod common;
use common::normal;

/// The switch is process-wide: under `cargo test` (threads) these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> Option<MutexGuard<'static, ()>> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A GPU default device never takes this path; these tests are about the CPU.
    (Device::default_device().unwrap().kind == DeviceType::Cpu).then_some(g)
}

/// Bit patterns, so that -0.0 and NaN compare exactly.
fn bits(a: &Array) -> Vec<u32> {
    let f = a.astype(Dtype::Float32).unwrap();
    f.eval().unwrap();
    f.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// `f()` with our primitive, then with MLX's: (ours, theirs, whether ours was used).
fn both(f: impl Fn() -> Array) -> (Vec<u32>, Vec<u32>, bool) {
    set_cpu_gemv(true);
    let before = cpu_gemv_uses();
    let ours = f();
    let used = cpu_gemv_uses() > before;
    let ours = bits(&ours);
    set_cpu_gemv(false);
    let theirs = bits(&f());
    set_cpu_gemv(true);
    (ours, theirs, used)
}

/// `x @ dequantize(q).T` (affine, transposed weight).
fn qmm(x: &Array, q: &mlx_array::quant::Quantized, gs: i32, bits: i32) -> mlx_array::Result<Array> {
    use mlx_array::quant::{quantized_matmul, QuantMode};
    quantized_matmul(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        true,
        Some(gs),
        Some(bits),
        QuantMode::Affine,
    )
}

const DTYPES: [Dtype; 3] = [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16];

/// Where the primitives stand in for MLX's (Linux x86-64: elsewhere MLX's CPU kernels sum
/// in another order and keep the products; the bits are compared either way).
const TAKES_IT: bool = cfg!(all(target_os = "linux", target_arch = "x86_64"));

#[test]
fn matmul_is_mlx_bit_for_bit() {
    let Some(_g) = serial() else { return };
    let mut seed = 0;
    for dtype in DTYPES {
        for (m, k, n) in [
            (1, 256, 768),
            (1, 7, 5),
            (1, 8, 8),
            (3, 100, 17),
            (16, 64, 64),
            (2, 1, 9),
            (1, 257, 1000),
            (128, 64, 40),
            (300, 33, 9),
            // Large enough to be split between threads: by columns (few rows), by rows.
            (1, 512, 1000),
            (5, 300, 1001),
            (64, 96, 130),
        ] {
            seed += 1;
            let x = normal(&[1, m, k], dtype, seed);
            let w = normal(&[n, k], dtype, seed + 100);
            // A linear layer: x @ W.T, the weight's rows contiguous in k.
            let wt = w.transpose(None).unwrap();
            let (a, b, used) = both(|| x.matmul(&wt).unwrap());
            assert_eq!(used, TAKES_IT, "{dtype:?} {m}x{k}x{n}: not taken");
            assert_eq!(a, b, "{dtype:?} x @ W.T, {m}x{k}x{n}");
            // A weight contiguous in n.
            let kn = normal(&[k, n], dtype, seed + 200);
            let (a, b, _) = both(|| x.matmul(&kn).unwrap());
            assert_eq!(a, b, "{dtype:?} x @ B, {m}x{k}x{n}");
            // Strided weight (every other column of a wider one) and a transposed input.
            let wide = normal(&[k, 2 * n], dtype, seed + 300);
            let strided = wide.slice(&[0, 0], &[k, 2 * n], Some(&[1, 2])).unwrap();
            let xt = normal(&[k, m], dtype, seed + 400).transpose(None).unwrap();
            let (a, b, _) = both(|| xt.matmul(&strided).unwrap());
            assert_eq!(a, b, "{dtype:?} strided, {m}x{k}x{n}");
        }
    }
}

#[test]
fn addmm_is_mlx_bit_for_bit() {
    let Some(_g) = serial() else { return };
    // The second shape is split between threads.
    for ((m, k, n), dtype) in [(3, 96, 40), (6, 256, 520)]
        .into_iter()
        .flat_map(|s| DTYPES.into_iter().map(move |d| (s, d)))
    {
        let x = normal(&[m, k], dtype, 1);
        let wt = normal(&[n, k], dtype, 2).transpose(None).unwrap();
        let kn = normal(&[k, n], dtype, 5);
        let strided = normal(&[k, 2 * n], dtype, 6)
            .slice(&[0, 0], &[k, 2 * n], Some(&[1, 2]))
            .unwrap();
        for (layout, w) in [("W.T", &wt), ("contiguous", &kn), ("strided", &strided)] {
            for bias_shape in [vec![n], vec![1, n], vec![m, n], vec![m, 1]] {
                let c = normal(&bias_shape, dtype, 3);
                let (a, b, used) = both(|| addmm(&c, &x, w, 1.0, 1.0).unwrap());
                assert_eq!(
                    used, TAKES_IT,
                    "{dtype:?} {layout} bias {bias_shape:?}: not taken"
                );
                assert_eq!(a, b, "{dtype:?} addmm {layout}, bias {bias_shape:?}");
            }
        }
        // Other alpha / beta stay with MLX.
        let c = normal(&[n], dtype, 4);
        let (a, b, used) = both(|| addmm(&c, &x, &wt, 0.5, 2.0).unwrap());
        assert!(!used);
        assert_eq!(a, b);
    }
}

#[test]
fn what_it_does_not_cover_stays_with_mlx() {
    let Some(_g) = serial() else { return };
    let k = 32;
    let cases = [
        // A vector (1-D), mixed dtypes, a batched weight.
        (
            normal(&[k], Dtype::Float32, 1),
            normal(&[k, 8], Dtype::Float32, 2),
        ),
        (
            normal(&[1, k], Dtype::Float32, 3),
            normal(&[k, 8], Dtype::Bfloat16, 4),
        ),
        (
            normal(&[2, 1, k], Dtype::Float32, 5),
            normal(&[2, k, 8], Dtype::Float32, 6),
        ),
    ];
    for (x, w) in &cases {
        let (a, b, used) = both(|| x.matmul(w).unwrap());
        assert!(!used, "{:?} @ {:?}", x.shape(), w.shape());
        assert_eq!(a, b);
    }
}

#[test]
fn gradients_through_it_are_mlx_gradients() {
    let Some(_g) = serial() else { return };
    let x = normal(&[2, 24], Dtype::Float32, 7);
    let w = normal(&[24, 10], Dtype::Float32, 8);
    let c = normal(&[10], Dtype::Float32, 9);
    let grads = |on: bool| -> Vec<Vec<u32>> {
        set_cpu_gemv(on);
        let f = |p: &[Array]| -> mlx_array::Result<Vec<Array>> {
            let y = addmm(&p[2], &p[0], &p[1], 1.0, 1.0)?;
            Ok(vec![y.square()?.sum(None, false)?])
        };
        let (_, g) = value_and_grad(f, &[&x, &w, &c], &[0, 1, 2]).unwrap();
        set_cpu_gemv(true);
        g.iter().map(bits).collect()
    };
    assert_eq!(grads(true), grads(false));
}

#[test]
fn batched_and_empty_inputs() {
    let Some(_g) = serial() else { return };
    let w = normal(&[24, 12], Dtype::Bfloat16, 11);
    for shape in [vec![2, 3, 24], vec![0, 24], vec![2, 0, 24]] {
        let x = normal(&shape, Dtype::Bfloat16, 12);
        let (a, b, used) = both(|| x.matmul(&w).unwrap());
        assert_eq!(used, TAKES_IT, "{shape:?}");
        assert_eq!(a, b, "{shape:?}");
        let mut want = shape.clone();
        *want.last_mut().unwrap() = 12;
        assert_eq!(x.matmul(&w).unwrap().shape(), want);
    }
}

#[test]
fn quantized_4_and_8_bit_are_mlx_bit_for_bit() {
    use mlx_array::quant::{quantize, QuantMode};
    let Some(_g) = serial() else { return };
    let mut seed = 50;
    // (activations, weights / scales): bf16 throughout; float32 activations with float32,
    // float16 or bfloat16 scales (a GGUF import keeps float16 ones).
    let types = [
        (Dtype::Bfloat16, Dtype::Bfloat16),
        (Dtype::Float32, Dtype::Float32),
        (Dtype::Float32, Dtype::Float16),
        (Dtype::Float32, Dtype::Bfloat16),
    ];
    for (gs, (xt, wt)) in [32, 64, 128]
        .into_iter()
        .flat_map(|g| types.map(|t| (g, t)))
    {
        // Rows of x go up to sixteen at a time through the vectorized kernel, each
        // dequantized weight shared by them: 17 rows are 16 and 1. The last shape is large
        // enough to be split between the CPU's threads (its last block of weight rows
        // partial).
        let shapes = [
            (1, 256, 64),
            (3, 128, 13),
            (17, 384, 40),
            (1, 128, 8),
            (6, 256, 24),
            (9, 512, 130),
        ];
        for (bits, (m, k, n)) in [4, 8].into_iter().flat_map(|b| shapes.map(|s| (b, s))) {
            seed += 1;
            let w = normal(&[n, k], wt, seed);
            let q = quantize(&w, Some(gs), Some(bits), QuantMode::Affine).unwrap();
            let x = normal(&[1, m, k], xt, seed + 1);
            let mm = || qmm(&x, &q, gs, bits).unwrap();
            let (a, b, used) = both(mm);
            let what = format!("{xt:?}/{wt:?} {bits}-bit g{gs} {m}x{k}x{n}");
            assert_eq!(used, TAKES_IT, "{what}: not taken");
            assert_eq!(a, b, "{what}");
        }
    }
    // Gradients with respect to x go through MLX's transposed product, as for MLX's own.
    let w = normal(&[24, 64], Dtype::Bfloat16, 90);
    let q = quantize(&w, Some(32), Some(4), QuantMode::Affine).unwrap();
    let x = normal(&[2, 64], Dtype::Bfloat16, 91);
    let grads = |on: bool| {
        set_cpu_gemv(on);
        let f = |p: &[Array]| -> mlx_array::Result<Vec<Array>> {
            let y = qmm(&p[0], &q, 32, 4)?;
            Ok(vec![y
                .astype(Dtype::Float32)?
                .square()?
                .sum(None, false)?])
        };
        let (_, g) = value_and_grad(f, &[&x], &[0]).unwrap();
        set_cpu_gemv(true);
        bits(&g[0])
    };
    assert_eq!(grads(true), grads(false));
}

/// `gather_qmm(x, experts, rhs_indices=idx, transpose=True)` (mlx-lm's SwitchLinear).
fn gqmm(
    x: &Array,
    q: &mlx_array::quant::Quantized,
    idx: &Array,
    gs: i32,
    bits: i32,
    sorted: bool,
) -> mlx_array::Result<Array> {
    use mlx_array::quant::{gather_qmm, QuantMode};
    gather_qmm(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        None,
        Some(idx),
        true,
        Some(gs),
        Some(bits),
        QuantMode::Affine,
        sorted,
    )
}

#[test]
fn gathered_quantized_products_are_mlx_bit_for_bit() {
    use mlx_array::quant::{quantize, QuantMode};
    let Some(_g) = serial() else { return };
    let mut seed = 400;
    for (gs, dt) in [32, 64, 128]
        .into_iter()
        .flat_map(|g| [Dtype::Bfloat16, Dtype::Float32].map(|t| (g, t)))
    {
        // (experts, K, N): N a multiple of 8 and not.
        for (bits, (e, k, n)) in [4, 8]
            .into_iter()
            .flat_map(|b| [(6, 256, 40), (4, 128, 13)].map(|s| (b, s)))
        {
            seed += 1;
            let w = normal(&[e, n, k], dt, seed);
            let q = quantize(&w, Some(gs), Some(bits), QuantMode::Affine).unwrap();
            let what = format!("{dt:?} {bits}-bit g{gs} {e}x{n}x{k}");
            // Sorted rows (mlx-lm from 64 indices), repeated experts and one left out.
            let m = 11;
            let x = normal(&[m, 1, k], dt, seed + 1);
            let ids: Vec<u32> = (0..m as u32).map(|i| (i * 7 / 5) % e as u32).collect();
            let mut sorted_ids = ids.clone();
            sorted_ids.sort();
            let idx = Array::from_slice(&sorted_ids, &[m]).unwrap();
            let (a, b, used) = both(|| gqmm(&x, &q, &idx, gs, bits, true).unwrap());
            assert_eq!(used, TAKES_IT, "{what} sorted: not taken");
            assert_eq!(a, b, "{what} sorted");
            // Unsorted: 3 tokens' top 2, one row of x a token ([3, 1, 1, K]).
            let x = normal(&[3, 1, 1, k], dt, seed + 2);
            let idx = Array::from_slice(&ids[..6], &[3, 2]).unwrap();
            let (a, b, used) = both(|| gqmm(&x, &q, &idx, gs, bits, false).unwrap());
            assert_eq!(used, TAKES_IT, "{what} unsorted: not taken");
            assert_eq!(a, b, "{what} unsorted");
        }
    }
    // Derivatives with respect to x are MLX's.
    let q = quantize(
        &normal(&[4, 24, 64], Dtype::Bfloat16, 480),
        Some(32),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    let x = normal(&[2, 1, 1, 64], Dtype::Bfloat16, 481);
    let tx = normal(&[2, 1, 1, 64], Dtype::Bfloat16, 482);
    let idx = Array::from_slice(&[3u32, 1, 0, 3], &[2, 2]).unwrap();
    let run = |on: bool| {
        set_cpu_gemv(on);
        let f = |p: &[Array]| -> mlx_array::Result<Vec<Array>> {
            Ok(vec![gqmm(&p[0], &q, &idx, 32, 4, false)?
                .astype(Dtype::Float32)?
                .square()?
                .sum(None, false)?])
        };
        let g = |p: &[Array]| -> mlx_array::Result<Vec<Array>> {
            Ok(vec![gqmm(&p[0], &q, &idx, 32, 4, false)?])
        };
        let (_, grad) = value_and_grad(f, &[&x], &[0]).unwrap();
        // MLX has no forward derivative of gather_qmm: an error either way.
        let fwd = mlx_array::transforms::jvp(g, &[&x], &[&tx]).map(|(_, t)| bits(&t[0]));
        set_cpu_gemv(true);
        (bits(&grad[0]), fwd.map_err(|e| e.to_string()))
    };
    let (ours, theirs) = (run(true), run(false));
    assert_eq!(ours.0, theirs.0, "gradient");
    assert_eq!(
        ours.1.is_err(),
        theirs.1.is_err(),
        "forward derivative: {:?}",
        ours.1
    );
}

#[test]
fn forward_derivatives_through_it_are_mlx_derivatives() {
    use mlx_array::quant::{quantize, QuantMode};
    use mlx_array::transforms::jvp;
    let Some(_g) = serial() else { return };
    let x = normal(&[2, 32], Dtype::Float32, 21);
    let w = normal(&[32, 16], Dtype::Float32, 22);
    let c = normal(&[16], Dtype::Float32, 23);
    let (tx, tw, tc) = (
        normal(&[2, 32], Dtype::Float32, 24),
        normal(&[32, 16], Dtype::Float32, 25),
        normal(&[16], Dtype::Float32, 26),
    );
    let q = quantize(
        &normal(&[16, 32], Dtype::Float32, 27),
        Some(32),
        Some(4),
        QuantMode::Affine,
    )
    .unwrap();
    let run = |on: bool| -> Vec<Vec<u32>> {
        set_cpu_gemv(on);
        let mm = |p: &[Array]| -> mlx_array::Result<Vec<Array>> { Ok(vec![p[0].matmul(&p[1])?]) };
        let am = |p: &[Array]| -> mlx_array::Result<Vec<Array>> {
            Ok(vec![addmm(&p[2], &p[0], &p[1], 1.0, 1.0)?])
        };
        let qm =
            |p: &[Array]| -> mlx_array::Result<Vec<Array>> { Ok(vec![qmm(&p[0], &q, 32, 4)?]) };
        let out = vec![
            bits(&jvp(mm, &[&x, &w], &[&tx, &tw]).unwrap().1[0]),
            bits(&jvp(am, &[&x, &w, &c], &[&tx, &tw, &tc]).unwrap().1[0]),
            bits(&jvp(qm, &[&x], &[&tx]).unwrap().1[0]),
        ];
        set_cpu_gemv(true);
        out
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn the_switch_reads_back() {
    let Some(_g) = serial() else { return };
    set_cpu_gemv(false);
    assert!(!cpu_gemv_enabled());
    set_cpu_gemv(true);
    assert!(cpu_gemv_enabled());
}

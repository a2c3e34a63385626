//! Checks our tiled 4-bit CUDA kernel for products of 33 or more rows (and its gathered
//! forms from 8)
//! (`mlx_array::quant::set_fast_qgemm`, shim fast_qmm.cpp) on the current device against
//! MLX's own product for those rows (its `qmm_sm80`, or `qmm_naive` where N % 128 != 0),
//! and times the two:
//! - bits: for every product shape, group size and row count M, ours must equal MLX's
//!   product bit for bit, for x as one sequence ([1, M, K]: a prompt's prefill) and as two
//!   ([2, M/2, K], batch dimensions flattened into rows);
//! - the gathered forms (mixture-of-experts products, `gather_qmm` with one expert index a
//!   row as mlx-lm's layers call it: sorted, x [M, 1, K], at `--gather-m` rows (`none` skips
//!   them), and unsorted, x [T, 1, 1, K] for T tokens' top-k experts, as at decoding): the
//!   experts of the Qwen3-30B-A3B (128, top 8) and gpt-oss-20b (32, top 4) shapes, against
//!   MLX's `gather_qmm`, bits at every group size and time at group size 64 (below 8 rows
//!   our one-row body's gathered form must run with the bits of MLX's `gather_qmv`, which
//!   runs there under `MLX_FAST_GATHER_QMV=0`);
//! - time: MLX's product (`set_fast_qgemm(false)`) against ours, the median of `--iters`
//!   timed evaluations (each of `REPS` products, then a synchronisation) after warm-up, in
//!   microseconds per product, and the ratio.
//!
//! The other multi-row kernels of the shim stay off here (`set_fast_qmm(false)`), so each
//! product is either MLX's or the tiled kernel's. Shapes: as `qmm_rows_check`
//! (`--shapes synthetic|small`, `--model DIR`), or `--shapes oss` (gpt-oss-20b's, N not a
//! multiple of 128, where MLX runs its `qmm_naive`); products of more than `--max-elements`
//! outputs (M x N, default 64 Mi) are skipped. Exit status 1 on any mismatch, or where the
//! kernel should have run on a GPU and did not.
//!
//! ```sh
//! cargo build --release -p mlx-engine --examples
//! target/release/examples/qgemm_check [--shapes synthetic|small] [--model DIR]
//!     [--m 8,9,16,33,64,100,128,512,2048] [--gs 32,64,128] [--iters 20]
//! ```
#[path = "common/qmm.rs"]
mod common;

use common::{qmm, same_bits, scaled_normal, time_us, Case, Res, ShapeOpts, REPS};
use mlx_array::quant::{
    fast_gather_qgemm_launches, fast_qgemm_launches, fast_qmv_launches, gather_qmm, quantize,
    set_fast_qgemm, set_fast_qmm, set_fast_qmv, QuantMode, Quantized,
};
use mlx_array::{transforms, Array, Device, DeviceType};
use std::io::Write;

/// The fewest rows the tiled kernel takes: `MLX_FAST_QGEMM_MIN_ROWS`, 33 unless set, at
/// least 8 (fast_qmm.cpp's min_rows).
fn min_rows() -> i32 {
    std::env::var("MLX_FAST_QGEMM_MIN_ROWS")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(33)
        .max(8)
}

/// Whether the kernel covers weights of N x K at this group size (fast_qmm.cpp's
/// takes_shape: N % 128 == 0, or any multiple of 8 unless `MLX_FAST_QGEMM_NMASK=0`).
fn takes_shape(n: i32, k: i32, gs: i32) -> bool {
    let nmask = std::env::var("MLX_FAST_QGEMM_NMASK").map_or(true, |v| v != "0");
    n % 8 == 0 && (n % 128 == 0 || nmask) && k % gs.max(64) == 0
}

/// Whether the tiled kernel takes this case at M rows (fast_qmm.cpp's takes_rows).
fn takes(c: &Case, m: i32) -> bool {
    m >= min_rows() && takes_shape(c.n, c.k, c.gs) && c.gs < c.k
}

/// gpt-oss-20b's dense 4-bit products (`--shapes oss`): q/k/v fused, o, one expert's
/// projection as a plain product, the head.
const OSS: [(i32, i32); 4] = [(5120, 2880), (2880, 4096), (2880, 2880), (201088, 2880)];

/// The product of `x` with the tiled kernel on or off, evaluated, and whether it ran.
fn product(x: &Array, c: &Case, ours: bool) -> Res<(Array, bool)> {
    set_fast_qgemm(ours);
    let before = fast_qgemm_launches();
    let y = qmm(x, &c.q, c.gs)?;
    transforms::eval(&[&y])?;
    Ok((y, fast_qgemm_launches() > before))
}

/// `gather_qmm(x, w [E, N, K], rhs_indices=idx, sorted)` as mlx-lm's mixture-of-experts
/// layers call it, with the tiled kernel on or off, evaluated, and whether the kernel's
/// gathered form ran.
fn gathered(
    x: &Array,
    q: &Quantized,
    idx: &Array,
    gs: i32,
    sorted: bool,
    ours: bool,
) -> Res<(Array, bool)> {
    set_fast_qgemm(ours);
    // Below 8 rows, the one-row body's gathered form (unless MLX_FAST_GATHER_QMV=0).
    set_fast_qmv(ours);
    let before = fast_gather_qgemm_launches();
    let before_rows = fast_qmv_launches();
    let y = gather_qmm(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        None,
        Some(idx),
        true,
        Some(gs),
        Some(4),
        QuantMode::Affine,
        sorted,
    )?;
    transforms::eval(&[&y])?;
    Ok((
        y,
        fast_gather_qgemm_launches() > before || fast_qmv_launches() > before_rows,
    ))
}

/// Uniform random integers in [0, hi) of `shape`, from `seed`.
fn randint(hi: i32, shape: &[i32], seed: u64) -> Res<Array> {
    Ok(mlx_array::random::randint(
        &Array::scalar(0i32)?,
        &Array::scalar(hi)?,
        shape,
        mlx_array::Dtype::Int32,
        Some(&mlx_array::random::key(seed)?),
    )?)
}

/// The gathered forms: the experts of the Qwen3-30B-A3B shape (128, top 8: the fused
/// gate / up 1536 x 2048, down 2048 x 768) and of gpt-oss-20b (32, top 4: 2880 x 2880),
/// sorted random indices at `ms` rows and unsorted top-k indices of 1, 4 and 8 tokens,
/// against MLX's `gather_qmm`: bits, and time at group size 64. Returns whether all matched.
fn check_gathered(ms: &[i32], gss: &[i32], iters: usize, gpu: bool) -> Res<bool> {
    let mut ok = true;
    let gather_qmv = std::env::var("MLX_FAST_GATHER_QMV").as_deref() != Ok("0");
    let shapes = [
        (128, 8, 1536, 2048),
        (128, 8, 2048, 768),
        (32, 4, 2880, 2880),
    ];
    for (i, &(experts, topk, n, k)) in shapes.iter().enumerate() {
        let w = scaled_normal(&[experts, n, k], 300 + i as u64, 0.05)?;
        for &gs in gss {
            if k % gs != 0 {
                continue;
            }
            let q = quantize(&w, Some(gs), Some(4), QuantMode::Affine)?;
            transforms::eval(&[&q.weight, &q.scales])?;
            // (label, x, idx, sorted): sorted rows, then unsorted tokens.
            let mut inputs = Vec::new();
            for &m in ms {
                let x = scaled_normal(&[m, 1, k], (m as u64) * 11 + gs as u64, 1.0)?;
                let idx = randint(experts, &[m], m as u64 + 5)?
                    .sort(Some(0))?
                    .astype(mlx_array::Dtype::Uint32)?;
                inputs.push((format!("sorted M {m:>5}"), x, idx, true));
            }
            for t in [1, 4, 8] {
                let x = scaled_normal(&[t, 1, 1, k], (t as u64) * 13 + gs as u64, 1.0)?;
                // Each token's top-k distinct experts: the first k of a random order.
                let order = mlx_array::random::uniform(
                    &Array::scalar(0f32)?,
                    &Array::scalar(1f32)?,
                    &[t, experts],
                    mlx_array::Dtype::Float32,
                    Some(&mlx_array::random::key(t as u64 + 17)?),
                )?
                .argsort(Some(-1))?;
                let idx = order
                    .slice(&[0, 0], &[t, topk], None)?
                    .astype(mlx_array::Dtype::Uint32)?;
                inputs.push((format!("tokens {t} x top {topk}"), x, idx, false));
            }
            for (label, x, idx, sorted) in &inputs {
                transforms::eval(&[x, idx])?;
                let m = idx.size() as i32;
                let (mlx, _) = gathered(x, &q, idx, gs, *sorted, false)?;
                let (ours, ran) = gathered(x, &q, idx, gs, *sorted, true)?;
                // The tiled kernel from 8 rows; below, the one-row body's gathered form (its
                // bits), or MLX's gather_qmv under MLX_FAST_GATHER_QMV=0.
                let expect = gpu && ((m >= 8 && takes_shape(n, k, gs)) || (m < 8 && gather_qmv));
                let same = same_bits(&ours, &mlx)?;
                if !same || ran != expect {
                    ok = false;
                    println!(
                        "  MISMATCH gathered {experts} x {n} x {k} group {gs} {label}: {}{}",
                        if same {
                            ""
                        } else {
                            "differs from MLX's gather_qmm; "
                        },
                        if ran == expect {
                            ""
                        } else {
                            "the kernel ran where it should not, or not where it should"
                        }
                    );
                }
                if iters > 0 && ran && gs == 64 {
                    let theirs =
                        time_us(iters, &|| Ok(gathered(x, &q, idx, gs, *sorted, false)?.0))?;
                    let t = time_us(iters, &|| Ok(gathered(x, &q, idx, gs, *sorted, true)?.0))?;
                    let flops = 2.0 * (m as f64) * (n as f64) * (k as f64);
                    println!(
                        "gathered {experts:>3} x {n:>5} x {k:>5} gs {gs:>3} {label}: mlx {theirs:>9.1} us, \
                         ours {t:>9.1} us, {:.2}x, {:.1} TFLOP/s",
                        theirs / t,
                        flops / t / 1e6
                    );
                }
            }
        }
    }
    Ok(ok)
}

fn main() -> Res<()> {
    let mut o = ShapeOpts::new(vec![8, 9, 16, 33, 64, 100, 128, 512, 2048], 20);
    let mut max_elements: i64 = 64 << 20;
    // Batched decoding's rows (32 tokens' top 8: 256) and a prompt's, around the chunks'
    // threshold of 32 rows an expert (4,096 for 128 experts, 1,024 for 32).
    let mut gather_ms: Vec<i32> = vec![8, 32, 256, 1024, 4096];
    o.parse(
        "usage: qgemm_check [--shapes synthetic|small|none] [--model DIR] [--m 8,16,...] \
         [--gs 32,64,128] [--iters 20] [--max-elements N] [--gather-m 8,32,256,1024,4096|none]",
        |flag, val| match flag {
            "--max-elements" => {
                max_elements = val()?.parse()?;
                Ok(true)
            }
            "--gather-m" => {
                let v = val()?;
                gather_ms = if v == "none" {
                    Vec::new()
                } else {
                    common::list(&v)?
                };
                Ok(true)
            }
            _ => Ok(false),
        },
    )?;
    set_fast_qmm(false);
    let gpu = Device::default_device()?.kind == DeviceType::Gpu;
    println!(
        "device: {}; rows M: {:?}; timing: {}",
        if gpu { "gpu" } else { "cpu" },
        o.ms,
        if o.iters > 0 {
            format!("median of {} x {REPS} products", o.iters)
        } else {
            "off".into()
        }
    );
    let cases = if o.shapes == "none" && o.model.is_none() {
        Vec::new()
    } else if o.shapes == "oss" && o.model.is_none() {
        common::synthetic(&OSS, &o.gss)?
    } else {
        common::cases(o.model.as_deref(), &o.shapes, &o.gss)?
    };
    let mut all_ok = true;
    let mut table = Vec::new();
    for c in &cases {
        for &m in &o.ms {
            if (m as i64) * (c.n as i64) > max_elements {
                continue;
            }
            let x = scaled_normal(&[1, m, c.k], (m as u64) * 7 + c.gs as u64, 1.0)?;
            transforms::eval(&[&x])?;
            let (mlx, _) = product(&x, c, false)?;
            let (ours, ran) = product(&x, c, true)?;
            let expect = gpu && takes(c, m);
            let mut problems = Vec::new();
            if ran != expect {
                problems.push(if ran {
                    "the kernel ran where MLX's product should".to_string()
                } else {
                    "the kernel did not run".to_string()
                });
            }
            if !same_bits(&ours, &mlx)? {
                problems.push("[1, M, K] differs from MLX's product".into());
            }
            if m % 2 == 0 {
                let x2 = x.reshape(&[2, m / 2, c.k])?;
                let (y2, _) = product(&x2, c, true)?;
                if !same_bits(&y2.reshape(&[1, m, c.n])?, &mlx)? {
                    problems.push("[2, M/2, K] differs from MLX's product".into());
                }
            }
            if !problems.is_empty() {
                all_ok = false;
                println!(
                    "  MISMATCH {} N={} K={} group {} M={m}: {}",
                    c.name,
                    c.n,
                    c.k,
                    c.gs,
                    problems.join("; ")
                );
            }
            if o.iters > 0 && ran {
                let f = || qmm(&x, &c.q, c.gs);
                set_fast_qgemm(false);
                let theirs = time_us(o.iters, &f)?;
                set_fast_qgemm(true);
                let t = time_us(o.iters, &f)?;
                table.push((c.name.clone(), c.n, c.k, c.gs, m, theirs, t));
            }
        }
        println!("{} N={} K={} group {}: done", c.name, c.n, c.k, c.gs);
        std::io::stdout().flush()?;
    }
    if !table.is_empty() {
        println!();
        println!(
            "{:<32} {:>7} {:>6} {:>3} {:>5} {:>10} {:>10} {:>8} {:>8}",
            "weight", "N", "K", "gs", "M", "mlx us", "ours us", "speedup", "TFLOP/s"
        );
        for (name, n, k, gs, m, theirs, ours) in &table {
            let flops = 2.0 * (*m as f64) * (*n as f64) * (*k as f64);
            println!(
                "{name:<32} {n:>7} {k:>6} {gs:>3} {m:>5} {theirs:>10.1} {ours:>10.1} {:>7.2}x {:>8.1}",
                theirs / ours,
                flops / ours / 1e6
            );
        }
    }
    if !gather_ms.is_empty() {
        println!();
        all_ok &= check_gathered(&gather_ms, &o.gss, o.iters, gpu)?;
    }
    if all_ok {
        println!("RESULT: PASS (every product bit-identical to MLX's)");
        Ok(())
    } else {
        println!("RESULT: FAIL (see MISMATCH above)");
        std::process::exit(1);
    }
}

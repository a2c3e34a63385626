//! Checks the tensor-core form of our multi-row 4-bit CUDA product
//! (`mlx_array::quant::set_fast_qmm_mma`, shim fast_qmv.cpp's `rows_mma`) on the current
//! device, and times it against the exact multi-row kernel and MLX's own product.
//!
//! That form rounds differently from MLX (float32 sums in another order), so it is
//! checked for accuracy, not bits: for every product shape, group size and row count M,
//! x as batched decoding gives it (`[M, 1, K]`, rows of M sequences):
//! - error: each product's relative RMS error and largest error against a float32
//!   reference computed on the CPU (`x @ dequantize(w).T` in float32). The tensor-core
//!   form must be no less accurate than the paths that run without it: at most the larger
//!   RMS error of the exact multi-row kernel (each row's one-row bits, `QmmMma::Off`) and
//!   of MLX's own M-row product (`set_fast_qmm(false)`), times `TOLERANCE`;
//! - determinism and layout: a second run, x as `[2, M/2, K]` and a transposed,
//!   non-contiguous view give the same bits;
//! - dispatch: the product ran the tensor-core kernel (its launch count grew); one
//!   sequence's rows (`[1, M, K]`, a prompt at batch 1) do not, unless forced
//!   (`QmmMma::Force`, which must then take them and more rows than 32).
//!
//! Time: the median of `--iters` timed evaluations (each of `REPS` products, then a
//! synchronisation), microseconds per product, for MLX's M-row product, the exact kernel,
//! the tensor-core form and one one-row product; at the `--forced-m` row counts (over the
//! exact kernel's 32) MLX's against the forced tensor-core form, to see where
//! `MLX_FAST_QMM_MMA_MAX_ROWS` could be raised.
//!
//! The weight's dequantization (`MLX_DEQUANT_GEMM`'s first half): our kernel
//! (`mlx_array::quant::set_fast_dequant`) must give MLX's `dequantize` bit for bit, and
//! its time is printed against MLX's for each weight.
//!
//! Exit status 1 on any failed check. On a device without the CUDA kernels (the CPU) the
//! check reports that the kernel never ran and fails.
//!
//! ```sh
//! cargo build --release -p mlx-engine --examples
//! target/release/examples/qmm_mma_check [--shapes synthetic|small] [--model DIR]
//!     [--m 2,4,8,16,32] [--forced-m 48,100] [--gs 32,64,128] [--iters 30]
//! ```
#[path = "common/qmm.rs"]
mod common;

use common::{qmm, same_bits, scaled_normal, time_us, Case, Res, ShapeOpts, REPS};
use mlx_array::quant::{
    dequantize, fast_dequant_launches, fast_qmm_mma_launches, set_fast_dequant, set_fast_qmm,
    set_fast_qmm_mma, QmmMma, QuantMode,
};
use mlx_array::{transforms, with_stream, Array, Device, DeviceType, Dtype};
use std::cmp::Ordering;
use std::io::Write;
use std::time::Instant;

/// How much larger than the worse of the other two paths' RMS error the tensor-core
/// form's may be (room for noise on products where all three are at bfloat16 rounding).
const TOLERANCE: f64 = 1.05;

struct Opts {
    s: ShapeOpts,
    forced_ms: Vec<i32>,
}

fn parse_args() -> Res<Opts> {
    let mut s = ShapeOpts::new(vec![2, 4, 8, 16, 32], 30);
    let mut forced_ms = vec![48, 100];
    s.parse(
        "usage: qmm_mma_check [--shapes synthetic|small] [--model DIR] [--m 2,4,...] \
         [--forced-m 48,100] [--gs 32,64,128] [--iters 30]",
        |flag, val| {
            if flag != "--forced-m" {
                return Ok(false);
            }
            forced_ms = common::list(&val()?)?;
            Ok(true)
        },
    )?;
    if s.ms.iter().chain(&forced_ms).any(|&m| m < 2) {
        return Err("--m / --forced-m: row counts must be at least 2".into());
    }
    Ok(Opts { s, forced_ms })
}

/// `x @ dequantize(q).T` in float32 on the CPU, [M, N].
fn reference(x: &Array, c: &Case) -> Res<Array> {
    with_stream(Device::cpu(), || -> Res<Array> {
        let w = dequantize(
            &c.q.weight,
            &c.q.scales,
            c.q.biases.as_ref(),
            Some(c.gs),
            Some(4),
            QuantMode::Affine,
            Some(Dtype::Float32),
        )?;
        let y = x.astype(Dtype::Float32)?.matmul(&w.transpose(None)?)?;
        transforms::eval(&[&y])?;
        Ok(y)
    })
}

/// (relative RMS error, largest absolute error / largest |reference|) of `y` against `r`.
fn errors(y: &Array, r: &Array) -> Res<(f64, f64)> {
    let d = y.astype(Dtype::Float32)?.subtract(r)?;
    let rms = |a: &Array| -> Res<f64> {
        Ok(a.square()?.mean(None, false)?.sqrt()?.item::<f32>()? as f64)
    };
    let max = |a: &Array| -> Res<f64> { Ok(a.abs()?.max(None, false)?.item::<f32>()? as f64) };
    let (rr, rm) = (rms(r)?, max(r)?);
    Ok((
        rms(&d)? / rr.max(f64::MIN_POSITIVE),
        max(&d)? / rm.max(f64::MIN_POSITIVE),
    ))
}

/// The product of `x` under `mode`, [M, N], evaluated, and whether the tensor-core kernel
/// ran for it.
fn product(x: &Array, c: &Case, mode: QmmMma, m: i32) -> Res<(Array, bool)> {
    set_fast_qmm_mma(mode);
    let before = fast_qmm_mma_launches();
    let y = qmm(x, &c.q, c.gs)?.reshape(&[m, c.n])?;
    transforms::eval(&[&y])?;
    set_fast_qmm_mma(QmmMma::On);
    Ok((y, fast_qmm_mma_launches() > before))
}

/// One row count of one case: the failures found (printed as they are found) and the
/// RMS errors (tensor-core form, exact kernel, MLX's).
fn check(c: &Case, m: i32, forced: bool) -> Res<(usize, [f64; 3])> {
    let k = c.k;
    let x = scaled_normal(&[m, k], 1000 + m as u64, 1.0)?;
    transforms::eval(&[&x])?;
    let r = reference(&x, c)?;
    let mut failures = 0;
    let mut fail = |what: String| {
        failures += 1;
        println!(
            "  FAIL {} N={} K={} group {} M={m}: {what}",
            c.name, c.n, c.k, c.gs
        );
    };
    let xb = x.reshape(&[m, 1, k])?;
    let mode = if forced { QmmMma::Force } else { QmmMma::On };
    let (y, ran) = product(&xb, c, mode, m)?;
    if !ran {
        fail("the tensor-core kernel did not run".into());
    }
    let (y2, _) = product(&xb, c, mode, m)?;
    if !same_bits(&y, &y2)? {
        fail("a second run gave other bits".into());
    }
    if m % 2 == 0 {
        let (y3, _) = product(&x.reshape(&[2, m / 2, k])?, c, mode, m)?;
        if !same_bits(&y, &y3)? {
            fail("x as [2, M/2, K] gave other bits than [M, 1, K]".into());
        }
    }
    let (yt, _) = product(&common::transposed_view(&xb)?, c, mode, m)?;
    if !same_bits(&y, &yt)? {
        fail("a transposed view of x gave other bits".into());
    }
    // One sequence's rows: MLX's bits unless forced.
    let (_, ran_one) = product(&x.reshape(&[1, m, k])?, c, mode, m)?;
    if ran_one != forced {
        fail(format!(
            "one sequence's rows ([1, M, K]) {} the tensor-core kernel",
            if ran_one { "ran" } else { "did not run" }
        ));
    }
    let (exact, _) = product(&xb, c, QmmMma::Off, m)?;
    set_fast_qmm(false);
    let mlx = qmm(&xb, &c.q, c.gs)?.reshape(&[m, c.n])?;
    transforms::eval(&[&mlx])?;
    set_fast_qmm(true);
    let (e_mma, max_mma) = errors(&y, &r)?;
    let (e_exact, _) = errors(&exact, &r)?;
    let (e_mlx, _) = errors(&mlx, &r)?;
    let bound = e_exact.max(e_mlx) * TOLERANCE;
    // NaN counts as a failure too.
    if !matches!(
        e_mma.partial_cmp(&bound),
        Some(Ordering::Less | Ordering::Equal)
    ) {
        fail(format!(
            "RMS error {e_mma:.3e} over {bound:.3e} (exact kernel {e_exact:.3e}, MLX {e_mlx:.3e})"
        ));
    }
    println!(
        "  M={m:>3}{}: relative RMS error mma {e_mma:.3e} (max {max_mma:.2e}), exact kernel \
         {e_exact:.3e}, MLX {e_mlx:.3e}",
        if forced { " (forced)" } else { "" }
    );
    Ok((failures, [e_mma, e_exact, e_mlx]))
}

/// One timed product shape: microseconds per product of MLX's M-row product, of the exact
/// kernel (up to 32 rows), of the tensor-core form, of the dequantized dense product
/// (`MLX_DEQUANT_GEMM`: our `dequantize` then MLX's matmul), of the dense matmul alone (the
/// weight dequantized beforehand: what a bfloat16 model's product costs) and of one row.
struct Timing<'a> {
    case: &'a Case,
    m: i32,
    theirs: f64,
    exact: Option<f64>,
    mma: f64,
    dequant: f64,
    dense: f64,
    one: f64,
}

/// The weight of `c` dequantized to bfloat16 and transposed (a view), as the dense
/// product multiplies it.
fn dequantized_t(c: &Case) -> Res<Array> {
    let q = &c.q;
    let w = dequantize(
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        Some(c.gs),
        Some(4),
        QuantMode::Affine,
        Some(Dtype::Bfloat16),
    )?;
    Ok(w.transpose(None)?)
}

/// Our dequantization of `c`'s weight against MLX's: the same bits, and our kernel ran.
/// Returns the failures and, when timing, the microseconds of MLX's and ours.
fn check_dequant(c: &Case, iters: usize) -> Res<(usize, Option<(f64, f64)>)> {
    let before = fast_dequant_launches();
    let ours = dequantized_t(c)?;
    let ran = fast_dequant_launches() > before;
    set_fast_dequant(false);
    let theirs = dequantized_t(c);
    set_fast_dequant(true);
    let theirs = theirs?;
    transforms::eval(&[&ours, &theirs])?;
    let same = same_bits(&ours, &theirs)?;
    println!(
        "  dequantize: our kernel {}, {} MLX's",
        if ran { "ran" } else { "did NOT run" },
        if same {
            "bit-identical to"
        } else {
            "DIFFERS from"
        }
    );
    let failures = usize::from(!ran) + usize::from(!same);
    if iters == 0 {
        return Ok((failures, None));
    }
    set_fast_dequant(false);
    let mlx = time_us(iters, &|| dequantized_t(c));
    set_fast_dequant(true);
    let mine = time_us(iters, &|| dequantized_t(c))?;
    Ok((failures, Some((mlx?, mine))))
}

fn main() -> Res<()> {
    let o = parse_args()?;
    let gpu = Device::default_device()?.kind == DeviceType::Gpu;
    println!(
        "device: {}; rows M: {:?} (forced: {:?}); timing: {}",
        if gpu { "gpu" } else { "cpu" },
        o.s.ms,
        o.forced_ms,
        if o.s.iters > 0 {
            format!("median of {} x {REPS} products", o.s.iters)
        } else {
            "off".into()
        }
    );
    let cases = common::cases(o.s.model.as_deref(), &o.s.shapes, &o.s.gss)?;
    let mut failures = 0;
    let mut table: Vec<Timing> = Vec::new();
    for c in cases.iter().filter(|c| c.ours) {
        let tic = Instant::now();
        println!("{} N={} K={} group {}", c.name, c.n, c.k, c.gs);
        let (f, dq) = check_dequant(c, o.s.iters)?;
        failures += f;
        if let Some((mlx, mine)) = dq {
            println!(
                "  dequantize alone: MLX {mlx:.1} us, ours {mine:.1} us ({:.2}x)",
                mlx / mine
            );
        }
        for &m in &o.s.ms {
            failures += check(c, m, false)?.0;
        }
        for &m in &o.forced_ms {
            failures += check(c, m, true)?.0;
        }
        if o.s.iters > 0 {
            let x1 = scaled_normal(&[1, c.k], 9, 1.0)?;
            transforms::eval(&[&x1])?;
            let one = time_us(o.s.iters, &|| qmm(&x1, &c.q, c.gs))?;
            // The forced row counts too: where the tensor-core form would beat MLX's `qmm`
            // above 32 rows (MLX_FAST_QMM_MMA_MAX_ROWS); the exact kernel stops at 32.
            let timed = o.s.ms.iter().map(|&m| (m, false));
            for (m, forced) in timed.chain(o.forced_ms.iter().map(|&m| (m, true))) {
                let x = scaled_normal(&[m, 1, c.k], 9, 1.0)?;
                transforms::eval(&[&x])?;
                let f = || qmm(&x, &c.q, c.gs);
                set_fast_qmm(false);
                let theirs = time_us(o.s.iters, &f)?;
                set_fast_qmm(true);
                let exact = if forced {
                    None
                } else {
                    set_fast_qmm_mma(QmmMma::Off);
                    Some(time_us(o.s.iters, &f)?)
                };
                set_fast_qmm_mma(if forced { QmmMma::Force } else { QmmMma::On });
                let mma = time_us(o.s.iters, &f)?;
                set_fast_qmm_mma(QmmMma::On);
                let dequant = time_us(o.s.iters, &|| Ok(x.matmul(&dequantized_t(c)?)?))?;
                let wt = dequantized_t(c)?;
                transforms::eval(&[&wt])?;
                let dense = time_us(o.s.iters, &|| Ok(x.matmul(&wt)?))?;
                table.push(Timing {
                    case: c,
                    m,
                    theirs,
                    exact,
                    mma,
                    dequant,
                    dense,
                    one,
                });
            }
        }
        println!("  ({:.1} s)", tic.elapsed().as_secs_f64());
        std::io::stdout().flush()?;
    }
    if cases.iter().all(|c| !c.ours) {
        println!("no product shape here is one the kernel takes");
        failures += 1;
    }
    if !table.is_empty() {
        println!();
        println!(
            "{:<32} {:>7} {:>6} {:>3} {:>4} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "weight",
            "N",
            "K",
            "gs",
            "M",
            "mlx",
            "exact",
            "mma",
            "vs mlx",
            "vs exact",
            "dequant",
            "dense",
            "1-row"
        );
        for t in &table {
            let (exact, vs_exact) = match t.exact {
                Some(e) => (format!("{e:.1}"), format!("{:.2}x", e / t.mma)),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<32} {:>7} {:>6} {:>3} {:>4} {:>9.1} {exact:>9} {:>9.1} {:>7.2}x \
                 {vs_exact:>8} {:>9.1} {:>9.1} {:>9.1}",
                t.case.name,
                t.case.n,
                t.case.k,
                t.case.gs,
                t.m,
                t.theirs,
                t.mma,
                t.theirs / t.mma,
                t.dequant,
                t.dense,
                t.one,
            );
        }
        println!(
            "(microseconds per product, median; \"exact\": our multi-row kernel with each \
             row's one-row bits; \"mma\": the tensor-core form; \"vs\": speedup of mma; \
             \"dequant\": our dequantize then MLX's matmul; \"dense\": the matmul of a \
             weight dequantized beforehand)"
        );
    }
    println!();
    if failures == 0 {
        println!("RESULT: PASS (tensor-core products at least as accurate, deterministic)");
        Ok(())
    } else {
        println!("RESULT: FAIL ({failures} failed checks above)");
        std::process::exit(1);
    }
}

//! Checks our multi-row 4-bit CUDA kernel (`mlx_array::quant::set_fast_qmm`, shim
//! fast_qmv.cpp's kBodyM) on the current device, and times it against MLX's own product of
//! many rows:
//! - bits: for every product shape, group size and row count M, every row of the M-row
//!   product must equal, bit for bit, the one-row product of that row of x alone, both as
//!   our one-row kernel gives it and as MLX's `qmv` gives it (`set_fast_qmv(false)`); x is
//!   given as batched decoding gives it ([M, 1, K]: rows of M sequences), also as
//!   [2, M/2, K] (batch dimensions flattened into rows) and as a transposed,
//!   non-contiguous view, which must give the same bits again; one sequence's rows
//!   ([1, M, K], a prompt at batch 1, a draft model's catch-up) must keep MLX's own M-row
//!   product (mlx-lm's batch-1 bits) and not run ours; for information it also prints the row
//!   counts at which MLX's own M-row product had the one-row bits;
//! - time: MLX's M-row product (`set_fast_qmm(false)`) against ours, and one one-row
//!   product, the median of `--iters` timed evaluations (each of `REPS` products, then a
//!   synchronisation) after warm-up, in microseconds per product.
//!
//! Ours is checked and timed for each `--warp-rows` layout (rows of w a warp,
//! `set_fast_qmm_warp_rows`; default 1,2,4: the same bits, other speeds; the kernel's
//! default, timed as `ours`, picks 2 where the grid stays large, else 1); each new
//! (shape, group size, rows of x a part, layout) compiles one kernel with NVRTC on first
//! use (MLX keeps them on disk, so a second run starts fast).
//!
//! Shapes: `--shapes synthetic` (default) takes the (N, K) of the benchmark models'
//! projections and heads with random weights at group sizes 32, 64 and 128; `--model DIR`
//! takes every distinct 4-bit product shape of a quantized model directory (its own
//! weights and group size); `--shapes small` the three smallest synthetic shapes only.
//! On a device without the CUDA kernels (the CPU) the bits are still checked (then of
//! MLX's own kernels) and the report says that the kernel was not used.
//!
//! Exit status 1 on any mismatch (or where the CUDA kernel should have run and did not).
//!
//! ```sh
//! cargo build --release -p mlx-engine --examples
//! target/release/examples/qmm_rows_check [--shapes synthetic|small] [--model DIR]
//!     [--m 2,3,4,5,8,9,16,32] [--gs 32,64,128] [--warp-rows 1,2,4] [--iters 50]
//! ```
#[path = "common/qmm.rs"]
mod common;

use common::{qmm, same_bits, scaled_normal, time_us, Case, Res, ShapeOpts, REPS};
use mlx_array::quant::{
    fast_qmm_launches, set_fast_qmm, set_fast_qmm_mma, set_fast_qmm_warp_rows, set_fast_qmv, QmmMma,
};
use mlx_array::{transforms, Array, Device, DeviceType};
use std::io::Write;
use std::time::Instant;

struct Opts {
    s: ShapeOpts,
    warp_rows: Vec<i32>,
}

fn parse_args() -> Res<Opts> {
    let mut s = ShapeOpts::new(vec![2, 3, 4, 5, 8, 9, 16, 32], 50);
    let mut warp_rows = vec![1, 2, 4];
    s.parse(
        "usage: qmm_rows_check [--shapes synthetic|small] [--model DIR] [--m 2,3,...] \
         [--gs 32,64,128] [--warp-rows 1,2,4] [--iters 50]",
        |flag, val| {
            if flag != "--warp-rows" {
                return Ok(false);
            }
            warp_rows = common::list(&val()?)?;
            Ok(true)
        },
    )?;
    if s.ms.iter().any(|&m| m < 1) {
        return Err("--m: row counts must be at least 1".into());
    }
    if warp_rows.is_empty() || warp_rows.iter().any(|r| ![1, 2, 4].contains(r)) {
        return Err("--warp-rows: each of 1, 2 or 4".into());
    }
    Ok(Opts { s, warp_rows })
}

/// The rows of [M, N] `y` that differ in any bit from those of `r`.
fn differing_rows(y: &Array, r: &Array) -> Res<Vec<i32>> {
    let (m, n) = (y.dim(0)?, y.dim(1)?);
    let mut bad = Vec::new();
    for i in 0..m {
        let yi = y.slice(&[i, 0], &[i + 1, n], None)?;
        let ri = r.slice(&[i, 0], &[i + 1, n], None)?;
        if !same_bits(&yi, &ri)? {
            bad.push(i);
        }
    }
    Ok(bad)
}

/// The bit checks of one case at M rows with each layout of ours (`warp_rows`): whether
/// all held, whether our kernel ran for every layout, and (for information, not checked)
/// whether MLX's own M-row product (`set_fast_qmm(false)`) has the one-row bits too.
fn check_bits(c: &Case, m: i32, seed: u64, warp_rows: &[i32]) -> Res<(bool, bool, bool)> {
    let k = c.k;
    let x = scaled_normal(&[m, k], seed, 1.0 + (seed % 4) as f32)?;
    transforms::eval(&[&x])?;
    // The references: each row alone, through MLX's qmv and through our one-row kernel.
    let rows = |fast: bool| -> Res<Array> {
        set_fast_qmv(fast);
        let ys = (0..m)
            .map(|i| qmm(&x.slice(&[i, 0], &[i + 1, k], None)?, &c.q, c.gs))
            .collect::<Res<Vec<_>>>()?;
        let y = mlx_array::concatenate(&ys.iter().collect::<Vec<_>>(), 0)?;
        transforms::eval(&[&y])?;
        Ok(y)
    };
    let mlx_rows = rows(false)?;
    let our_rows = rows(true)?;
    set_fast_qmv(true);
    set_fast_qmm(false);
    let mlx_m = qmm(&x, &c.q, c.gs)?;
    transforms::eval(&[&mlx_m])?;
    let mlx_same = same_bits(&mlx_m, &mlx_rows)?;
    set_fast_qmm(true);
    // Ours takes rows of several sequences: x as batched decoding gives it, [M, 1, K].
    let xb = x.reshape(&[m, 1, k])?;
    // A non-contiguous x of that shape.
    let xt = common::transposed_view(&xb)?;
    let mut ok = true;
    let mut used = true;
    // One sequence's rows, [1, M, K] (a prompt at batch 1, a speculative catch-up): the
    // product must stay MLX's (mlx-lm's batch-1 bits), not ours.
    {
        let before = fast_qmm_launches();
        let y1 = qmm(&x.reshape(&[1, m, k])?, &c.q, c.gs)?.reshape(&[m, c.n])?;
        transforms::eval(&[&y1])?;
        if fast_qmm_launches() > before || !same_bits(&y1, &mlx_m)? {
            ok = false;
            println!(
                "  MISMATCH {} N={} K={} group {} M={m}: one sequence's rows ([1, M, K]) \
                 did not keep MLX's own M-row product",
                c.name, c.n, c.k, c.gs
            );
        }
    }
    for &rw in warp_rows {
        set_fast_qmm_warp_rows(rw as u32);
        let before = fast_qmm_launches();
        let y = qmm(&xb, &c.q, c.gs)?.reshape(&[m, c.n])?;
        transforms::eval(&[&y])?;
        used &= fast_qmm_launches() > before;
        let mut report = |what: &str, bad: Vec<i32>| {
            if !bad.is_empty() {
                ok = false;
                println!(
                    "  MISMATCH {} N={} K={} group {} M={m} warp rows {rw}: {what}: \
                     rows {bad:?} differ",
                    c.name, c.n, c.k, c.gs
                );
            }
        };
        report("against MLX's one-row qmv", differing_rows(&y, &mlx_rows)?);
        report("against our one-row kernel", differing_rows(&y, &our_rows)?);
        // Batch dimensions flattened into rows.
        if m % 2 == 0 {
            let y3 = qmm(&x.reshape(&[2, m / 2, k])?, &c.q, c.gs)?;
            let same = same_bits(&y3.reshape(&[m, c.n])?, &y)?;
            report(
                "x as [2, M/2, K] against x as [M, K]",
                if same { vec![] } else { vec![-1] },
            );
        }
        let same = same_bits(&qmm(&xt, &c.q, c.gs)?.reshape(&[m, c.n])?, &y)?;
        report(
            "a transposed view of x against x",
            if same { vec![] } else { vec![-1] },
        );
    }
    set_fast_qmm_warp_rows(0);
    Ok((ok, used, mlx_same))
}

fn main() -> Res<()> {
    let o = parse_args()?;
    // The one-row bits are what this checks: the tensor-core form (another rounding,
    // `qmm_mma_check`) stays off.
    set_fast_qmm_mma(QmmMma::Off);
    let gpu = Device::default_device()?.kind == DeviceType::Gpu;
    println!(
        "device: {}; rows M: {:?}; warp rows: {:?}; timing: {}",
        if gpu { "gpu" } else { "cpu" },
        o.s.ms,
        o.warp_rows,
        if o.s.iters > 0 {
            format!("median of {} x {REPS} products", o.s.iters)
        } else {
            "off".into()
        }
    );
    let cases = common::cases(o.s.model.as_deref(), &o.s.shapes, &o.s.gss)?;
    let mut all_ok = true;
    let mut never_used = true;
    // Timings: (case, M, MLX's M-row product, ours per layout, one one-row product), in
    // microseconds.
    let mut table: Vec<(&Case, i32, f64, Vec<f64>, f64)> = Vec::new();
    for c in &cases {
        let tic = Instant::now();
        let one_row = if o.s.iters > 0 {
            let x = scaled_normal(&[1, c.k], 9, 1.0)?;
            transforms::eval(&[&x])?;
            time_us(o.s.iters, &|| qmm(&x, &c.q, c.gs))?
        } else {
            0.0
        };
        let mut ok_all_m = true;
        let mut used_all_m = true;
        // The row counts where MLX's own product already had the one-row bits.
        let mut mlx_invariant = Vec::new();
        for &m in &o.s.ms {
            let (ok, used, mlx_same) =
                check_bits(c, m, (m as u64) * 7 + c.gs as u64, &o.warp_rows)?;
            if mlx_same {
                mlx_invariant.push(m);
            }
            ok_all_m &= ok;
            used_all_m &= used || m < 2 || !c.ours;
            never_used &= !used;
            if o.s.iters > 0 {
                let x = scaled_normal(&[m, 1, c.k], 9, 1.0)?;
                transforms::eval(&[&x])?;
                let f = || qmm(&x, &c.q, c.gs);
                set_fast_qmm(false);
                let theirs = time_us(o.s.iters, &f)?;
                set_fast_qmm(true);
                set_fast_qmm_warp_rows(0);
                let mut ours = vec![time_us(o.s.iters, &f)?];
                for &rw in &o.warp_rows {
                    set_fast_qmm_warp_rows(rw as u32);
                    ours.push(time_us(o.s.iters, &f)?);
                }
                set_fast_qmm_warp_rows(0);
                table.push((c, m, theirs, ours, one_row));
            }
        }
        all_ok &= ok_all_m;
        // On the GPU every shape here is one the kernel takes: not running it is a failure.
        if gpu && !used_all_m {
            all_ok = false;
        }
        println!(
            "{} N={} K={} group {}: {}{}; MLX's own M-row product the same for M in {:?} ({:.1} s)",
            c.name,
            c.n,
            c.k,
            c.gs,
            if ok_all_m { "rows identical" } else { "DIFFER" },
            if !c.ours {
                " (a product our kernel does not take: MLX's bits checked)"
            } else if used_all_m || !gpu {
                ""
            } else {
                ", our kernel NOT used for some M"
            },
            mlx_invariant,
            tic.elapsed().as_secs_f64()
        );
        std::io::stdout().flush()?;
    }
    if never_used {
        println!(
            "note: the multi-row CUDA kernel never ran (no CUDA device): the bits checked \
             above are MLX's own kernels'"
        );
    }
    if !table.is_empty() {
        println!();
        let heads: String = std::iter::once(format!(" {:>9}", "ours"))
            .chain(
                o.warp_rows
                    .iter()
                    .map(|rw| format!(" {:>9}", format!("ours x{rw}"))),
            )
            .collect();
        println!(
            "{:<32} {:>7} {:>6} {:>3} {:>3} {:>9}{heads} {:>8} {:>9}",
            "weight", "N", "K", "gs", "M", "mlx qmm", "speedup", "1-row"
        );
        for (c, m, theirs, ours, one_row) in &table {
            let cols: String = ours.iter().map(|t| format!(" {t:>9.1}")).collect();
            println!(
                "{:<32} {:>7} {:>6} {:>3} {m:>3} {theirs:>9.1}{cols} {:>7.2}x {one_row:>9.1}",
                c.name,
                c.n,
                c.k,
                c.gs,
                theirs / ours[0],
            );
        }
        println!(
            "(microseconds per product, median; \"ours\": the default layout, \"ours xR\": R \
             rows of w a warp; \"speedup\": mlx qmm over ours; \"1-row\": one row of x, for \
             scale; products of a few microseconds measure the host's cost of a launch)"
        );
    }
    println!();
    if all_ok {
        println!("RESULT: PASS (every row bit-identical to its one-row product)");
        Ok(())
    } else {
        println!("RESULT: FAIL (see MISMATCH / NOT used above)");
        std::process::exit(1);
    }
}

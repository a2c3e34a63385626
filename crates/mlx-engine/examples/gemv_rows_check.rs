//! The rows form of our dense kernel (`MLX_FAST_GEMV_ROWS`, `mlx_array::fast::set_gemv_rows`:
//! products of 2..8 rows of x, each row with the one-row kernel's bits, the weight read
//! once) on the current CUDA device:
//!
//! 1. Shapes: every product shape of `common::SYNTHETIC` in bfloat16 at 2, 3, 4 and 8 rows, the
//!    plain product, the residual add and the fused gate/up swiglu, against each row alone
//!    through the one-row path (MLX's `gemv`, our one-row add / swiglu of the same bits);
//!    with the `batch` mode, rows of several sequences (x `[m, 1, K]`) taken and one
//!    sequence's rows (x `[1, m, K]`) left to MLX. Times: the product of 4 rows, ours
//!    against MLX's gemm.
//! 2. Model (MODEL_DIR, bfloat16): a speculative verification against decoding. After the
//!    same random prompt, 4 tokens fed one step at a time against the same 4 tokens fed as
//!    one forward of 4 rows, with the rows form on and off (run with
//!    `MLX_SDPA_SPLIT_QUERIES=1` so that each query's attention is a decoding step's);
//!    logits compared exactly, the forwards timed; then batch 4 decoding steps timed with
//!    the rows form's `batch` mode and without. `GEMV_ROWS_CHECK_M` (default `2,3,4,8`):
//!    the row counts of the sweep; `GEMV_ROWS_CHECK_SHAPES=0` leaves it out.
//!
//! ```sh
//! MLX_SDPA_SPLIT_QUERIES=1 cargo run --release -p mlx-engine --example gemv_rows_check -- [MODEL_DIR] [PROMPT] [ITERS]
//! ```
//! Exits 1 when a row differs from its one-row product or a shape is not taken where it
//! should be. Needs a CUDA device (on the CPU it says so and exits 0).
#[path = "common/qmm.rs"]
mod common;

use common::{scaled_normal, time_us, Res};
use mlx_array::fast::{gemv_launches, matmul_add, matmul_swiglu, set_gemv_rows, GemvRows};
use mlx_array::{ops, random, transforms, Array, Device, DeviceType, Dtype};
use mlx_models::{load_model_with, LanguageModel, LoadOptions};
use std::time::Instant;

fn same(a: &Array, b: &Array) -> Res<bool> {
    Ok(a.array_equal(b, false)?.item::<bool>()?)
}

fn max_diff(a: &Array, b: &Array) -> Res<f32> {
    Ok(a.astype(Dtype::Float32)?
        .subtract(&b.astype(Dtype::Float32)?)?
        .abs()?
        .max(None, false)?
        .item::<f32>()?)
}

/// Row `i` of x `[.., m, K]` or `[m, 1, K]` as its own one-row array of the same rank.
fn row(x: &Array, i: i32, batch: bool) -> Res<Array> {
    let k = x.dim(-1)?;
    Ok(if batch {
        x.slice(&[i, 0, 0], &[i + 1, 1, k], None)?
    } else {
        x.slice(&[0, i, 0], &[1, i + 1, k], None)?
    })
}

fn join(rows: &[Array], batch: bool) -> Res<Array> {
    let refs: Vec<&Array> = rows.iter().collect();
    Ok(ops::concatenate(&refs, if batch { 0 } else { 1 })?)
}

/// The three forms at `m` rows against the one-row path row by row; whether all were
/// identical and how many launches were ours.
fn check_shape(w: &Array, n: i32, k: i32, m: i32, batch: bool) -> Res<(bool, u64)> {
    let shape = if batch { [m, 1, k] } else { [1, m, k] };
    let out = if batch { [m, 1, n] } else { [1, m, n] };
    let x = scaled_normal(&shape, 100 + m as u64, 1.0)?;
    let res = scaled_normal(&out, 200 + m as u64, 1.0)?;
    let wt = w.transpose(None)?;
    transforms::eval(&[&x, &res, &wt])?;
    set_gemv_rows(if batch {
        GemvRows::Batch
    } else {
        GemvRows::All
    });
    let before = gemv_launches();
    let plain = x.matmul(&wt)?;
    let add = matmul_add(&x, &wt, &res)?;
    let sw = matmul_swiglu(&x, &wt)?;
    transforms::eval(&[&plain, &add])?;
    let taken = gemv_launches() - before;
    set_gemv_rows(GemvRows::Off);
    let (mut p1, mut a1, mut s1) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..m {
        let xi = row(&x, i, batch)?;
        let ri = row(&res, i, batch)?;
        p1.push(xi.matmul(&wt)?);
        a1.push(matmul_add(&xi, &wt, &ri)?);
        if let Some(s) = matmul_swiglu(&xi, &wt)? {
            s1.push(s);
        }
    }
    let mut ok = same(&plain, &join(&p1, batch)?)? && same(&add, &join(&a1, batch)?)?;
    if let Some(sw) = sw {
        ok &= s1.len() == m as usize && same(&sw, &join(&s1, batch)?)?;
    }
    Ok((ok, taken))
}

fn shapes(iters: usize) -> Res<bool> {
    // GEMV_ROWS_CHECK_M: the row counts checked (default 2,3,4,8).
    let ms: Vec<i32> = std::env::var("GEMV_ROWS_CHECK_M")
        .unwrap_or_else(|_| "2,3,4,8".into())
        .split(',')
        .map(|m| m.trim().parse())
        .collect::<Result<_, _>>()?;
    let mut all = true;
    println!(
        "| K | N | rows identical ({ms:?}) | launches | us 4 rows ours | us 4 rows MLX | us 1 row MLX |"
    );
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: |");
    for (n, k) in common::SYNTHETIC {
        let w = scaled_normal(&[n, k], 70, 0.05)?;
        transforms::eval(&[&w])?;
        let (mut ok, mut taken) = (true, 0);
        for &m in &ms {
            let (o, t) = check_shape(&w, n, k, m, false)?;
            ok &= o;
            taken += t;
        }
        // The batch mode: several sequences' rows taken, one sequence's left to MLX.
        let (o, t) = check_shape(&w, n, k, 4, true)?;
        ok &= o;
        taken += t;
        set_gemv_rows(GemvRows::Batch);
        let before = gemv_launches();
        let x = scaled_normal(&[1, 4, k], 7, 1.0)?;
        let _ = x.matmul(&w.transpose(None)?)?;
        let leaked = gemv_launches() - before;
        set_gemv_rows(GemvRows::Off);
        // At least the plain product and the add for each of the 8 checks when the weight
        // is above the size floor (MLX_FAST_GEMV_MIN_ELEMENTS).
        let floor = (n as i64) * (k as i64) < (1 << 22);
        // Below the floor MLX's gemm runs the rows, whose bits differ from its gemv's.
        let taken_ok = if floor {
            taken == 0
        } else {
            taken >= 2 * (ms.len() as u64 + 1)
        };
        all &= (ok || floor) && taken_ok && leaked == 0;
        let x4 = scaled_normal(&[1, 4, k], 9, 1.0)?;
        let wt = w.transpose(None)?;
        transforms::eval(&[&x4, &wt])?;
        set_gemv_rows(GemvRows::All);
        let ours = time_us(iters, &|| Ok(x4.matmul(&wt)?))?;
        set_gemv_rows(GemvRows::Off);
        let theirs = time_us(iters, &|| Ok(x4.matmul(&wt)?))?;
        let x1 = x4.slice(&[0, 0, 0], &[1, 1, k], None)?;
        let one = time_us(iters, &|| Ok(x1.matmul(&wt)?))?;
        println!(
            "| {k} | {n} | {} | {taken}{}{} | {ours:.1} | {theirs:.1} | {one:.1} |",
            if ok {
                "yes"
            } else if floor {
                "no (MLX's gemm)"
            } else {
                "DIFFER"
            },
            if floor { " (below the size floor)" } else { "" },
            if leaked > 0 {
                " BATCH MODE TOOK ONE SEQUENCE"
            } else {
                ""
            }
        );
    }
    Ok(all)
}

fn last_logits(logits: &Array) -> Res<Array> {
    let (b, l, v) = (logits.dim(0)?, logits.dim(1)?, logits.dim(2)?);
    Ok(logits.slice(&[0, l - 1, 0], &[b, l, v], None)?)
}

/// Verification (4 tokens in one forward) against decoding (one at a time).
fn verification(model: &dyn LanguageModel, prompt: i32, iters: usize) -> Res<bool> {
    let v = model.vocab_size();
    let toks = |shape: &[i32], seed: u64| -> Res<Array> {
        Ok(random::randint(
            &Array::scalar(0i32)?,
            &Array::scalar(v)?,
            shape,
            Dtype::Int32,
            Some(&random::key(seed)?),
        )?)
    };
    let p = toks(&[1, prompt], 5)?;
    let next = toks(&[1, 4], 6)?;
    transforms::eval(&[&p, &next])?;
    let specs = model.cache_specs();
    let mut ok = true;
    // Decoding: one step a token.
    set_gemv_rows(GemvRows::Off);
    let mut caches = mlx_cache::make_prompt_cache(&specs, None)?;
    transforms::eval(&[&model.forward(&p, &mut caches)?])?;
    let mut steps = Vec::new();
    for i in 0..4 {
        let t = next.slice(&[0, i], &[1, i + 1], None)?;
        let l = model.forward(&t, &mut caches)?;
        transforms::eval(&[&l])?;
        steps.push(l);
    }
    let decoded = ops::concatenate(&steps.iter().collect::<Vec<_>>(), 1)?;
    let step_ms = {
        mlx_cache::trim_prompt_cache(&mut caches, 1);
        let t = next.slice(&[0, 3], &[1, 4], None)?;
        let tic = Instant::now();
        for _ in 0..iters {
            transforms::eval(&[&model.forward(&t, &mut caches)?])?;
            mlx_cache::trim_prompt_cache(&mut caches, 1);
        }
        tic.elapsed().as_secs_f64() * 1e3 / iters as f64
    };
    for (label, mode) in [("MLX's gemm", GemvRows::Off), ("rows form", GemvRows::All)] {
        set_gemv_rows(mode);
        let mut caches = mlx_cache::make_prompt_cache(&specs, None)?;
        transforms::eval(&[&model.forward(&p, &mut caches)?])?;
        let verified = model.forward(&next, &mut caches)?;
        transforms::eval(&[&verified])?;
        let identical = same(&verified, &decoded)?;
        let agree = verified
            .argmax(Some(-1), false)?
            .array_equal(&decoded.argmax(Some(-1), false)?, false)?
            .item::<bool>()?;
        let tic = Instant::now();
        for _ in 0..iters {
            mlx_cache::trim_prompt_cache(&mut caches, 4);
            transforms::eval(&[&model.forward(&next, &mut caches)?])?;
        }
        let ms = tic.elapsed().as_secs_f64() * 1e3 / iters as f64;
        if mode == GemvRows::All {
            ok &= identical;
        }
        println!(
            "verification of 4 tokens, {label}: logits {} to decoding's (max abs diff {:e}, argmax {}); {ms:.3} ms a forward, a decoding step {step_ms:.3} ms",
            if identical { "identical" } else { "DIFFER" },
            max_diff(&verified, &decoded)?,
            if agree { "the same" } else { "differs" },
        );
    }
    set_gemv_rows(GemvRows::Off);
    Ok(ok)
}

/// Batch 4 decoding steps timed with MLX's gemm and with the rows form's `batch` mode
/// (their bits are checked by the shapes; a batch's prefill is a product of another
/// number of rows than a row's alone, so whole runs are not compared).
fn batch_rows(model: &dyn LanguageModel, prompt: i32, steps: usize) -> Res<()> {
    let v = model.vocab_size();
    let p = random::randint(
        &Array::scalar(0i32)?,
        &Array::scalar(v)?,
        &[4, prompt],
        Dtype::Int32,
        Some(&random::key(8)?),
    )?;
    transforms::eval(&[&p])?;
    let specs = model.cache_specs();
    let mut times = Vec::new();
    for mode in [GemvRows::Off, GemvRows::Batch] {
        set_gemv_rows(mode);
        let mut caches = mlx_cache::make_prompt_cache(&specs, None)?;
        let mut last = last_logits(&model.forward(&p, &mut caches)?)?;
        let mut t = 0.0;
        for i in 0..steps {
            let next = last.argmax(Some(-1), false)?.astype(Dtype::Int32)?;
            transforms::eval(&[&last, &next])?;
            let tic = Instant::now();
            last = last_logits(&model.forward(&next, &mut caches)?)?;
            transforms::eval(&[&last])?;
            if i > 0 {
                t += tic.elapsed().as_secs_f64();
            }
        }
        times.push(t / (steps.max(2) - 1) as f64);
    }
    set_gemv_rows(GemvRows::Off);
    println!(
        "batch 4 decoding step: MLX's gemm {:.3} ms, rows form {:.3} ms ({:.2}x)",
        times[0] * 1e3,
        times[1] * 1e3,
        times[0] / times[1]
    );
    Ok(())
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next();
    let prompt: i32 = args.next().map_or(Ok(64), |s| s.parse())?;
    let iters: usize = args.next().map_or(Ok(10), |s| s.parse())?;
    if Device::default_device()?.kind != DeviceType::Gpu {
        println!("gemv_rows_check: needs a CUDA device (the kernel is CUDA's); nothing checked");
        return Ok(());
    }
    let mut ok = true;
    if std::env::var("GEMV_ROWS_CHECK_SHAPES").as_deref() != Ok("0") {
        ok &= shapes(iters)?;
    }
    if let Some(dir) = dir {
        let model = load_model_with(&dir, &LoadOptions::default())?.0;
        ok &= verification(model.as_ref(), prompt, iters)?;
        batch_rows(model.as_ref(), prompt, 16)?;
    }
    println!(
        "gemv_rows_check: {}",
        if ok { "identical" } else { "DIFFER" }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

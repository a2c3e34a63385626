//! Checks on the current device that a decoding speed-up gives the same logits bit for
//! bit, and times it:
//! - `fused` (default): fused projections (`mlx_nn::FusedLinears`, the loader's default)
//!   against separate ones (the model loaded twice, `unfused` and fused);
//! - `qmv`: our one-row 4-bit kernels (`mlx_array::quant::set_fast_qmv`) against MLX's
//!   `qmv`: first every product shape of the supported models (three group sizes, three
//!   inputs each), then their q/k/v and gate/up groups as one launch
//!   (`quantized_matmul_many`; groups over a size bound set by
//!   `MLX_FAST_QMV_MANY_MAX_ELEMENTS` print "not one launch"), then the residual add in
//!   our kernel (`quantized_matmul_add`), then gate/up with their swiglu in one launch
//!   (`quantized_matmul_swiglu`), then the model with the kernels off and on (the "on" arm
//!   adds the residuals and the swiglu in the kernels too, unless `MLX_FAST_QMV_RESIDUAL=0`
//!   / `MLX_FAST_QMV_SWIGLU=0`); `FUSED_CHECK_SHAPES=0` leaves out the shape sweeps (one
//!   NVRTC compile per shape), `FUSED_CHECK_SHAPES=swiglu` runs the swiglu sweep alone.
//! - `norm`: MLX's rms_norm of a one-row 4-bit product's input computed in our launch
//!   (`mlx_array::quant::set_fast_qmv_norm`) against MLX's rms_norm kernel: first rows of
//!   every MLX rms_norm block shape through a group, a swiglu and a single product, then
//!   the model with it off and on (`FUSED_CHECK_SHAPES=0` leaves out the sweep).
//! - `gemv`: our one-row dense CUDA kernel (`mlx_array::fast::set_gemv`: a product with
//!   its residual add, a fused gate/up product with its swiglu) against MLX's `gemv` and
//!   the op after it: first every projection shape of those models in bfloat16 (x
//!   aligned and at offsets of one and two elements, which take MLX's 1- and 2-element
//!   layouts; the weight's transposed view pending and evaluated), then the model with
//!   the kernel off and on (`FUSED_CHECK_SHAPES=0` leaves out the sweep).
//!
//! Each arm prefills the same random prompts, then decodes greedily at batch 1 and batch 4,
//! comparing every step's logits exactly; then the decode steps of both are timed.
//!
//! ```sh
//! cargo run --release -p mlx-engine --example fused_check -- MODEL_DIR [PROMPT] [STEPS] [fused|qmv|norm|gemv]
//! ```
#[path = "common/qmm.rs"]
mod common;

use common::{scaled_normal, Res};
use mlx_array::{random, transforms, Array, Dtype};
use mlx_models::{load_model_with, LanguageModel, LoadOptions};
use std::time::Instant;

/// Greedy decoding of `batch` random prompts: the logits of every step, and the mean
/// seconds per decode step.
fn run(model: &dyn LanguageModel, batch: i32, prompt: i32, steps: usize) -> Res<(Vec<Array>, f64)> {
    let key = random::key(5)?;
    let tokens = random::randint(
        &Array::scalar(0i32)?,
        &Array::scalar(model.vocab_size())?,
        &[batch, prompt],
        Dtype::Int32,
        Some(&key),
    )?;
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None)?;
    let mut logits = model.forward(&tokens, &mut caches)?;
    let mut out = Vec::new();
    let mut t = 0.0;
    for i in 0..=steps {
        let last = logits.slice(
            &[0, logits.dim(1)? - 1, 0],
            &[batch, logits.dim(1)?, logits.dim(2)?],
            None,
        )?;
        let next = last.argmax(Some(-1), false)?.astype(Dtype::Int32)?;
        transforms::eval(&[&last, &next])?;
        out.push(last);
        if i == steps {
            break;
        }
        let tic = Instant::now();
        logits = model.forward(&next, &mut caches)?;
        transforms::eval(&[&logits])?;
        if i > 0 {
            t += tic.elapsed().as_secs_f64();
        }
    }
    Ok((out, t / (steps.max(2) - 1) as f64))
}

/// `x @ dequantize(q).T` for 4-bit affine `q` of group size `gs`, evaluated.
fn qmm4(x: &Array, q: &mlx_array::quant::Quantized, gs: i32) -> Res<Array> {
    let y = common::qmm(x, q, gs)?;
    transforms::eval(&[&y])?;
    Ok(y)
}

/// Our one-row dense kernel against MLX's `gemv` and the op after it, on the product
/// shapes of [`common::SYNTHETIC`] in bfloat16 (the shapes below its size floor are left
/// to MLX and reported so): `matmul_add` against MLX's `add` of the residual and the
/// product, `matmul_swiglu` against the product split in two halves and mlx-lm's compiled
/// swiglu. x aligned and at offsets of one and two elements (MLX's layouts of 4, 1 and 2
/// elements a lane), W.T pending (a weight's first step) and evaluated (its cached
/// transpose later). Whether all were identical.
fn gemv_shapes() -> Res<bool> {
    use mlx_array::fast::{gemv_launches, matmul_add, matmul_swiglu, set_gemv};
    let mut all = true;
    for (n, k) in common::SYNTHETIC {
        let w = scaled_normal(&[n, k], 70, 0.05)?;
        transforms::eval(&[&w])?;
        let (mut same_add, mut same_swiglu, mut taken) = (true, true, 0);
        for offset in [0, 1, 2] {
            let wide = scaled_normal(&[1, 1, k + 2], 80 + offset as u64, 1.0)?;
            let x = wide.slice(&[0, 0, offset], &[1, 1, offset + k], None)?;
            let res = scaled_normal(&[1, 1, n], 90 + offset as u64, 1.0)?;
            for evaluated in [false, true] {
                let wt = w.transpose(None)?;
                if evaluated {
                    transforms::eval(&[&wt])?;
                }
                set_gemv(true);
                let before = gemv_launches();
                let y = matmul_add(&x, &wt, &res)?;
                let sw = matmul_swiglu(&x, &wt)?;
                taken += gemv_launches() - before;
                set_gemv(false);
                let r = matmul_add(&x, &wt, &res)?;
                same_add &= y.array_equal(&r, false)?.item::<bool>()?;
                if let Some(sw) = sw {
                    let p = x.matmul(&wt)?;
                    let g = p.slice(&[0, 0, 0], &[1, 1, n / 2], None)?;
                    let u = p.slice(&[0, 0, n / 2], &[1, 1, n], None)?;
                    let theirs = mlx_nn::activations::swiglu(&g, &u)?;
                    same_swiglu &= sw.array_equal(&theirs, false)?.item::<bool>()?;
                }
            }
        }
        set_gemv(true);
        all &= same_add && same_swiglu;
        let word = |same: bool| if same { "identical" } else { "DIFFER" };
        println!(
            "gemv K={k} N={n}: add {}, swiglu {}{}",
            word(same_add),
            word(same_swiglu),
            match taken {
                12 => String::new(),
                0 => " (below the size floor: MLX's kernels)".into(),
                t => format!(" (only {t} of 12 launches ours)"),
            }
        );
    }
    Ok(all)
}

/// Our one-row 4-bit kernels against MLX's on the product shapes (projections and heads)
/// of Qwen2.5-0.5B, Llama-3.2-1B and Llama-3.1-8B ([K, N]); returns whether all were
/// identical.
fn qmv_shapes() -> Res<bool> {
    use mlx_array::quant::{fast_qmv_launches, quantize, set_fast_qmv, QuantMode};
    let shapes = [
        (896, 896),
        (896, 128),
        (896, 4864),
        (4864, 896),
        (896, 151936),
        (2048, 512),
        (2048, 2048),
        (2048, 128256),
        (4096, 1024),
        (4096, 128256),
        (2048, 3072),
        (2048, 8192),
        (8192, 2048),
        (4096, 4096),
        (4096, 6144),
        (4096, 14336),
        (14336, 4096),
        (4096, 28672),
    ];
    let mut all = true;
    for (k, n) in shapes {
        for gs in [32, 64, 128] {
            if k % gs != 0 {
                continue;
            }
            let w = scaled_normal(&[n, k], 7, 0.05)?;
            let q = quantize(&w, Some(gs), Some(4), QuantMode::Affine)?;
            let mut same = true;
            let mut used = false;
            for t in 0..3 {
                let x = scaled_normal(&[1, k], t, 1.0 + 3.0 * t as f32)?;
                let mm = |on: bool| -> Res<Array> {
                    set_fast_qmv(on);
                    qmm4(&x, &q, gs)
                };
                let before = fast_qmv_launches();
                let ours = mm(true)?;
                used |= fast_qmv_launches() > before;
                let theirs = mm(false)?;
                same &= ours.array_equal(&theirs, false)?.item::<bool>()?;
            }
            set_fast_qmv(true);
            all &= same;
            println!(
                "qmv K={k} N={n} group {gs}: {}{}",
                if same { "identical" } else { "DIFFER" },
                if used { "" } else { " (our kernel not used)" }
            );
        }
    }
    all &= qmv_large_scale_shapes()?;
    all &= qmv_many_shapes()?;
    all &= qmv_residual_shapes()?;
    all &= qmv_swiglu_shapes()?;
    Ok(all)
}

/// Weights whose scales reach 2^-2 and more in every third row (those rows' values ~60x
/// the rest, as outlier channels of real checkpoints): our kernels must equal MLX's `qmv`
/// there too (session 50's subnormal form, since removed, had to take another path for
/// such scales). One-row, window and two-rows-a-warp layouts (the 8B's q, down and head
/// shapes, and the 0.5B's up projection).
fn qmv_large_scale_shapes() -> Res<bool> {
    use mlx_array::quant::{quantize, set_fast_qmv, QuantMode};
    let mut all = true;
    for (k, n) in [(4096, 4096), (14336, 4096), (4096, 128256), (896, 4864)] {
        for gs in [32, 64, 128] {
            if k % gs != 0 {
                continue;
            }
            let factor: Vec<f32> = (0..n)
                .map(|r| if r % 3 == 1 { 60.0 } else { 1.0 })
                .collect();
            let w = scaled_normal(&[n, k], 11, 0.05)?
                .multiply(&Array::from_slice(&factor, &[n, 1])?.astype(Dtype::Bfloat16)?)?;
            let q = quantize(&w, Some(gs), Some(4), QuantMode::Affine)?;
            let mut same = true;
            for t in 0..2 {
                let x = scaled_normal(&[1, k], 50 + t, 1.0 + 3.0 * t as f32)?;
                set_fast_qmv(true);
                let ours = qmm4(&x, &q, gs)?;
                set_fast_qmv(false);
                let theirs = qmm4(&x, &q, gs)?;
                same &= ours.array_equal(&theirs, false)?.item::<bool>()?;
            }
            set_fast_qmv(true);
            all &= same;
            println!(
                "qmv large scales K={k} N={n} group {gs}: {}",
                if same { "identical" } else { "DIFFER" }
            );
        }
    }
    Ok(all)
}

/// `quantized_matmul_add` with the residual added in our kernel (`set_fast_qmv_residual`)
/// against MLX's `qmv` and `add`, on every kernel layout (one row a warp, the window
/// layout of long rows, two rows a warp of heads).
fn qmv_residual_shapes() -> Res<bool> {
    use mlx_array::quant::{
        fast_qmv_launches, quantize, quantized_matmul_add, set_fast_qmv, set_fast_qmv_residual,
        QuantMode,
    };
    let shapes = [
        (896, 896),
        (4864, 896),
        (2048, 2048),
        (8192, 2048),
        (4096, 4096),
        (14336, 4096),
        (2048, 128256),
    ];
    let mut all = true;
    for (k, n) in shapes {
        for gs in [32, 64, 128] {
            let w = scaled_normal(&[n, k], 30, 0.05)?;
            let q = quantize(&w, Some(gs), Some(4), QuantMode::Affine)?;
            let mut same = true;
            let mut used = true;
            for t in 0..3 {
                let x = scaled_normal(&[1, 1, k], t, 1.0 + 3.0 * t as f32)?;
                let r = scaled_normal(&[1, 1, n], 40 + t, 4.0)?;
                let mm = |on: bool| -> Res<Array> {
                    set_fast_qmv(on);
                    set_fast_qmv_residual(on);
                    let y = quantized_matmul_add(
                        &x,
                        &q.weight,
                        &q.scales,
                        q.biases.as_ref(),
                        &r,
                        Some(gs),
                        Some(4),
                        QuantMode::Affine,
                    )?;
                    transforms::eval(&[&y])?;
                    Ok(y)
                };
                let before = fast_qmv_launches();
                let ours = mm(true)?;
                used &= fast_qmv_launches() == before + 1;
                let theirs = mm(false)?;
                same &= ours.array_equal(&theirs, false)?.item::<bool>()?;
            }
            all &= same;
            println!(
                "qmv + residual K={k} N={n} group {gs}: {}{}",
                if same { "identical" } else { "DIFFER" },
                if used { "" } else { " (our kernel not used)" }
            );
        }
    }
    set_fast_qmv(true);
    set_fast_qmv_residual(std::env::var("MLX_FAST_QMV_RESIDUAL").as_deref() != Ok("0"));
    Ok(all)
}

/// `quantized_matmul_swiglu` (gate/up products and their swiglu in one launch) against
/// MLX's `qmv` twice and the compiled `swiglu`, on the models' gate/up shapes
/// (pairs over a size bound set by `MLX_FAST_QMV_MANY_MAX_ELEMENTS`: "not taken", nothing
/// compared). Gates of three scales reach both sides of the sigmoid's branch and its
/// saturation.
fn qmv_swiglu_shapes() -> Res<bool> {
    use mlx_array::quant::{quantize, quantized_matmul_swiglu, set_fast_qmv, GateUp, QuantMode};
    let mut all = true;
    for (k, n) in [(896, 4864), (2048, 8192), (4096, 14336)] {
        for gs in [32, 64, 128] {
            let q4 = |seed| -> Res<_> {
                let w = scaled_normal(&[n, k], seed, 0.05)?;
                Ok(quantize(&w, Some(gs), Some(4), QuantMode::Affine)?)
            };
            let (qg, qu) = (q4(50)?, q4(51)?);
            let mut same = true;
            let mut taken = true;
            for t in 0..3 {
                let x = scaled_normal(&[1, 1, k], 60 + t, 0.3 + 3.0 * t as f32)?;
                set_fast_qmv(true);
                let ours = quantized_matmul_swiglu(
                    &x,
                    (&qg).into(),
                    (&qu).into(),
                    Some(gs),
                    Some(4),
                    QuantMode::Affine,
                )?;
                set_fast_qmv(false);
                let theirs = mlx_nn::activations::swiglu(&qmm4(&x, &qg, gs)?, &qmm4(&x, &qu, gs)?)?;
                match ours {
                    GateUp::Swiglu(y) => same &= y.array_equal(&theirs, false)?.item::<bool>()?,
                    GateUp::Products(..) => taken = false,
                }
            }
            set_fast_qmv(true);
            all &= same;
            println!(
                "qmv swiglu K={k} N={n} group {gs}: {}",
                match (taken, same) {
                    (false, _) => "not taken",
                    (true, true) => "identical",
                    (true, false) => "DIFFER",
                }
            );
        }
    }
    Ok(all)
}

/// `quantized_matmul_many` (one launch for the q/k/v or gate/up weights of one input)
/// against MLX's `qmv` one weight at a time, on those models' groups of projections.
fn qmv_many_shapes() -> Res<bool> {
    use mlx_array::quant::{
        fast_qmv_launches, quantize, quantized_matmul_many, set_fast_qmv, QuantMode,
        QuantizedWeight,
    };
    let groups: [(i32, &[i32]); 6] = [
        (896, &[896, 128, 128]),
        (896, &[4864, 4864]),
        (2048, &[2048, 512, 512]),
        (2048, &[8192, 8192]),
        (4096, &[4096, 1024, 1024]),
        (4096, &[14336, 14336]),
    ];
    let mut all = true;
    for (k, ns) in groups {
        for gs in [32, 64, 128] {
            let mut qs = Vec::new();
            for (i, &n) in ns.iter().enumerate() {
                let w = scaled_normal(&[n, k], 20 + i as u64, 0.05)?;
                qs.push(quantize(&w, Some(gs), Some(4), QuantMode::Affine)?);
            }
            let ws: Vec<QuantizedWeight<'_>> = qs.iter().map(QuantizedWeight::from).collect();
            let mut same = true;
            let mut one_launch = true;
            for t in 0..3 {
                let x = scaled_normal(&[1, 1, k], t, 1.0 + 3.0 * t as f32)?;
                set_fast_qmv(true);
                let before = fast_qmv_launches();
                let ours = quantized_matmul_many(&x, &ws, Some(gs), Some(4), QuantMode::Affine)?;
                one_launch &= fast_qmv_launches() == before + 1;
                transforms::eval(&ours.iter().collect::<Vec<_>>())?;
                set_fast_qmv(false);
                for (y, q) in ours.iter().zip(&qs) {
                    same &= y.array_equal(&qmm4(&x, q, gs)?, false)?.item::<bool>()?;
                }
            }
            set_fast_qmv(true);
            all &= same;
            println!(
                "qmv many K={k} N={ns:?} group {gs}: {}{}",
                if same { "identical" } else { "DIFFER" },
                if one_launch { "" } else { " (not one launch)" }
            );
        }
    }
    Ok(all)
}

/// Products whose x is MLX's pending `rms_norm` of a row (`set_fast_qmv_norm`: the norm
/// computed in our launch) against the same graph with MLX's rms_norm kernel, for rows
/// that take each of MLX's rms_norm block shapes (64 threads of one vector; 128 threads
/// of 1..8 vectors; 64 threads of several vectors; 128 threads with the vectors rounded
/// up), through one launch for a group, the swiglu launch and one weight alone, at two
/// eps and three input scales; an evaluated norm must not be recomputed.
fn qmv_norm_shapes() -> Res<bool> {
    use mlx_array::fast::rms_norm;
    use mlx_array::quant::{
        fast_qmv_norm_launches, quantize, quantized_matmul, quantized_matmul_many,
        quantized_matmul_swiglu, set_fast_qmv_norm, GateUp, QuantMode, QuantizedWeight,
    };
    let groups: [(i32, &[i32]); 12] = [
        (512, &[512, 128]),
        (576, &[576, 192, 192]),
        (896, &[896, 128, 128]),
        (960, &[960, 320, 320]),
        (1024, &[1024, 256]),
        (2048, &[2048, 512, 512]),
        (2560, &[2560, 512]),
        (3072, &[3072, 1024, 1024]),
        (3584, &[3584, 512, 512]),
        (4096, &[4096, 1024, 1024]),
        (5120, &[5120, 1024, 1024]),
        (8192, &[8192, 1024, 1024]),
    ];
    let gs = 64;
    let mut all = true;
    for (k, ns) in groups {
        let qs = ns
            .iter()
            .enumerate()
            .map(|(i, &n)| -> Res<_> {
                let w = scaled_normal(&[n, k], 70 + i as u64, 0.05)?;
                Ok(quantize(&w, Some(gs), Some(4), QuantMode::Affine)?)
            })
            .collect::<Res<Vec<_>>>()?;
        let ws: Vec<QuantizedWeight<'_>> = qs.iter().map(QuantizedWeight::from).collect();
        let nw = scaled_normal(&[k], 90, 0.2)?
            .add(&Array::scalar(1.0f32)?)?
            .astype(Dtype::Bfloat16)?;
        let mut same = true;
        let mut fused = true;
        for (t, scale) in [0.02f32, 1.0, 40.0].into_iter().enumerate() {
            for eps in [1e-5f32, 1e-6] {
                let x = scaled_normal(&[1, 1, k], 80 + t as u64, scale)?;
                let outs = |on: bool| -> Res<Vec<Array>> {
                    set_fast_qmv_norm(on);
                    let before = fast_qmv_norm_launches();
                    // One pending norm feeding all three products.
                    let h = rms_norm(&x, Some(&nw), eps)?;
                    let mut ys =
                        quantized_matmul_many(&h, &ws, Some(gs), Some(4), QuantMode::Affine)?;
                    ys.push(quantized_matmul(
                        &h,
                        &qs[0].weight,
                        &qs[0].scales,
                        qs[0].biases.as_ref(),
                        true,
                        Some(gs),
                        Some(4),
                        QuantMode::Affine,
                    )?);
                    match quantized_matmul_swiglu(
                        &h,
                        (&qs[0]).into(),
                        (&qs[0]).into(),
                        Some(gs),
                        Some(4),
                        QuantMode::Affine,
                    )? {
                        GateUp::Swiglu(y) => ys.push(y),
                        GateUp::Products(g, u) => ys.extend([g, u]),
                    }
                    transforms::eval(&ys.iter().collect::<Vec<_>>())?;
                    // `fused` tracks whether every product above took the norm in.
                    if on && fast_qmv_norm_launches() != before + 3 {
                        println!(
                            "  K={k}: {} of 3 launches computed the norm",
                            fast_qmv_norm_launches() - before
                        );
                        return Err("norm not fused".into());
                    }
                    Ok(ys)
                };
                let theirs = outs(false)?;
                let ours = match outs(true) {
                    Ok(y) => y,
                    Err(_) => {
                        fused = false;
                        continue;
                    }
                };
                for (a, b) in ours.iter().zip(&theirs) {
                    same &= a.array_equal(b, false)?.item::<bool>()?;
                }
            }
        }
        // An evaluated norm is read, not computed again.
        let h = rms_norm(&scaled_normal(&[1, 1, k], 99, 1.0)?, Some(&nw), 1e-5)?;
        transforms::eval(&[&h])?;
        set_fast_qmv_norm(true);
        let before = fast_qmv_norm_launches();
        let y = quantized_matmul_many(&h, &ws, Some(gs), Some(4), QuantMode::Affine)?;
        transforms::eval(&y.iter().collect::<Vec<_>>())?;
        let evaluated_kept = fast_qmv_norm_launches() == before;
        all &= same && fused && evaluated_kept;
        println!(
            "qmv norm K={k} N={ns:?}: {}{}{}",
            if same { "identical" } else { "DIFFER" },
            if fused { "" } else { " (not fused)" },
            if evaluated_kept {
                ""
            } else {
                " (an evaluated norm recomputed)"
            }
        );
    }
    Ok(all)
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: fused_check MODEL_DIR [PROMPT] [STEPS] [fused|qmv|norm|gemv]")?;
    let prompt: i32 = args.next().map_or(Ok(64), |s| s.parse())?;
    let steps: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let what = args.next().unwrap_or_else(|| "fused".into());
    let mut all_equal = true;
    // The two arms: (label, model, the kernel under test on), and that kernel's switch.
    let mut switch: fn(bool) = mlx_array::quant::set_fast_qmv;
    let arms: [(&str, Box<dyn LanguageModel>, bool); 2] = match what.as_str() {
        "fused" => [
            (
                "unfused",
                load_model_with(
                    &dir,
                    &LoadOptions {
                        unfused: true,
                        ..Default::default()
                    },
                )?
                .0,
                true,
            ),
            (
                "fused",
                load_model_with(&dir, &LoadOptions::default())?.0,
                true,
            ),
        ],
        "qmv" => {
            // Each shape is a kernel to compile (N is a compile-time constant): the sweeps
            // take minutes on a fresh machine, so they can be left out for other models.
            match std::env::var("FUSED_CHECK_SHAPES").as_deref() {
                Ok("0") => {}
                Ok("swiglu") => all_equal &= qmv_swiglu_shapes()?,
                _ => all_equal &= qmv_shapes()?,
            }
            [
                (
                    "mlx qmv",
                    load_model_with(&dir, &LoadOptions::default())?.0,
                    false,
                ),
                (
                    "our qmv",
                    load_model_with(&dir, &LoadOptions::default())?.0,
                    true,
                ),
            ]
        }
        "norm" => {
            if std::env::var("FUSED_CHECK_SHAPES").as_deref() != Ok("0") {
                all_equal &= qmv_norm_shapes()?;
            }
            switch = mlx_array::quant::set_fast_qmv_norm;
            [
                (
                    "mlx rms_norm",
                    load_model_with(&dir, &LoadOptions::default())?.0,
                    false,
                ),
                (
                    "norm in our qmv",
                    load_model_with(&dir, &LoadOptions::default())?.0,
                    true,
                ),
            ]
        }
        "gemv" => {
            if std::env::var("FUSED_CHECK_SHAPES").as_deref() != Ok("0") {
                all_equal &= gemv_shapes()?;
            }
            switch = mlx_array::fast::set_gemv;
            [
                (
                    "mlx gemv",
                    load_model_with(&dir, &LoadOptions::default())?.0,
                    false,
                ),
                (
                    "our gemv",
                    load_model_with(&dir, &LoadOptions::default())?.0,
                    true,
                ),
            ]
        }
        other => return Err(format!("unknown check {other:?} (fused, qmv, norm or gemv)").into()),
    };
    for batch in [1, 4] {
        // Twice each, so the timing of the second round has its kernels built.
        let mut times = (0.0, 0.0);
        let mut diffs = Vec::new();
        for _ in 0..2 {
            switch(arms[0].2);
            let (a, ta) = run(arms[0].1.as_ref(), batch, prompt, steps)?;
            switch(arms[1].2);
            let (b, tb) = run(arms[1].1.as_ref(), batch, prompt, steps)?;
            times = (ta, tb);
            diffs.clear();
            for (x, y) in a.iter().zip(&b) {
                let same = x.array_equal(y, false)?.item::<bool>()?;
                let diff = x
                    .subtract(y)?
                    .abs()?
                    .max(None, false)?
                    .astype(Dtype::Float32)?
                    .item::<f32>()?;
                diffs.push((same, diff));
            }
        }
        let identical = diffs.iter().all(|d| d.0);
        all_equal &= identical;
        let worst = diffs.iter().map(|d| d.1).fold(0f32, f32::max);
        println!(
            "batch {batch}: {} steps, logits {} (max abs diff {worst:e}); decode step {} {:.3} ms, {} {:.3} ms ({:.2}x)",
            diffs.len(),
            if identical { "identical" } else { "DIFFER" },
            arms[0].0,
            times.0 * 1e3,
            arms[1].0,
            times.1 * 1e3,
            times.0 / times.1
        );
    }
    println!(
        "fused_check {what} {dir}: {} (our qmv kernel used {} times, our gemv {} times)",
        if all_equal { "identical" } else { "DIFFER" },
        mlx_array::quant::fast_qmv_launches(),
        mlx_array::fast::gemv_launches()
    );
    Ok(())
}

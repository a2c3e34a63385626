//! Checks on the current device that fused projections (`mlx_nn::FusedLinears`, the
//! loader's default) give the logits of separate projections bit for bit: loads the
//! model twice (fused and `unfused`), prefills the same random prompts, then decodes
//! greedily at batch 1 and batch 4, comparing every step's logits exactly; then times
//! the decode steps of both.
//!
//! ```sh
//! cargo run --release -p mlx-engine --example fused_check -- MODEL_DIR [PROMPT] [STEPS]
//! ```
use mlx_array::{random, transforms, Array, Dtype};
use mlx_models::{load_model_with, LanguageModel, LoadOptions};
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

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

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: fused_check MODEL_DIR [PROMPT] [STEPS]")?;
    let prompt: i32 = args.next().map_or(Ok(64), |s| s.parse())?;
    let steps: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let (unfused, _) = load_model_with(
        &dir,
        &LoadOptions {
            unfused: true,
            ..Default::default()
        },
    )?;
    let (fused, _) = load_model_with(&dir, &LoadOptions::default())?;
    let mut all_equal = true;
    for batch in [1, 4] {
        // Twice each, so the timing of the second round has its kernels built.
        let mut times = (0.0, 0.0);
        let mut diffs = Vec::new();
        for _ in 0..2 {
            let (a, ta) = run(unfused.as_ref(), batch, prompt, steps)?;
            let (b, tb) = run(fused.as_ref(), batch, prompt, steps)?;
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
            "batch {batch}: {} steps, logits {} (max abs diff {worst:e}); decode step unfused {:.3} ms, fused {:.3} ms ({:.2}x)",
            diffs.len(),
            if identical { "identical" } else { "DIFFER" },
            times.0 * 1e3,
            times.1 * 1e3,
            times.0 / times.1
        );
    }
    println!(
        "fused_check {dir}: {}",
        if all_equal { "identical" } else { "DIFFER" }
    );
    Ok(())
}

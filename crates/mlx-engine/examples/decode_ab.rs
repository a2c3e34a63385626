//! Decode speed of several settings of our kernels compared inside one process.
//!
//! On the GPU machine one process decodes a small model up to ~1.9x faster than the next
//! (the host's speed per process; benchmarks/GPU.md runs 7 and 8), which hides any change
//! of less than that between processes. Here every arm runs in the same process, in
//! rounds of alternating order (A B, then B A, ...), each a full pipelined generation
//! through `TokenGenerator` (greedy, the same random prompt), so the arms share whatever
//! speed the process got.
//!
//! ```sh
//! cargo run --release -p mlx-engine --example decode_ab -- MODEL_DIR [PROMPT] [TOKENS] [ROUNDS] [ARM ...]
//! ```
//! An arm is `NAME` or `NAME:SETTING,...` with the settings `qmv=0|1` (our one-row 4-bit
//! kernels, `set_fast_qmv`), `many=0|1` (one launch for q/k/v and gate/up,
//! `set_fast_qmv_many`), `residual=0|1` (the residual adds in our kernels,
//! `set_fast_qmv_residual`) and `swiglu=0|1` (gate/up and their swiglu in one launch,
//! `set_fast_qmv_swiglu`), and `min=N` (weights under N elements left to MLX's kernels,
//! `set_fast_qmv_min_elements`); each switch not given is on, as shipped. The
//! default arms are `ours`, `noswiglu:swiglu=0`, `nores:residual=0` and `mlx:qmv=0`.
//! Prints every round's decode tok/s per arm, then each arm's mean and its mean ratio to
//! the first arm over the rounds (each round's pair from the same moment).
use mlx_array::quant::{
    set_fast_qmv, set_fast_qmv_many, set_fast_qmv_min_elements, set_fast_qmv_residual,
    set_fast_qmv_swiglu,
};
use mlx_engine::{GenerateOptions, TokenGenerator, TokenIterator};
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One setting of the switches.
struct Arm {
    name: String,
    qmv: bool,
    many: bool,
    residual: bool,
    swiglu: bool,
    min: u64,
}

fn parse_arm(spec: &str) -> Res<Arm> {
    let (name, settings) = spec.split_once(':').unwrap_or((spec, ""));
    let mut arm = Arm {
        name: name.to_string(),
        qmv: true,
        many: true,
        residual: true,
        swiglu: true,
        min: 0,
    };
    for s in settings.split(',').filter(|s| !s.is_empty()) {
        if let Some(n) = s.strip_prefix("min=") {
            arm.min = n
                .parse()
                .map_err(|e| format!("arm {spec:?}: min={n:?}: {e}"))?;
            continue;
        }
        let on = match s.split_once('=') {
            Some((_, "1")) => true,
            Some((_, "0")) => false,
            _ => return Err(format!("arm {spec:?}: expected KEY=0 or KEY=1, got {s:?}").into()),
        };
        match s.split_once('=').map(|(k, _)| k) {
            Some("qmv") => arm.qmv = on,
            Some("many") => arm.many = on,
            Some("residual") => arm.residual = on,
            Some("swiglu") => arm.swiglu = on,
            _ => {
                return Err(format!(
                    "arm {spec:?}: unknown setting {s:?} (qmv, many, residual, swiglu)"
                )
                .into())
            }
        }
    }
    Ok(arm)
}

/// Decode tok/s of one greedy generation of `tokens` tokens after `prompt`, timed from the
/// first token to the last (mlx-lm's `generation_tps`).
fn decode_tps(model: &dyn mlx_models::LanguageModel, prompt: &[u32], tokens: i64) -> Res<f64> {
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None)?;
    let opts = GenerateOptions {
        max_tokens: tokens,
        ..Default::default()
    };
    let mut gen = TokenGenerator::new(model, prompt, &mut caches, opts)?;
    let mut start = None;
    let mut n = 0u32;
    while gen.next_token()?.is_some() {
        n += 1;
        if start.is_none() {
            start = Some(Instant::now());
        }
    }
    let secs = start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Ok(if n > 1 && secs > 0.0 {
        f64::from(n - 1) / secs
    } else {
        0.0
    })
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: decode_ab MODEL_DIR [PROMPT] [TOKENS] [ROUNDS] [ARM ...]")?;
    let prompt_len: u32 = args.next().map_or(Ok(512), |s| s.parse())?;
    let tokens: i64 = args.next().map_or(Ok(256), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(6), |s| s.parse())?;
    let mut arms = args.map(|a| parse_arm(&a)).collect::<Res<Vec<_>>>()?;
    if arms.is_empty() {
        arms = ["ours", "noswiglu:swiglu=0", "nores:residual=0", "mlx:qmv=0"]
            .iter()
            .map(|a| parse_arm(a))
            .collect::<Res<_>>()?;
    }
    let (model, _) = mlx_models::load_model(&dir)?;
    let vocab = 1000u32;
    let prompt: Vec<u32> = (0..prompt_len).map(|i| (i * 7919 + 13) % vocab).collect();
    let set = |a: &Arm| {
        set_fast_qmv(a.qmv);
        set_fast_qmv_many(a.many);
        set_fast_qmv_residual(a.residual);
        set_fast_qmv_swiglu(a.swiglu);
        set_fast_qmv_min_elements(a.min);
    };
    // Warm-up: every arm once (kernels compiled, the allocator's cache filled).
    for a in &arms {
        set(a);
        decode_tps(model.as_ref(), &prompt, tokens.min(32))?;
    }
    let mut tps = vec![Vec::with_capacity(rounds); arms.len()];
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 {
            (0..arms.len()).collect()
        } else {
            (0..arms.len()).rev().collect()
        };
        for &i in &order {
            set(&arms[i]);
            tps[i].push(decode_tps(model.as_ref(), &prompt, tokens)?);
        }
        let line: Vec<String> = arms
            .iter()
            .zip(&tps)
            .map(|(a, t)| format!("{} {:.1}", a.name, t[r]))
            .collect();
        println!("round {r}: {}", line.join(", "));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for (a, t) in arms.iter().zip(&tps) {
        let ratios: Vec<f64> = t.iter().zip(&tps[0]).map(|(x, b)| x / b).collect();
        println!(
            "{}: mean {:.1} tok/s, {:.3}x {} (round by round: {})",
            a.name,
            mean(t),
            mean(&ratios),
            arms[0].name,
            ratios
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}

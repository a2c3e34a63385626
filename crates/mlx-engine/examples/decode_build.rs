//! Times one decode step's host work in isolation: graph construction (the model
//! forward plus the greedy sampling ops, exactly what `TokenGenerator` builds per token)
//! and a synchronous `eval` of it (MLX encoding + device time + wait), nothing else
//! running. Used to profile per-token host cost (see benchmarks/GPU.md).
//!
//! ```sh
//! cargo run --release -p mlx-engine --example decode_build -- MODEL_DIR [PROMPT] [STEPS]
//! cargo run --release -p mlx-engine --example decode_build -- micro 0 CHAIN_LENGTH
//! ```
//! The second form times chains of single ops (host cost per node of each kind).
//! Build it with `--features mimalloc` to time the host as our binaries run it (they
//! link mimalloc; without it glibc's malloc takes ~40% more build time here).
//! `DECODE_BUILD_DOT=FILE` also writes the first decode step's graph as Graphviz dot;
//! `DECODE_BUILD_PREFILL_DOT=FILE` writes the prefill's (the forward of PROMPT - 1 tokens
//! into fresh caches, up to the caches' state, as the engine evaluates it) and exits.
use mlx_array::{transforms, Array};
use std::time::Instant;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// CPU time of this thread in seconds (Linux `CLOCK_THREAD_CPUTIME_ID`), which leaves
/// out time spent waiting for a core on a busy machine.
fn thread_cpu() -> f64 {
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out-pointer; clock 3 is CLOCK_THREAD_CPUTIME_ID on Linux.
    unsafe { clock_gettime(3, &mut t) };
    t.sec as f64 + t.nsec as f64 * 1e-9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: decode_build MODEL_DIR [PROMPT] [STEPS]")?;
    let prompt: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    let steps: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    if dir == "micro" {
        return micro(steps);
    }
    let (model, _) = mlx_models::load_model(&dir)?;
    let stream = mlx_engine::generation_stream()?;
    mlx_array::with_stream(stream, || -> Result<(), Box<dyn std::error::Error>> {
        if std::env::var_os("DECODE_BUILD_ONLY").is_some() {
            // Construction alone (no cache, nothing evaluated), for a CPU profiler.
            let y = Array::from_slice(&[1u32], &[1, 1])?;
            transforms::eval(&[&model.forward(&y, &mut [])?])?;
            let c0 = thread_cpu();
            for _ in 0..steps {
                let logits = model.forward(&y, &mut [])?;
                let lp = logits.subtract(&logits.logsumexp(None, true)?)?;
                let _ = lp.argmax(Some(-1), false)?;
            }
            println!(
                "build only (no cache): {:.0} us thread CPU per step",
                (thread_cpu() - c0) * 1e6 / steps as f64
            );
            return Ok(());
        }
        if let Some(path) = std::env::var_os("DECODE_BUILD_PREFILL_DOT") {
            let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None)?;
            let n = prompt.saturating_sub(1).max(1);
            let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % 1000).collect();
            let x = Array::from_slice(&ids, &[1, n as i32])?;
            model.forward(&x, &mut caches)?;
            let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
            mlx_array::io::export_to_dot(&path, &state.iter().collect::<Vec<_>>())?;
            return Ok(());
        }
        for round in 0..2 {
            let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None)?;
            let ids: Vec<u32> = (0..prompt as u32).map(|i| (i * 7919) % 1000).collect();
            let x = Array::from_slice(&ids, &[1, prompt as i32])?;
            let out = model.forward(&x, &mut caches)?;
            transforms::eval(&[&out])?;
            let mut y = Array::from_slice(&[1u32], &[1])?;
            let (mut build, mut eval, mut build_cpu, mut encode) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for step in 0..steps {
                let t0 = Instant::now();
                let c0 = thread_cpu();
                let logits = model.forward(&y.expand_dims(&[0])?, &mut caches)?;
                let v = logits.dim(2)?;
                let logits = logits
                    .slice(&[0, 0, 0], &[1, 1, v], None)?
                    .squeeze(Some(&[1]))?;
                let logprobs = logits.subtract(&logits.logsumexp(None, true)?)?;
                let next = logprobs.argmax(Some(-1), false)?;
                let lp = logprobs.squeeze(Some(&[0]))?;
                let t1 = Instant::now();
                if let (0, Some(path)) = (round + step, std::env::var_os("DECODE_BUILD_DOT")) {
                    // The first step's graph (benchmarks/graph_nodes.py counts it).
                    mlx_array::io::export_to_dot(&path, &[&next, &lp])?;
                }
                build_cpu += thread_cpu() - c0;
                transforms::async_eval(&[&next, &lp])?;
                let ta = Instant::now();
                transforms::eval(&[&next, &lp])?;
                let t2 = Instant::now();
                encode += (ta - t1).as_secs_f64();
                if std::env::var_os("DECODE_BUILD_VERBOSE").is_some() {
                    println!("  build {:?} eval {:?}", t1 - t0, t2 - t1);
                }
                build += (t1 - t0).as_secs_f64();
                eval += (t2 - t1).as_secs_f64();
                y = next;
            }
            let n = steps as f64;
            println!(
                "round {round}: {steps} steps after a {prompt}-token prompt: build {:.0} us \
                 ({:.0} us thread CPU), async_eval with the device idle {:.0} us, then \
                 waiting {:.0} us per step",
                build * 1e6 / n,
                build_cpu * 1e6 / n,
                encode * 1e6 / n,
                (eval - encode) * 1e6 / n
            );
        }
        Ok(())
    })?;
    Ok(())
}

/// Host cost per node of single-op chains (bf16, a decode-sized `[1, 1, 896]` row):
/// graph construction, `async_eval` with the device idle, and the wait after it.
fn micro(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    use mlx_array::{fast, ops, quant, random, Dtype};
    let stream = mlx_engine::generation_stream()?;
    mlx_array::with_stream(stream, || -> Result<(), Box<dyn std::error::Error>> {
        let d = 896;
        let x0 = random::normal(&[1, 1, d], Dtype::Bfloat16, None, None, None)?;
        let w = random::normal(&[d, d], Dtype::Bfloat16, None, None, None)?.multiply(0.03)?;
        let wt = w.transpose(None)?;
        let bias = random::normal(&[d], Dtype::Bfloat16, None, None, None)?;
        let q = quant::quantize(&w, Some(64), Some(4), quant::QuantMode::Affine)?;
        let norm_w = ops::ones(&[d], Dtype::Bfloat16)?;
        transforms::eval(&[&x0, &wt, &bias, &q.weight, &q.scales, &norm_w])?;
        let qb = q.biases.clone();
        type Op<'a> = Box<dyn Fn(&Array) -> mlx_array::Result<Array> + 'a>;
        let cases: Vec<(&str, Op)> = vec![
            ("add (1 kernel)", Box::new(|x: &Array| x.add(&bias))),
            ("transpose (view)", Box::new(|x: &Array| x.transpose(None))),
            (
                "2 reshapes (views)",
                Box::new(|x: &Array| x.reshape(&[1, d, 1])?.reshape(&[1, 1, d])),
            ),
            ("matmul 1x896x896", Box::new(|x: &Array| x.matmul(&wt))),
            (
                "addmm 1x896x896",
                Box::new(|x: &Array| ops::addmm(&bias, x, &wt, 1.0, 1.0)),
            ),
            (
                "quantized_matmul 4-bit",
                Box::new(|x: &Array| {
                    quant::quantized_matmul(
                        x,
                        &q.weight,
                        &q.scales,
                        qb.as_ref(),
                        true,
                        Some(64),
                        Some(4),
                        quant::QuantMode::Affine,
                    )
                }),
            ),
            (
                "rms_norm",
                Box::new(|x: &Array| fast::rms_norm(x, Some(&norm_w), 1e-6)),
            ),
            (
                "rope [1,14,1,64]",
                Box::new(|x: &Array| {
                    fast::rope(
                        &x.reshape(&[1, 14, 1, 64])?,
                        64,
                        false,
                        Some(1e6),
                        1.0,
                        fast::RopeOffset::Int(100),
                        None,
                    )?
                    .reshape(&[1, 1, d])
                }),
            ),
        ];
        for (name, op) in &cases {
            let (mut b, mut e, mut w) = (0.0f64, 0.0f64, 0.0f64);
            for rep in 0..6 {
                let t0 = Instant::now();
                let mut x = x0.clone();
                for _ in 0..n {
                    x = op(&x)?;
                }
                let t1 = Instant::now();
                transforms::async_eval(&[&x])?;
                let t2 = Instant::now();
                x.eval()?;
                let t3 = Instant::now();
                if rep > 0 {
                    b += (t1 - t0).as_secs_f64();
                    e += (t2 - t1).as_secs_f64();
                    w += (t3 - t2).as_secs_f64();
                }
            }
            let per = 1e6 / (5.0 * n as f64);
            println!(
                "micro {name:<24} per node: build {:.2} us, async_eval {:.2} us, wait {:.2} us",
                b * per,
                e * per,
                w * per
            );
        }
        Ok(())
    })
}

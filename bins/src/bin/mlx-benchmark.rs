//! `mlx-benchmark`: mlx-lm's `mlx_lm.benchmark`, with the same flags, definitions and
//! output (per-trial prompt_tps, generation_tps, peak_memory, total_time; then averages).
use anyhow::{bail, Result};
use clap::Parser;
use mlx_array::{random, Array, Dtype};
use mlx_bins::load::{load, LoadArgs};
use mlx_bins::outln;
use mlx_engine::batch::{BatchGenerator, BatchOptions};
use mlx_engine::{
    stream_generate, stream_generate_with, GenerateOptions, PromptInput, SpeculativeGenerator,
    SpeculativeStats,
};
use std::process::ExitCode;
use std::time::Instant;

/// LLM benchmarking script
#[derive(Parser, Debug)]
#[command(
    name = "mlx-benchmark",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// The path to the local model directory or Hugging Face repo (default: the embedded
    /// SmolLM2-135M-Instruct).
    #[arg(long)]
    model: Option<String>,
    /// Length of prompt
    #[arg(long, short = 'p', default_value_t = 512)]
    prompt_tokens: i32,
    /// Length of completion
    #[arg(long, short = 'g', default_value_t = 1024)]
    generation_tokens: i64,
    /// Batch size
    #[arg(long, short = 'b', default_value_t = 1)]
    batch_size: i32,
    /// Number of timing trials
    #[arg(long, short = 'n', default_value_t = 5)]
    num_trials: usize,
    /// Use pipelining instead of tensor parallelism
    #[arg(long)]
    pipeline: bool,
    /// Quantize activations using the same quantization config as the corresponding layer.
    #[arg(long)]
    quantize_activations: bool,
    /// Step size for prefill processing
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// Delay between each test in seconds
    #[arg(long, default_value_t = 0)]
    delay: u64,
    /// Enable trusting remote code for tokenizer/model loading (accepted; meaningless here).
    #[arg(long)]
    trust_remote_code: bool,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
    /// Speculative decoding (not in mlx-lm's benchmark): the flags of mlx-generate.
    #[command(flatten)]
    spec: mlx_bins::speculative::SpeculativeArgs,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[(
        "-qa",
        "--quantize-activations",
    )]));
    mlx_bins::run(|| bench(args))
}

/// What runs a trial: mlx-lm's `single_bench` (stream_generate) or `batch_bench`.
enum Runner {
    Single(Box<dyn mlx_models::LanguageModel>),
    Batch(Box<BatchGenerator>),
}

struct Trial {
    prompt_tps: f64,
    generation_tps: f64,
    peak_memory: f64,
}

fn bench(args: Args) -> Result<()> {
    mlx_bins::unsupported("--pipeline (distributed inference)", args.pipeline)?;
    mlx_bins::unsupported("--quantize-activations (-qa)", args.quantize_activations)?;
    if args.prompt_tokens < 1
        || args.generation_tokens < 1
        || args.num_trials < 1
        || args.batch_size < 1
        || args.prefill_step_size < 1
    {
        bail!("--prompt-tokens, --generation-tokens, --batch-size, --num-trials and --prefill-step-size must be positive");
    }
    random::seed(0)?;
    let loaded = load(&LoadArgs {
        model: args.model.as_deref(),
        cpu_weights: args.cpu_weights,
        adapter_path: None,
    })?;
    let (model, mut tokenizer) = (loaded.model, loaded.tokenizer);
    if args.spec.enabled() && args.batch_size > 1 {
        bail!("speculative decoding (--draft-model, --prompt-lookup-*) runs with --batch-size 1 only in mlx-benchmark");
    }
    let spec = args.spec.load(args.cpu_weights, &tokenizer)?;
    let last_stats = std::cell::RefCell::new(None::<SpeculativeStats>);
    tracing::debug!("loaded ({})", mlx_array::memory::note());
    // Empty to avoid early stopping.
    tokenizer.set_eos_token_ids([]);
    let vocab = model.vocab_size();
    let prompts = random::randint(
        &Array::scalar(0i32)?,
        &Array::scalar(vocab)?,
        &[args.batch_size, args.prompt_tokens],
        Dtype::Int32,
        None,
    )?;
    let prompts: Vec<Vec<u32>> = prompts
        .to_vec::<i32>()?
        .chunks(args.prompt_tokens as usize)
        .map(|row| row.iter().map(|&t| t as u32).collect())
        .collect();

    // Batch size 1 runs stream_generate (mlx-lm's single_bench); more runs the batch
    // engine the server uses (mlx-lm's batch_generate with its BatchGenerator).
    let runner = if args.batch_size > 1 {
        let opts = BatchOptions {
            prefill_step_size: args.prefill_step_size,
            ..Default::default()
        };
        Runner::Batch(Box::new(BatchGenerator::start(model, opts)?))
    } else {
        Runner::Single(model)
    };
    let max_tokens = usize::try_from(args.generation_tokens)?;
    let run_once = || -> Result<Trial> {
        let model = match &runner {
            Runner::Single(model) => model.as_ref(),
            Runner::Batch(gen) => {
                let s = gen.generate(&prompts, max_tokens)?.stats;
                return Ok(Trial {
                    prompt_tps: s.prompt_tps(),
                    generation_tps: s.generation_tps(),
                    peak_memory: s.peak_memory,
                });
            }
        };
        let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None)?;
        let opts = GenerateOptions {
            max_tokens: args.generation_tokens,
            prefill_step_size: args.prefill_step_size,
            ..Default::default()
        };
        let last = match &spec {
            None => stream_generate(
                model,
                &tokenizer,
                PromptInput::Tokens(&prompts[0]),
                &mut caches,
                opts,
                |_| true,
            )?,
            Some(s) => {
                if let Some(d) = s.draft_model() {
                    caches.extend(mlx_cache::make_prompt_cache(&d.cache_specs(), None)?);
                }
                let (source, k) = s.source();
                let mut gen =
                    SpeculativeGenerator::new(model, source, &prompts[0], &mut caches, k, opts)?
                        .with_min_acceptance_if(args.spec.min_acceptance()?)?;
                let last =
                    stream_generate_with(&mut gen, &tokenizer, args.generation_tokens, |_| true)?;
                *last_stats.borrow_mut() = Some(gen.stats().clone());
                last
            }
        };
        let Some(r) = last else {
            bail!("no tokens were generated")
        };
        Ok(Trial {
            prompt_tps: r.prompt_tps,
            generation_tps: r.generation_tps,
            peak_memory: r.peak_memory,
        })
    };

    outln!("Running warmup..")?;
    run_once()?;
    outln!(
        "Timing with prompt_tokens={}, generation_tokens={}, batch_size={}.",
        args.prompt_tokens,
        args.generation_tokens,
        args.batch_size
    )?;
    let mut trials = Vec::new();
    for i in 0..args.num_trials {
        if args.delay > 0 {
            std::thread::sleep(std::time::Duration::from_secs(args.delay));
        }
        let tic = Instant::now();
        let t = run_once()?;
        let total = tic.elapsed().as_secs_f64();
        outln!(
            "Trial {}:  prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}, total_time={:.3}",
            i + 1,
            t.prompt_tps,
            t.generation_tps,
            t.peak_memory,
            total
        )?;
        trials.push(t);
    }
    let n = trials.len() as f64;
    let avg = |f: fn(&Trial) -> f64| trials.iter().map(f).sum::<f64>() / n;
    outln!(
        "Averages: prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
        avg(|t| t.prompt_tps),
        avg(|t| t.generation_tps),
        avg(|t| t.peak_memory)
    )?;
    // Ours, on stderr: standard output stays mlx-lm's.
    if let Some(stats) = last_stats.borrow().as_ref() {
        for line in mlx_bins::speculative::report(stats) {
            eprintln!("{line} (last trial)");
        }
    }
    Ok(())
}

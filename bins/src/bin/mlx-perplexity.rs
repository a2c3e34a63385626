//! `mlx-perplexity`: mlx-lm's `mlx_lm.perplexity`, with the same flags, defaults, data
//! order (NumPy's seeded permutation of the rows), arithmetic and output. Data come from
//! a local dataset (a directory with `train.jsonl` or one `.jsonl` file) or a Hugging Face
//! dataset id (downloaded into the Hugging Face cache; its `train` split as
//! `datasets.load_dataset` finds it), in mlx-lm's text / chat / completions formats.
use anyhow::{Context, Result};
use clap::Parser;
use mlx_bins::load::{load, LoadArgs};
use mlx_bins::{out, outln};
use mlx_eval::{datasets, eval_ppl, load_data, Features, RandomState};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

/// Evaluate perplexity of MLX models
#[derive(Parser, Debug)]
#[command(
    name = "mlx-perplexity",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// Path to model or Hugging Face model ID
    #[arg(long)]
    model: String,
    /// Enable trusting remote code for tokenizer/model loading from Hugging Face
    /// (accepted; meaningless here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Batch size for evaluation
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Sequence length for evaluation
    #[arg(long, default_value_t = 512)]
    sequence_length: usize,
    /// Number of samples to use (-1 for all available)
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    num_samples: i64,
    /// A dataset in an mlx-lm dataset format: a directory with train.jsonl, a .jsonl
    /// file, or a Hugging Face dataset id (JSON Lines, JSON or Parquet files).
    #[arg(long, default_value = "allenai/tulu-3-sft-mixture")]
    data_path: String,
    /// Random seed for data sampling
    #[arg(long, default_value_t = 123)]
    seed: u32,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[]));
    mlx_bins::run(|| perplexity(args))
}

fn perplexity(args: Args) -> Result<()> {
    if args.batch_size == 0 {
        anyhow::bail!("--batch-size must be at least 1");
    }
    if args.sequence_length < 2 {
        anyhow::bail!(
            "--sequence-length must be at least 2 (a token and the one it predicts), got {}",
            args.sequence_length
        );
    }
    // mlx-lm seeds NumPy (the data order) and MLX.
    let mut rng = RandomState::new(args.seed);
    mlx_array::random::seed(u64::from(args.seed))?;
    // The rows are read (and checked) before the slower model load.
    let local = Path::new(&args.data_path);
    let dataset = if !local.exists() && mlx_hub::is_repo_id(&args.data_path) {
        let snap = mlx_hub::Locations::from_env()?.hub_dataset(&args.data_path, "main")?;
        let (rows, source) = mlx_eval::hub_data::read_split(&snap, "train")?;
        datasets::Dataset::new(rows, &Features::default(), false, &source)?
    } else {
        datasets::load_split(local, "train", &Features::default(), false)?
    };

    outln!("Loading model from {}...", args.model)?;
    let mut loaded = load(&LoadArgs {
        model: Some(&args.model),
        cpu_weights: args.cpu_weights,
        adapter_path: None,
    })?;
    let total = match loaded.model.as_module_mut() {
        Some(m) => mlx_quant::model::model_parameters(m)?,
        None => 0,
    };
    outln!("Model loaded: {:.1}M parameters", total as f64 / 1e6)?;

    outln!("\nLoading dataset...")?;
    outln!("  Sequence length: {}", args.sequence_length)?;
    outln!("Loading Hugging Face dataset {}.", args.data_path)?;
    let data = load_data(
        &loaded.tokenizer,
        &dataset,
        args.num_samples,
        args.sequence_length,
        &mut rng,
    )
    .context("preparing the evaluation data")?;
    let (samples, length) = (data.dim(0)? as usize, data.dim(1)? as usize);
    outln!("  Loaded {samples} samples")?;

    outln!(
        "\nEvaluating perplexity with batch size {}...",
        args.batch_size
    )?;
    let start = Instant::now();
    let mut write_err = None;
    let result = eval_ppl(loaded.model.as_ref(), &data, args.batch_size, |i, n| {
        if write_err.is_none() {
            write_err = out!("  Processed {i}/{n} batches...\r").err();
        }
    })?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    outln!()?;
    let secs = start.elapsed().as_secs_f64();
    let tokens = samples * (length - 1);
    tracing::debug!(
        "perplexity {:?} ± {:?} (mean loss {:?}, std {:?}, {} tokens)",
        result.ppl,
        result.standard_error,
        result.mean_loss,
        result.std_dev,
        result.tokens
    );
    let rule = "=".repeat(60);
    outln!("\n{rule}\nEVALUATION RESULTS\n{rule}")?;
    outln!("Model: {}", args.model)?;
    outln!(
        "Perplexity: {:.3} ± {:.3}",
        result.ppl,
        result.standard_error
    )?;
    outln!("Evaluation time: {secs:.2} seconds")?;
    outln!(
        "Peak memory: {:.2} GB",
        mlx_array::memory::peak_memory() as f64 / 1e9
    )?;
    outln!("Tokens per second: {:.0}", tokens as f64 / secs)?;
    outln!("\nDataset statistics:")?;
    outln!("  Total samples: {samples}")?;
    outln!("  Total tokens: {}", samples * length)?;
    Ok(())
}

//! `mlx-dwq`: mlx-lm's `mlx_lm.dwq` (distilled weight quantization), with its flags and
//! defaults.
//!
//! `--data-path` is a Hugging Face dataset id (its `train` split, from the Hub cache,
//! downloaded when missing) or, as `datasets.load_dataset` takes it, a local directory
//! whose data files make a `train` split (`train.jsonl`, ...). One process: `--pipeline`
//! is accepted and a run behaves as mlx-lm's does with one rank.
use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_bins::outln;
use mlx_quant::model::{load, quantize_model, LoadedModel, QuantArgs};
use mlx_quant::{convert::convert_predicate, resolve_source, save_model_over};
use mlx_train::dwq::{
    batch_order, compute_targets, dwq_quantize, has_targets, load_data, DwqOptions, Reporter,
    Targets,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Distilled weight quantization: a quantized model's scales and biases trained to match
/// the full-precision model's outputs
#[derive(Parser, Debug)]
#[command(name = "mlx-dwq", version)]
struct Args {
    /// A model to distill from for DWQ. If `quantized-model` is not given the student
    /// model will be this model quantized according to `bits` and `group-size`.
    #[arg(long, short = 'm')]
    model: String,
    /// An already quantized model (the student model) to improve with DWQ.
    #[arg(long)]
    quantized_model: Option<String>,
    /// Path to save the quantized model.
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Bits per weight for quantization.
    #[arg(long, default_value_t = 4)]
    bits: i32,
    /// Group size for quantization.
    #[arg(long, default_value_t = 64)]
    group_size: i32,
    /// Number of samples to use for training.
    #[arg(long, default_value_t = 2048)]
    num_samples: usize,
    /// Longest sample (tokens); longer ones are truncated.
    #[arg(long, default_value_t = 1025)]
    max_seq_length: usize,
    /// Seed of the sample order.
    #[arg(long, default_value_t = 123)]
    seed: u32,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-6)]
    learning_rate: f64,
    /// Samples per batch.
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// A Hugging Face dataset which is compatible with an mlx-lm dataset format (an id,
    /// or a local directory holding its data files).
    #[arg(long, default_value = "allenai/tulu-3-sft-mixture")]
    data_path: String,
    /// Use gradient checkpointing to reduce memory use.
    #[arg(long)]
    grad_checkpoint: bool,
    /// Directory to save/load targets.
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// Compute the targets and exit.
    #[arg(long)]
    targets_only: bool,
    /// Use pipeline parallel instead of data parallel (accepted: this build runs one
    /// process, which is both).
    #[arg(long)]
    pipeline: bool,
    /// Enable trusting remote code for tokenizer/model loading (accepted; no Python code
    /// from a model repository is ever run here).
    #[arg(long)]
    trust_remote_code: bool,
}

fn check_args(args: &Args) -> Result<()> {
    if args.quantized_model.is_none() {
        if ![2, 3, 4, 5, 6, 8].contains(&args.bits) {
            bail!(
                "--bits {}: affine quantization takes 2, 3, 4, 5, 6 or 8 bits",
                args.bits
            );
        }
        if ![32, 64, 128].contains(&args.group_size) {
            bail!(
                "--group-size {}: affine quantization takes groups of 32, 64 or 128",
                args.group_size
            );
        }
    }
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if args.max_seq_length < 2 {
        bail!("--max-seq-length must be at least 2 (each row predicts its next tokens)");
    }
    if !args.learning_rate.is_finite() {
        bail!("--learning-rate must be a finite number");
    }
    Ok(())
}

/// The `train` rows of `--data-path`: a local directory read as `datasets` reads one, or a
/// dataset id from the Hugging Face cache (downloaded when missing).
fn read_rows(data_path: &str) -> Result<(Vec<serde_json::Value>, String)> {
    outln!("Loading Hugging Face dataset {data_path}.")?;
    let local = Path::new(data_path);
    let root = if local.is_dir() {
        local.to_path_buf()
    } else if local.exists() {
        bail!(
            "--data-path {data_path}: a file; a local dataset is a directory of data files \
             (e.g. train.jsonl), as datasets.load_dataset reads it"
        );
    } else if data_path.starts_with(['/', '.', '~']) || data_path.split('/').count() > 2 {
        bail!(
            "--data-path {data_path}: no such directory (a local dataset is a directory of \
             data files, e.g. train.jsonl; a Hugging Face dataset is `org/name`)"
        );
    } else {
        mlx_hub::Locations::from_env()
            .and_then(|l| l.hub_dataset(data_path, "main"))
            .with_context(|| {
                format!(
                    "--data-path {data_path}: not a local directory, and the Hugging Face \
                     dataset could not be loaded"
                )
            })?
    };
    let (rows, source) = mlx_train::hf::read(&root, data_path, None, "train")?;
    Ok((rows, source))
}

fn stderr_bar(desc: &str, i: usize, n: usize) {
    let mut e = std::io::stderr().lock();
    if desc.is_empty() {
        let _ = write!(e, "\r{i}/{n}");
    } else {
        let _ = write!(e, "\r{desc}: {i}/{n}");
    }
    if i >= n {
        let _ = writeln!(e);
    }
    let _ = e.flush();
}

fn run(args: Args) -> Result<()> {
    check_args(&args)?;
    // Training differentiates through every op: MLX's own ops give the bits of mlx-lm's
    // forward and of its gradients' summation order.
    mlx_array::fast::set_cpu_gemv(false);
    let opts = DwqOptions {
        batch_size: args.batch_size,
        max_seq_length: args.max_seq_length,
        seed: args.seed,
        learning_rate: args.learning_rate,
        grad_checkpoint: args.grad_checkpoint,
        ..Default::default()
    };
    let targets_ready = args.target_dir.as_deref().is_some_and(has_targets);
    let source = resolve_source(&args.model, &args.mlx_path)?;
    let tokenizer = mlx_tokenizer::Tokenizer::from_dir(&source.dir)
        .with_context(|| format!("loading the tokenizer in {}", source.dir.display()))?;
    let (rows, from) = read_rows(&args.data_path)?;
    let (train, valid) = load_data(
        rows,
        &from,
        &tokenizer,
        args.num_samples,
        args.max_seq_length,
        args.seed,
    )?;
    // Every batch of both splits is checked before any model is loaded (mlx-lm finds a
    // split smaller than a batch when it first iterates it).
    batch_order(&train, args.batch_size, args.seed)?;
    batch_order(&valid, args.batch_size, args.seed)?;
    // An unquantized student is refused before the teacher runs (with --targets-only no
    // student is loaded, as in mlx-lm).
    let quantized = match args.quantized_model.as_ref().filter(|_| !args.targets_only) {
        Some(q) => {
            let qs = resolve_source(q, &args.mlx_path)?;
            let m = load(&qs.dir, true)
                .with_context(|| format!("loading the model in {}", qs.dir.display()))?;
            if !m.config.contains_key("quantization") {
                bail!(
                    "Quantized model must already be quantized: {q} has no quantization \
                     section in its config.json"
                );
            }
            Some((m, qs))
        }
        None => None,
    };
    let mut line = |s: &str| {
        let _ = outln!("{s}");
    };
    let mut bar = stderr_bar;
    let mut report = Reporter {
        line: &mut line,
        progress: &mut bar,
    };
    let teacher = if !targets_ready || args.quantized_model.is_none() {
        Some(
            load(&source.dir, true)
                .with_context(|| format!("loading the model in {}", source.dir.display()))?,
        )
    } else {
        None
    };
    if let (Some(dir), false, Some(t)) = (&args.target_dir, targets_ready, &teacher) {
        compute_targets(&*t.model, dir, &train, &valid, &opts, &mut report)?;
    }
    if args.targets_only {
        return Ok(());
    }
    let (mut student, student_source): (LoadedModel, _) = match quantized {
        Some(q) => q,
        None => {
            let mut m = load(&source.dir, true)
                .with_context(|| format!("loading the model in {}", source.dir.display()))?;
            let mut predicate = convert_predicate(&mut m, None, Some(args.group_size))?;
            let bpw = quantize_model(
                &mut m,
                QuantArgs {
                    group_size: Some(args.group_size),
                    bits: Some(args.bits),
                    mode: mlx_array::quant::QuantMode::Affine,
                },
                &mut *predicate,
            )?;
            outln!("[INFO] Quantized model with {bpw:.3} bits per weight.")?;
            (m, resolve_source(&args.model, &args.mlx_path)?)
        }
    };
    let targets = match (&args.target_dir, &teacher) {
        (Some(dir), _) => Targets::Dir(dir.clone()),
        (None, Some(t)) => Targets::Teacher(&*t.model),
        (None, None) => bail!("no teacher model and no targets"),
    };
    dwq_quantize(
        student.model.as_mut(),
        &targets,
        &train,
        &valid,
        &opts,
        &mut report,
    )?;
    drop(targets);
    drop(teacher);
    let (saved, _) = save_model_over(&args.mlx_path, student, &student_source, 5 << 30, true)?;
    outln!(
        "[INFO] Saved {} tensors to {}",
        saved.tensors,
        args.mlx_path.display()
    )?;
    Ok(())
}

fn main() -> ExitCode {
    let code = match run(Args::parse()) {
        Ok(()) => 0,
        Err(e) => mlx_bins::error_exit_code(&e, "mlx-dwq: "),
    };
    mlx_bins::exit(code)
}

//! `mlx-lora`: mlx-lm's `mlx_lm.lora` (LoRA, DoRA or full fine-tuning, and testing
//! saved adapters), with its flags, `-c/--config` YAML, defaults, printed report and
//! adapter files. Options this build cannot honour are refused with a message.
use anyhow::{Context, Result};
use clap::Parser;
use mlx_train::config::{parse_size, LoraArgs};
use mlx_train::pyval::PyVal;
use std::process::ExitCode;

/// LoRA or QLoRA finetuning.
#[derive(Parser, Debug)]
#[command(
    name = "mlx-lora",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// The path to the local model directory or Hugging Face repo.
    #[arg(long)]
    model: Option<String>,
    /// Do training
    #[arg(long)]
    train: bool,
    /// Directory with {train, valid, test}.jsonl files or the name of a Hugging Face
    /// dataset (e.g., 'mlx-community/wikisql')
    #[arg(long)]
    data: Option<String>,
    /// Type of fine-tuning to perform: lora, dora, or full.
    #[arg(long, value_parser = ["lora", "dora", "full"])]
    fine_tune_type: Option<String>,
    /// Optimizer to use for training: adam, adamw, sgd, or adafactor.
    #[arg(long, value_parser = ["adam", "adamw", "muon", "sgd", "adafactor"])]
    optimizer: Option<String>,
    /// Mask the prompt in the loss when training
    #[arg(long)]
    mask_prompt: bool,
    /// Number of layers to fine-tune. Default is 16, use -1 for all.
    #[arg(long, allow_negative_numbers = true)]
    num_layers: Option<i64>,
    /// Minibatch size.
    #[arg(long)]
    batch_size: Option<i64>,
    /// Iterations to train for.
    #[arg(long)]
    iters: Option<i64>,
    /// Number of validation batches, -1 uses the entire validation set.
    #[arg(long, allow_negative_numbers = true)]
    val_batches: Option<i64>,
    /// Adam learning rate.
    #[arg(long)]
    learning_rate: Option<f64>,
    /// Number of training steps between loss reporting.
    #[arg(long)]
    steps_per_report: Option<i64>,
    /// Number of training steps between validations.
    #[arg(long)]
    steps_per_eval: Option<i64>,
    /// Number of steps to accumulate before each optimizer update.
    #[arg(long)]
    grad_accumulation_steps: Option<i64>,
    /// Load path to resume training from the given fine-tuned weights.
    #[arg(long)]
    resume_adapter_file: Option<String>,
    /// Save/load path for the fine-tuned weights.
    #[arg(long)]
    adapter_path: Option<String>,
    /// Save the model every N iterations.
    #[arg(long)]
    save_every: Option<i64>,
    /// Evaluate on the test set after training
    #[arg(long)]
    test: bool,
    /// Number of test set batches, -1 uses the entire test set.
    #[arg(long, allow_negative_numbers = true)]
    test_batches: Option<i64>,
    /// Maximum sequence length.
    #[arg(long)]
    max_seq_length: Option<i64>,
    /// A YAML configuration file with the training options
    #[arg(short = 'c', long)]
    config: Option<String>,
    /// Use gradient checkpointing to reduce memory use (not supported yet: refused).
    #[arg(long)]
    grad_checkpoint: bool,
    /// Clear the allocator cache between steps if it grows too large.
    #[arg(long, default_value = "0")]
    clear_cache_threshold: String,
    /// Services to report logs to ('wandb', 'swanlab'): refused (no network); reports
    /// go to `<adapter-path>/metrics.jsonl`.
    #[arg(long)]
    report_to: Option<String>,
    /// Project name for logging. Defaults to the name of the root directory.
    #[arg(long)]
    project_name: Option<String>,
    /// The PRNG seed
    #[arg(long)]
    seed: Option<i64>,
    /// Enable trusting remote code for tokenizer/model loading (accepted; meaningless
    /// here).
    #[arg(long)]
    trust_remote_code: bool,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[]));
    mlx_bins::run(|| lora(args))
}

/// The flags given, as mlx-lm's namespace holds them.
fn given(a: &Args) -> Result<Vec<(String, PyVal)>> {
    let mut out: Vec<(String, PyVal)> = Vec::new();
    let mut s = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            out.push((k.into(), PyVal::Str(v.clone())));
        }
    };
    s("model", &a.model);
    s("data", &a.data);
    s("fine_tune_type", &a.fine_tune_type);
    s("optimizer", &a.optimizer);
    s("resume_adapter_file", &a.resume_adapter_file);
    s("adapter_path", &a.adapter_path);
    s("config", &a.config);
    s("report_to", &a.report_to);
    s("project_name", &a.project_name);
    for (k, v) in [
        ("num_layers", a.num_layers),
        ("batch_size", a.batch_size),
        ("iters", a.iters),
        ("val_batches", a.val_batches),
        ("steps_per_report", a.steps_per_report),
        ("steps_per_eval", a.steps_per_eval),
        ("grad_accumulation_steps", a.grad_accumulation_steps),
        ("save_every", a.save_every),
        ("test_batches", a.test_batches),
        ("max_seq_length", a.max_seq_length),
        ("seed", a.seed),
    ] {
        if let Some(v) = v {
            out.push((k.into(), PyVal::Int(v)));
        }
    }
    if let Some(lr) = a.learning_rate {
        out.push(("learning_rate".into(), PyVal::Float(lr)));
    }
    for (k, v) in [
        ("train", a.train),
        ("mask_prompt", a.mask_prompt),
        ("test", a.test),
        ("grad_checkpoint", a.grad_checkpoint),
    ] {
        if v {
            out.push((k.into(), PyVal::Bool(true)));
        }
    }
    let size = parse_size(&a.clear_cache_threshold).context("--clear-cache-threshold")?;
    out.push(("clear_cache_threshold".into(), PyVal::Int(size as i64)));
    out.push(("trust_remote_code".into(), PyVal::Bool(a.trust_remote_code)));
    Ok(out)
}

fn lora(a: Args) -> Result<()> {
    let cli = given(&a)?;
    let text = match &a.config {
        Some(p) => {
            println!("Loading configuration file {p}");
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?)
        }
        None => None,
    };
    let config = a
        .config
        .as_deref()
        .zip(text.as_deref())
        .map(|(p, t)| (std::path::Path::new(p), t));
    let mut args = LoraArgs::merge(cli, config)?;
    let plan = mlx_train::run::plan(&args)?;
    // Training differentiates through every op: our CPU matmul primitives give the
    // forward's bits, but MLX's own ops give its gradients' summation order.
    mlx_array::fast::set_cpu_gemv(false);
    println!("Loading pretrained model");
    let model_arg = args.str("model")?;
    let path = mlx_hub::resolve_model(Some(&model_arg))?;
    let opts = mlx_models::LoadOptions {
        dequantize: false,
        unfused: true,
        ..Default::default()
    };
    let (mut model, _) = mlx_models::load_model_with(&path, &opts)
        .with_context(|| format!("loading the model in {}", path.display()))?;
    let tokenizer = mlx_tokenizer::Tokenizer::from_dir(&path)
        .with_context(|| format!("loading the tokenizer in {}", path.display()))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Hugging Face datasets (`hf_dataset`, or a dataset id as --data) come from the
    // Hub cache, downloaded when missing.
    let hub = |repo: &str| -> std::result::Result<std::path::PathBuf, String> {
        mlx_hub::Locations::from_env()
            .and_then(|l| l.hub_dataset(repo, "main"))
            .map_err(|e| e.to_string())
    };
    mlx_train::run::run(
        &mut args,
        &plan,
        model.as_mut(),
        &tokenizer,
        Some(&hub),
        &mut out,
    )?;
    Ok(())
}

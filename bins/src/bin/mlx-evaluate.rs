//! `mlx-evaluate`: mlx-lm's `mlx_lm.evaluate`, with the same flags, defaults and output
//! file. The tasks run in Python's lm-evaluation-harness (the installed `lm_eval`
//! package); its scoring and generation requests are answered by our engine
//! (`mlx_eval::harness`). `--include-path` (ours) adds local task definitions.
use anyhow::{Context, Result};
use clap::{ArgAction, Parser};
use mlx_bins::load::{load, LoadArgs};
use mlx_bins::outln;
use mlx_eval::harness::{run_harness, HarnessOptions};
use std::path::PathBuf;
use std::process::ExitCode;

/// Evaluate an MLX model using lm-evaluation-harness.
#[derive(Parser, Debug)]
#[command(
    name = "mlx-evaluate",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// Model to evaluate
    #[arg(long)]
    model: String,
    /// Tasks to run
    #[arg(long, num_args = 1.., required = true)]
    tasks: Vec<String>,
    /// Output directory for result files.
    #[arg(long, default_value = ".")]
    output_dir: PathBuf,
    /// Maximum number of sequences processed at once when scoring (mlx-lm 0.32.2's
    /// default is 8; it also batches generation, which here runs one request at a time)
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Number of shots
    #[arg(long)]
    num_shots: Option<i64>,
    /// Maximum number of tokens to generate. When set, this value takes precedence over
    /// task specific defaults.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Limit the number of examples per task.
    #[arg(long)]
    limit: Option<i64>,
    /// Random seed.
    #[arg(long, default_value_t = 123)]
    seed: u64,
    /// Whether to provide the fewshot examples as a multiturn conversation or a single
    /// user turn.
    #[arg(long)]
    fewshot_as_multiturn: bool,
    /// Apply the chat template to the prompt (default: when the model has one).
    #[arg(long, action = ArgAction::SetTrue, overrides_with = "no_apply_chat_template")]
    apply_chat_template: bool,
    /// Do not apply the chat template.
    #[arg(long, action = ArgAction::SetTrue)]
    no_apply_chat_template: bool,
    /// A JSON object of arguments for the tokenizer's apply_chat_template, e.g.
    /// '{"enable_thinking":false}'
    #[arg(long, default_value = "{}")]
    chat_template_args: String,
    /// Confirm that you want to run tasks that execute untrusted code.
    #[arg(long)]
    confirm_run_unsafe_code: bool,
    /// Enable trusting remote code for tokenizer (accepted; meaningless here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Sampling temperature
    #[arg(long, default_value_t = 0.0)]
    temp: f64,
    /// Sampling top-p
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Sampling top-k
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Directory of local lm_eval task definitions (YAML), added to the harness's tasks.
    #[arg(long)]
    include_path: Option<String>,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
    /// Python interpreter with lm_eval installed [default: $MLX_EVAL_PYTHON, else python3]
    #[arg(long)]
    python: Option<String>,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[]));
    mlx_bins::run(|| evaluate(args))
}

fn evaluate(args: Args) -> Result<()> {
    let chat_template_args: serde_json::Value = serde_json::from_str(&args.chat_template_args)
        .context("--chat-template-args must be a JSON object")?;
    let serde_json::Value::Object(chat_template_args) = chat_template_args else {
        anyhow::bail!("--chat-template-args must be a JSON object, got {chat_template_args}");
    };
    if args.batch_size == 0 {
        anyhow::bail!("--batch-size must be at least 1");
    }
    std::fs::create_dir_all(&args.output_dir)
        .with_context(|| format!("creating {}", args.output_dir.display()))?;
    mlx_array::random::seed(args.seed)?;
    let loaded = load(&LoadArgs {
        model: Some(&args.model),
        cpu_weights: args.cpu_weights,
        adapter_path: None,
    })?;
    let use_chat_template = if args.apply_chat_template {
        true
    } else if args.no_apply_chat_template {
        false
    } else {
        loaded.tokenizer.has_chat_template()
    };
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var("MLX_EVAL_PYTHON").ok())
        .unwrap_or_else(|| "python3".into());
    let opts = HarnessOptions {
        python,
        tasks: args.tasks.clone(),
        num_shots: args.num_shots,
        limit: args.limit,
        seed: args.seed,
        fewshot_as_multiturn: args.fewshot_as_multiturn,
        use_chat_template,
        chat_template_args,
        confirm_run_unsafe_code: args.confirm_run_unsafe_code,
        max_tokens: args.max_tokens,
        batch_size: args.batch_size,
        temp: args.temp,
        top_p: args.top_p,
        top_k: args.top_k,
        include_path: args.include_path.clone(),
        tokenizer_name: args.model.replace('/', "__"),
    };
    let results = run_harness(loaded.model, &loaded.tokenizer, &opts)?;

    let mut keys = vec![
        "eval".to_string(),
        args.model.replace('/', "_"),
        results.lm_eval_version.clone(),
    ];
    if let Some(n) = args.num_shots {
        keys.push(format!("{n:02}"));
    }
    keys.extend(args.tasks.iter().cloned());
    let path = args.output_dir.join(keys.join("_"));
    std::fs::write(&path, &results.text).with_context(|| format!("writing {}", path.display()))?;
    outln!("Results:")?;
    for r in &results.each {
        outln!("{r}")?;
    }
    Ok(())
}

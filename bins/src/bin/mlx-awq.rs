//! `mlx-awq`: mlx-lm's `mlx_lm.awq` (activation-aware weight quantization), with its
//! flags and defaults.
//!
//! mlx-lm calibrates on a text file it downloads into `~/.cache/mlx-lm/calibration_v5.txt`;
//! that file is used when it is there, else `--data FILE` (ours) or a small built-in text.
use anyhow::Result;
use clap::Parser;
use mlx_bins::calibration::load_calibration;
use mlx_bins::outln;
use mlx_quant::awq::{awq_quantize, AwqOptions};
use mlx_quant::model::load;
use mlx_quant::{resolve_source, save_model_over};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Activation-aware weight quantization
#[derive(Parser, Debug)]
#[command(name = "mlx-awq", version)]
struct Args {
    /// The model: a local directory, a Hugging Face repo id in the local HF cache, or a
    /// .gguf file.
    #[arg(
        long,
        short = 'm',
        default_value = "mlx-community/Qwen2.5-7B-Instruct-bf16"
    )]
    model: String,
    /// Path to save the model
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Quantization bits of the transformer blocks' projections
    #[arg(long, default_value_t = 4)]
    bits: i32,
    /// Quantization group size of the transformer blocks' projections
    #[arg(long, default_value_t = 64)]
    group_size: i32,
    /// Quantization bits of the embedding and the output head
    #[arg(long, default_value_t = 4)]
    embed_bits: i32,
    /// Quantization group size of the embedding and the output head
    #[arg(long, default_value_t = 32)]
    embed_group_size: i32,
    /// Number of calibration sequences (-1 for all).
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    num_samples: i64,
    /// Tokens of each calibration sequence.
    #[arg(long, default_value_t = 512)]
    sequence_length: usize,
    /// Points of the scale and clipping searches.
    #[arg(long, default_value_t = 20)]
    n_grid: usize,
    /// Random seed (shuffles the calibration sequences).
    #[arg(long, default_value_t = 123)]
    seed: u64,
    /// Enable trusting remote code for tokenizer/model loading (accepted; no Python code
    /// from a model repository is ever run here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Calibration text file (ours). Default: mlx-lm's downloaded calibration file when
    /// it is in ~/.cache/mlx-lm, else a small built-in text.
    #[arg(long)]
    data: Option<PathBuf>,
}

fn run(args: Args) -> Result<()> {
    let opts = AwqOptions {
        bits: args.bits,
        group_size: args.group_size,
        embed_bits: args.embed_bits,
        embed_group_size: args.embed_group_size,
        n_grid: args.n_grid,
    };
    opts.validate()?;
    let source = resolve_source(&args.model, &args.mlx_path)?;
    let mut model = load(&source.dir, true)?;
    let data = load_calibration(
        &source.dir,
        args.data.as_ref(),
        args.sequence_length,
        args.seed,
        args.num_samples,
    )?;
    awq_quantize(&mut model, &data, &opts, &mut |i, n, ratio, fell_back| {
        let _ = writeln!(std::io::stdout(), "Loss reduction: {ratio}");
        if fell_back {
            let _ = writeln!(
                std::io::stdout(),
                "Loss is not reduced, falling back to original weights."
            );
        }
        eprint!("\rLayers: {i}/{n}");
        if i == n {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    })?;
    let (saved, _) = save_model_over(&args.mlx_path, model, &source, 5 << 30, true)?;
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
        Err(e) => mlx_bins::error_exit_code(&e, "mlx-awq: "),
    };
    mlx_bins::exit(code)
}

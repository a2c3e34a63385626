//! `mlx-gptq`: mlx-lm's `mlx_lm.gptq`, with its flags and defaults.
//!
//! mlx-lm calibrates on a text file it downloads into `~/.cache/mlx-lm/calibration_v5.txt`;
//! that file is used when it is there, else `--data FILE` (ours) or a small built-in text.
use anyhow::Result;
use clap::Parser;
use mlx_bins::calibration::load_calibration;
use mlx_bins::outln;
use mlx_quant::gptq::{gptq_quantize, GptqOptions};
use mlx_quant::model::load;
use mlx_quant::{resolve_source, save_model_over};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// GPTQ quantization
#[derive(Parser, Debug)]
#[command(name = "mlx-gptq", version)]
struct Args {
    /// The model: a local directory, a Hugging Face repo id in the local HF cache, or a
    /// .gguf file.
    #[arg(long, short = 'm', default_value = "Qwen/Qwen3-0.6B-base")]
    model: String,
    /// Path to save the model
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Quantization bits for GPTQ layers
    #[arg(long, default_value_t = 4)]
    bits: i32,
    /// Quantization group size for GPTQ layers
    #[arg(long, default_value_t = 64)]
    group_size: i32,
    /// Quantization bits for non-GPTQ layers
    #[arg(long, default_value_t = 6)]
    fallback_bits: i32,
    /// Quantization group size for non-GPTQ layers
    #[arg(long, default_value_t = 64)]
    fallback_group_size: i32,
    /// Number of samples from the calibration dataset, use -1 for all.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    num_samples: i64,
    /// Sequence length for the calibration data.
    #[arg(long, default_value_t = 512)]
    sequence_length: usize,
    /// Random seed (shuffles the calibration sequences).
    #[arg(long, default_value_t = 123)]
    seed: u64,
    /// Enable trusting remote code for tokenizer/model loading (accepted; no Python code
    /// from a model repository is ever run here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Accumulate the Hessians from float32 products (ours; mlx-lm multiplies in the
    /// model's dtype, which for bfloat16 or float16 models loses most of each entry's
    /// precision or overflows).
    #[arg(long)]
    hessian_float32: bool,
    /// Calibration text file (ours). Default: mlx-lm's downloaded calibration file when
    /// it is in ~/.cache/mlx-lm, else a small built-in text.
    #[arg(long)]
    data: Option<PathBuf>,
}

fn run(args: Args) -> Result<()> {
    let opts = GptqOptions {
        bits: args.bits,
        group_size: args.group_size,
        fallback_bits: args.fallback_bits,
        fallback_group_size: args.fallback_group_size,
        hessian_float32: args.hessian_float32,
        ..Default::default()
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
    let bpw = gptq_quantize(&mut model, &data, &opts, &mut |phase, i, n| {
        eprint!("\r{phase}: {i}/{n}");
        if i == n {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    })?;
    outln!("Quantized model with {bpw:.3} bits per weight.")?;
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
        Err(e) => mlx_bins::error_exit_code(&e, "mlx-gptq: "),
    };
    mlx_bins::exit(code)
}

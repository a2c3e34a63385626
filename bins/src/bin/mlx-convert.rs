//! `mlx-convert`: mlx-lm's `mlx_lm.convert`, with its flags and defaults.
use anyhow::Result;
use clap::Parser;
use mlx_array::quant::QuantMode;
use mlx_array::Dtype;
use mlx_bins::outln;
use mlx_quant::{convert, ConvertOptions, Recipe};
use std::path::PathBuf;
use std::process::ExitCode;

/// Convert Hugging Face model to MLX format
#[derive(Parser, Debug)]
#[command(name = "mlx-convert", version)]
struct Args {
    /// Path to the model: a local directory, a Hugging Face repo id in the local HF cache,
    /// or a .gguf file. Default: the embedded SmolLM2-135M-Instruct.
    #[arg(long = "hf-path", visible_alias = "model")]
    hf_path: Option<String>,
    /// Path to save the MLX model.
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Generate a quantized model.
    #[arg(short = 'q', long)]
    quantize: bool,
    /// Group size for quantization.
    #[arg(long)]
    q_group_size: Option<i32>,
    /// Bits per weight for quantization.
    #[arg(long)]
    q_bits: Option<i32>,
    /// The quantization mode.
    #[arg(long, default_value = "affine", value_parser = ["affine", "mxfp4", "nvfp4", "mxfp8"])]
    q_mode: String,
    /// Mixed-bit quantization recipe.
    #[arg(long, value_parser = ["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"])]
    quant_predicate: Option<String>,
    /// Type to save the non-quantized parameters. Defaults to config.json's `torch_dtype`
    /// or the current model weights dtype.
    #[arg(long, value_parser = ["float16", "bfloat16", "float32"])]
    dtype: Option<String>,
    /// The Hugging Face repo to upload the model to.
    #[arg(long)]
    upload_repo: Option<String>,
    /// Dequantize a quantized model.
    #[arg(short = 'd', long)]
    dequantize: bool,
    /// Trust remote code when loading tokenizer (accepted for compatibility: no Python
    /// code from a model repository is ever run here, so it changes nothing).
    #[arg(long)]
    trust_remote_code: bool,
}

fn run(args: Args) -> Result<()> {
    if let Some(repo) = &args.upload_repo {
        // A bad repo id fails before the conversion, not after it.
        mlx_hub::RepoId::new(repo, mlx_hub::RepoType::Model)?;
    }
    if args.trust_remote_code {
        eprintln!(
            "[INFO] --trust-remote-code has no effect: mlx-convert never runs Python code \
             from a model repository"
        );
    }
    let hf_path = match args.hf_path {
        Some(p) => p,
        None => mlx_hub::default_model()?.to_string_lossy().into_owned(),
    };
    let opts = ConvertOptions {
        hf_path,
        mlx_path: args.mlx_path,
        quantize: args.quantize,
        q_group_size: args.q_group_size,
        q_bits: args.q_bits,
        q_mode: QuantMode::parse(&args.q_mode)?,
        quant_predicate: args
            .quant_predicate
            .as_deref()
            .map(Recipe::parse)
            .transpose()?,
        dtype: args.dtype.as_deref().and_then(Dtype::from_name),
        dequantize: args.dequantize,
        verbose: true,
        ..Default::default()
    };
    let report = convert(&opts)?;
    outln!(
        "[INFO] Saved {} tensors in {} shard(s) to {}",
        report.weights.tensors,
        report.weights.shards.len(),
        report.out_dir.display()
    )?;
    if let Some(repo) = &args.upload_repo {
        let url = mlx_hub::hub::upload::upload_to_hub(&report.out_dir, repo)?;
        outln!("Upload successful, go to {url} for details.")?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let code = match run(Args::parse()) {
        Ok(()) => 0,
        Err(e) => mlx_bins::error_exit_code(&e, "mlx-convert: "),
    };
    mlx_bins::exit(code)
}

//! `mlx-dynamic-quant`: mlx-lm's `mlx_lm.dynamic_quant`, with its flags and defaults.
//!
//! mlx-lm calibrates on a text file it downloads; that is not possible here, so the
//! calibration text is a small built-in one (about 2,000 tokens) or `--data FILE`.
use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_array::quant::QuantMode;
use mlx_array::Dtype;
use mlx_bins::outln;
use mlx_quant::dynamic::{
    calibration_data, estimate_sensitivities, estimate_threshold, perplexity, threshold_predicate,
    BitChoices, CALIBRATION_TEXT,
};
use mlx_quant::model::{load, quantize_model, QuantArgs};
use mlx_quant::{convert::save_converted, resolve_source};
use mlx_tokenizer::Tokenizer;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// Sensitivity-based mixed-bit quantization
#[derive(Parser, Debug)]
#[command(name = "mlx-dynamic-quant", version)]
struct Args {
    /// The model: a local directory, a Hugging Face repo id in the local HF cache, or a
    /// .gguf file.
    #[arg(long, short = 'm', default_value = "Qwen/Qwen3-0.6B-base")]
    model: String,
    /// Path to save the model
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Random seed (shuffles the calibration sequences).
    #[arg(long, default_value_t = 123)]
    seed: u64,
    /// Path to a pre-computed sensitivity JSON file.
    #[arg(long)]
    sensitivities: Option<PathBuf>,
    /// Target bits per weight.
    #[arg(long, default_value_t = 5.0)]
    target_bpw: f64,
    #[arg(long, default_value_t = 4)]
    low_bits: i32,
    #[arg(long, default_value_t = 64)]
    low_group_size: i32,
    #[arg(long, default_value_t = 5)]
    high_bits: i32,
    #[arg(long, default_value_t = 64)]
    high_group_size: i32,
    /// Compute the perplexity of the base and quantized models.
    #[arg(long)]
    report_ppl: bool,
    /// Use gradient checkpointing to reduce memory use (accepted; not implemented here,
    /// so it changes nothing).
    #[arg(long)]
    grad_checkpoint: bool,
    /// What type to use to accumulate the gradients for the sensitivities
    #[arg(long, default_value = "float32", value_parser = ["float32", "bfloat16"])]
    accumulation_dtype: String,
    /// Enable trusting remote code for tokenizer/model loading (accepted; no Python code
    /// from a model repository is ever run here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Calibration text file (ours: mlx-lm downloads its calibration text, which is not
    /// possible here). Default: a small built-in text.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Tokens per calibration sequence (mlx-lm: 512).
    #[arg(long, default_value_t = 512)]
    sequence_length: usize,
}

fn run(args: Args) -> Result<()> {
    if args.grad_checkpoint {
        eprintln!("[INFO] --grad-checkpoint is accepted but not implemented: no effect");
    }
    if args.mlx_path.exists() {
        bail!(
            "cannot save to the path {} as it already exists",
            args.mlx_path.display()
        );
    }
    let bits = BitChoices {
        low_bits: args.low_bits,
        low_group_size: args.low_group_size,
        high_bits: args.high_bits,
        high_group_size: args.high_group_size,
    };
    let source = resolve_source(&args.model, &args.mlx_path)?;
    let mut model = load(&source.dir, false)?;
    let tokenizer = Tokenizer::from_dir(&source.dir)
        .with_context(|| format!("loading the tokenizer in {}", source.dir.display()))?;
    let text = match &args.data {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => {
            outln!(
                "[INFO] Calibrating on the built-in text (mlx-lm's calibration file cannot be \
                 downloaded here; pass --data FILE for your own)"
            )?;
            CALIBRATION_TEXT.to_string()
        }
    };
    let tokens = tokenizer.encode(&text, true)?;
    let data = calibration_data(&tokens, args.sequence_length, args.seed, 0)?;
    outln!(
        "[INFO] Calibration data: {} sequences of {} tokens",
        data.dim(0)?,
        args.sequence_length
    )?;

    let sensitivities: Vec<(String, f64)> = match &args.sensitivities {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let v: Vec<(String, f64)> = serde_json::from_str(&text).with_context(|| {
                format!("{}: expected [[layer, sensitivity], ...]", p.display())
            })?;
            v
        }
        None => {
            let acc = Dtype::from_name(&args.accumulation_dtype).unwrap_or(Dtype::Float32);
            let s = estimate_sensitivities(&mut model, &data, bits, 4, acc, |i, n| {
                eprint!("\rEstimating sensitivities: {i}/{n}");
            })?;
            eprintln!();
            let name = format!("{}_sensitivities.json", args.model.replace('/', "_"));
            let json: Vec<Value> = s.iter().map(|(k, v)| serde_json::json!([k, v])).collect();
            std::fs::write(&name, serde_json::to_string(&json)?)
                .with_context(|| format!("writing {name}"))?;
            outln!("[INFO] Wrote {name}")?;
            s
        }
    };
    let sensitivities: BTreeMap<String, f64> = sensitivities.into_iter().collect();

    let base_ppl = if args.report_ppl {
        let ppl = perplexity(model.model.as_ref(), &data, 8)?;
        outln!("Original PPL: {ppl:.3}")?;
        Some(ppl)
    } else {
        None
    };
    let threshold = estimate_threshold(&mut model, &sensitivities, args.target_bpw, bits)?;
    let high = sensitivities.values().filter(|s| **s > threshold).count();
    outln!(
        "[INFO] Threshold {threshold:.6}: {high} of {} layers at {} bits",
        sensitivities.len(),
        bits.high_bits
    )?;
    let mut predicate = threshold_predicate(sensitivities, threshold, bits);
    let quant = QuantArgs {
        group_size: Some(bits.low_group_size),
        bits: Some(bits.low_bits),
        mode: QuantMode::Affine,
    };
    let bpw = quantize_model(&mut model, quant, &mut predicate)?;
    outln!("[INFO] Quantized model with {bpw:.3} bits per weight.")?;
    if let Some(base) = base_ppl {
        let ppl = perplexity(model.model.as_ref(), &data, 8)?;
        outln!("Quantized PPL: {ppl:.3}")?;
        outln!(
            "[INFO] Perplexity change: {:+.3} ({:+.2}%)",
            ppl - base,
            (ppl / base - 1.0) * 100.0
        )?;
    }
    let (saved, _) = save_converted(&args.mlx_path, model, &source, 5 << 30, true)?;
    outln!(
        "[INFO] Saved {} tensors to {} (target {:.3} bpw, achieved {bpw:.3})",
        saved.tensors,
        args.mlx_path.display(),
        args.target_bpw
    )?;
    Ok(())
}

fn main() -> ExitCode {
    let code = match run(Args::parse()) {
        Ok(()) => 0,
        Err(e) => mlx_bins::error_exit_code(&e, "mlx-dynamic-quant: "),
    };
    mlx_bins::exit(code)
}

//! `mlx-fuse`: mlx-lm's `mlx_lm.fuse`: folds trained adapters (LoRA, DoRA or a full
//! fine-tune, as `mlx_lm.lora` writes them) into the base model and saves the result.
//! Same flags and defaults; `--upload-repo` uploads the result (`mlx_lm.upload`);
//! `--export-gguf` also writes the fused model as one GGUF file in the save path
//! (`mlx_gguf::export`: Llama, Mistral and Mixtral, unquantized, as mlx-lm writes it).
use anyhow::Result;
use clap::Parser;
use mlx_bins::outln;
use std::path::PathBuf;
use std::process::ExitCode;

/// Fuse fine-tuned adapters into the base model.
#[derive(Parser, Debug)]
#[command(
    name = "mlx-fuse",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// The path to the local model directory or Hugging Face repo (in the local cache).
    #[arg(long, default_value = "mlx_model")]
    model: String,
    /// The path to save the fused model.
    #[arg(long, default_value = "fused_model")]
    save_path: PathBuf,
    /// Path to the trained adapter weights and config.
    #[arg(long, default_value = "adapters")]
    adapter_path: PathBuf,
    /// The Hugging Face repo to upload the model to.
    #[arg(long)]
    upload_repo: Option<String>,
    /// Generate a dequantized model.
    #[arg(long)]
    dequantize: bool,
    /// Export model weights in GGUF format.
    #[arg(long)]
    export_gguf: bool,
    /// Path to save the exported GGUF format model weights.
    #[arg(long, default_value = "ggml-model-f16.gguf")]
    gguf_path: String,
    /// Enable trusting remote code for tokenizer/model loading (accepted; no code is run).
    #[arg(long)]
    trust_remote_code: bool,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[]));
    mlx_bins::run(|| fuse(args))
}

fn fuse(args: Args) -> Result<()> {
    if let Some(repo) = &args.upload_repo {
        mlx_hub::RepoId::new(repo, mlx_hub::RepoType::Model)?;
    }
    let _ = args.trust_remote_code;
    outln!("Loading pretrained model")?;
    let source = mlx_quant::resolve_source(&args.model, &args.save_path)?;
    let adapters = mlx_train::Adapters::load(&args.adapter_path)?;
    let mut model = mlx_quant::model::load(&source.dir, true)?;
    if args.dequantize {
        outln!("Dequantizing model")?;
    }
    let report = mlx_train::fuse_adapters(&mut model, &adapters, args.dequantize)?;
    tracing::info!(
        layers = report.layers.len(),
        kind = adapters.config.fine_tune_type.name(),
        "adapters fused"
    );
    // What the export needs, taken before the save consumes the model: the parameters in
    // the model's module order (mlx-lm's `tree_flatten(model.parameters())`) and the
    // config as mlx-lm's `save_config` leaves it (it drops `_name_or_path` in place).
    let export = if args.export_gguf {
        let mut config = model.config.clone();
        config.remove("_name_or_path");
        Some((model.module()?.parameters(), config))
    } else {
        None
    };
    mlx_quant::save_model_over(
        &args.save_path,
        model,
        &source,
        mlx_quant::save::MAX_SHARD_BYTES,
        false,
    )?;
    if let Some((weights, config)) = export {
        mlx_gguf::export::check_exportable(&config)?;
        outln!("Converting to GGUF format")?;
        let path = args.save_path.join(&args.gguf_path);
        mlx_gguf::export::export_gguf(&args.save_path, weights, &config, &path)?;
        outln!("Converted GGUF model saved as: {}", path.display())?;
    }
    if let Some(repo) = &args.upload_repo {
        let url = mlx_hub::hub::upload::upload_to_hub(&args.save_path, repo)?;
        outln!("Upload successful, go to {url} for details.")?;
    }
    Ok(())
}

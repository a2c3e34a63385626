//! `mlx-upload`: mlx-lm's `mlx_lm.upload`: writes mlx-lm's model card into the model
//! directory's README.md, creates the Hugging Face repo and uploads the directory
//! through the Hub's commit API (LFS for large files). `HF_TOKEN` or the token file
//! authenticates; `HF_ENDPOINT` picks the Hub.
use anyhow::{bail, Result};
use clap::Parser;
use mlx_bins::outln;
use std::path::PathBuf;
use std::process::ExitCode;

/// Upload a model to the Hugging Face Hub.
#[derive(Parser, Debug)]
#[command(
    name = "mlx-upload",
    version,
    infer_long_args = true,
    args_override_self = true
)]
struct Args {
    /// Path to the MLX model.
    #[arg(long, default_value = "mlx_model")]
    path: PathBuf,
    /// The Hugging Face repo to upload the model to.
    #[arg(long)]
    upload_repo: Option<String>,
}

fn main() -> ExitCode {
    mlx_bins::init_logging(None);
    let args = Args::parse_from(mlx_bins::normalized_args(&[]));
    mlx_bins::run(|| upload(args))
}

fn upload(args: Args) -> Result<()> {
    let Some(repo) = args.upload_repo else {
        bail!("--upload-repo is required: the Hugging Face repo (`org/name`) to upload to");
    };
    if !args.path.is_dir() {
        bail!("{}: not a model directory", args.path.display());
    }
    let url = mlx_hub::hub::upload::upload_to_hub(&args.path, &repo)?;
    outln!("Upload successful, go to {url} for details.")?;
    Ok(())
}

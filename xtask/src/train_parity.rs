//! The training section of `cargo xtask parity`: `mlx-lora` against `mlx_lm lora`.
//!
//! The comparisons live in `bins/tests/lora.rs` (xtask/py/lora_oracle.py runs mlx-lm's
//! side): every fine-tune type and optimizer, `--mask-prompt`, gradient accumulation and
//! checkpointing, a quantized base, an MoE, Hugging Face datasets, each case's printed
//! losses and saved adapter files against mlx-lm's byte for byte (docs/parity.md,
//! "Fine-tuning"). This section runs those tests together with the ones `cargo nextest`
//! leaves out by default for CI time: `--grad-checkpoint` on every dense tiny checkpoint
//! of goldens/models. `cargo xtask test` runs the parity without this section, since its
//! nextest run already covers the default cases.
use anyhow::{bail, Result};
use std::path::Path;
use std::process::Command;

/// The tests of `bins/tests/lora.rs` that compare with mlx-lm.
const CASES: &[&str] = &[
    "training_matches_mlx_lm",
    "grad_checkpoint_on_every_architecture_matches_mlx_lm",
    "hugging_face_datasets_train_like_their_local_rows",
    "the_dequantized_product_trains_like_the_quantized_one",
];

/// Runs the section (`--train-only`: alone).
pub fn run(root: &Path) -> Result<()> {
    let python = crate::parity::python(root)?;
    let filter = CASES
        .iter()
        .map(|c| format!("test(={c})"))
        .collect::<Vec<_>>()
        .join(" | ");
    eprintln!(
        "\n==> training parity: mlx-lora vs mlx_lm lora ({} tests)",
        CASES.len()
    );
    let status = Command::new("cargo")
        .args(["nextest", "run", "-p", "mlx-bins", "--test", "lora"])
        .args(["--run-ignored", "all", "--no-fail-fast", "-E", &filter])
        .env("MLX_PYTHON", &python)
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("training parity: mlx-lora differs from mlx_lm lora (see the failures above)");
    }
    println!(
        "training parity: {} tests identical to mlx_lm lora",
        CASES.len()
    );
    Ok(())
}

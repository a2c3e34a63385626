//! The calibration rows of `mlx-gptq` and `mlx-awq` (mlx-lm's `quant.utils.load_data`
//! after `mx.random.seed(seed)` and `load`).
use anyhow::{Context, Result};
use mlx_array::Array;
use mlx_quant::dynamic::{calibration_data, CALIBRATION_TEXT};
use mlx_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

/// The calibration text and where it came from: `--data FILE` (ours), else mlx-lm's
/// downloaded `~/.cache/mlx-lm/calibration_v5.txt` when it is there, else a small
/// built-in text (mlx-lm's download needs the network).
pub fn calibration_text(data: Option<&PathBuf>) -> Result<(String, String)> {
    if let Some(p) = data {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        return Ok((text, p.display().to_string()));
    }
    let cached = std::env::var_os("HOME")
        .map(PathBuf::from)
        .map(|h| h.join(".cache/mlx-lm/calibration_v5.txt"))
        .filter(|p| p.is_file());
    if let Some(p) = cached {
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        return Ok((text, p.display().to_string()));
    }
    Ok((
        CALIBRATION_TEXT.to_string(),
        "the built-in text (mlx-lm's calibration file cannot be downloaded here; pass --data \
         FILE for your own)"
            .into(),
    ))
}

/// `[rows, sequence_length]` token ids of the calibration text, shuffled as mlx-lm's
/// command shuffles them: it seeds before `load`, whose model construction draws a key
/// for each initial weight of the model in `model_dir`, and permutes the rows after
/// those draws; the first `num_samples` rows when it is positive.
pub fn calibration_rows(
    model_dir: &Path,
    tokenizer: &Tokenizer,
    text: &str,
    sequence_length: usize,
    seed: u64,
    num_samples: i64,
) -> Result<Array> {
    let draws = mlx_models::model::mlx_lm_init_key_draws(model_dir).with_context(|| {
        format!(
            "counting the initial-weight draws of the model in {}",
            model_dir.display()
        )
    })?;
    let tokens = tokenizer.encode(text, true)?;
    let mut data = calibration_data(&tokens, sequence_length, seed, draws)?;
    if num_samples > 0 && num_samples < i64::from(data.dim(0)?) {
        data = data.slice_axis(0, 0, num_samples as i32)?;
    }
    Ok(data)
}

/// The rows `mlx-gptq` and `mlx-awq` calibrate on: the tokenizer of `model_dir`, the text
/// [`calibration_text`] picks, [`calibration_rows`]; where they came from and their
/// shape printed as mlx-lm's commands print them.
pub fn load_calibration(
    model_dir: &Path,
    data: Option<&PathBuf>,
    sequence_length: usize,
    seed: u64,
    num_samples: i64,
) -> Result<Array> {
    let tokenizer = Tokenizer::from_dir(model_dir)
        .with_context(|| format!("loading the tokenizer in {}", model_dir.display()))?;
    let (text, from) = calibration_text(data)?;
    crate::outln!("[INFO] Calibrating on {from}")?;
    let rows = calibration_rows(
        model_dir,
        &tokenizer,
        &text,
        sequence_length,
        seed,
        num_samples,
    )?;
    crate::outln!(
        "[INFO] Calibration data: {} sequences of {} tokens",
        rows.dim(0)?,
        sequence_length
    )?;
    Ok(rows)
}

//! `mlx_lm.perplexity`: sequences cut from shuffled dataset rows, then the mean
//! next-token cross-entropy over all of them, with mlx-lm's op sequence (same bits).
use crate::datasets::Dataset;
use crate::nprandom::RandomState;
use crate::{EvalError, Result};
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_models::LanguageModel;
use mlx_tokenizer::Tokenizer;

/// mlx-lm's `load_data`: rows in the order of `rng.permutation(len)`, tokenized and
/// concatenated until `num_samples * sequence_length` tokens (all rows when
/// `num_samples <= 0`), cut into `[samples, sequence_length]` int32 (a partial last
/// sequence is dropped). Where the rows run out first, mlx-lm fails with an
/// `IndexError`; here the samples the rows give are used, with a warning.
pub fn load_data(
    tok: &Tokenizer,
    dataset: &Dataset,
    num_samples: i64,
    sequence_length: usize,
    rng: &mut RandomState,
) -> Result<Array> {
    if sequence_length < 2 {
        return Err(EvalError::Invalid(format!(
            "--sequence-length must be at least 2 (a token and the one it predicts), got \
             {sequence_length}"
        )));
    }
    let perm = rng.permutation(dataset.len());
    // `None`: every row.
    let asked = usize::try_from(num_samples).ok().filter(|&n| n > 0);
    let wanted = asked.map(|n| n.saturating_mul(sequence_length));
    let mut data: Vec<i32> = Vec::new();
    for &i in &perm {
        if wanted.is_some_and(|w| data.len() >= w) {
            break;
        }
        let (ids, _) = dataset.process(i, tok)?;
        data.extend(ids.iter().map(|&t| t as i32));
    }
    let rows = data.len() / sequence_length;
    if rows == 0 {
        return Err(EvalError::Data(format!(
            "the dataset gives {} tokens, fewer than one sequence of {sequence_length}",
            data.len()
        )));
    }
    let rows = match asked {
        Some(n) if n > rows => {
            tracing::warn!(
                "the dataset gives {rows} sequences of {sequence_length} tokens, not the \
                 {n} asked for"
            );
            rows
        }
        Some(n) => n,
        None => rows,
    };
    data.truncate(rows * sequence_length);
    Ok(Array::from_slice(
        &data,
        &[rows as i32, sequence_length as i32],
    )?)
}

/// What [`eval_ppl`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perplexity {
    /// `exp(mean loss)`.
    pub ppl: f64,
    /// Its standard error (delta method: `ppl * std / sqrt(tokens)`).
    pub standard_error: f64,
    /// The mean next-token loss (float32, as mlx-lm reads it).
    pub mean_loss: f32,
    /// The losses' standard deviation (`ddof = 1`).
    pub std_dev: f32,
    /// Tokens scored: `samples * (sequence_length - 1)`.
    pub tokens: usize,
}

/// mlx-lm's `eval_ppl`: batches of `batch_size` sequences, logits of all but the last
/// position upcast to float32, `cross_entropy` against the next tokens. `progress` is
/// called with `(batches done, batches)` after each batch.
pub fn eval_ppl(
    model: &dyn LanguageModel,
    data: &Array,
    batch_size: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Perplexity> {
    if batch_size == 0 {
        return Err(EvalError::Invalid("--batch-size must be at least 1".into()));
    }
    let shape = data.shape();
    if shape.len() != 2 || shape[1] < 2 || shape[0] < 1 {
        return Err(EvalError::Invalid(format!(
            "perplexity data must be [samples, length >= 2], got {shape:?}"
        )));
    }
    let (n, len) = (shape[0], shape[1]);
    let batches = (n as usize).div_ceil(batch_size);
    let mut losses = Vec::with_capacity(batches);
    for (i, s) in (0..n).step_by(batch_size).enumerate() {
        let e = (s + batch_size as i32).min(n);
        let batch = data.slice(&[s, 0], &[e, len], None)?;
        let inputs = batch.slice(&[0, 0], &[e - s, len - 1], None)?;
        let targets = batch.slice(&[0, 1], &[e - s, len], None)?;
        let logits = model.forward(&inputs, &mut [])?.astype(Dtype::Float32)?;
        let loss = mlx_nn::losses::cross_entropy(&logits, &targets)?;
        transforms::eval(&[&loss])?;
        losses.push(loss.flatten(0, -1)?);
        progress(i + 1, batches);
    }
    let all = ops::concatenate(&losses.iter().collect::<Vec<_>>(), 0)?;
    let mean_loss: f32 = all.mean(None, false)?.item()?;
    let std_dev: f32 = all.var(None, false, 1)?.sqrt()?.item()?;
    let tokens = all.size();
    let ppl = f64::from(mean_loss).exp();
    let se = f64::from(std_dev) / (tokens as f64).sqrt();
    Ok(Perplexity {
        ppl,
        standard_error: ppl * se,
        mean_loss,
        std_dev,
        tokens,
    })
}

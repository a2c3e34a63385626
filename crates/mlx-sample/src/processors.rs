//! Logits processors: mlx-lm's `make_logits_processors` (logit bias, repetition,
//! presence and frequency penalties).
//!
//! Each processor gets the 1-D token history (prompt and generated tokens so far, as
//! mlx-lm's `generate_step` passes it) and the logits `[B, V]`, and returns new logits.
//! Reads and writes of `logits[:, tokens]` use the same gather/scatter MLX's Python
//! indexing builds, so results are bit-identical.
use crate::error::{Result, SampleError};
use crate::util::{column_scatter_args, last_tokens, py_float};
use mlx_array::{ops::ScatterKind, where_, Array, Dtype};

/// Rewrites the logits given the tokens so far.
pub trait LogitsProcessor: Send {
    /// `tokens` is 1-D, `logits` is `[B, V]`.
    fn process(&self, tokens: &Array, logits: &Array) -> Result<Array>;
}

impl<F> LogitsProcessor for F
where
    F: Fn(&Array, &Array) -> Result<Array> + Send,
{
    fn process(&self, tokens: &Array, logits: &Array) -> Result<Array> {
        self(tokens, logits)
    }
}

/// The arguments of mlx-lm's `make_logits_processors`, with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsParams {
    /// Additive bias per token id, in insertion order (mlx-lm's dict).
    pub logit_bias: Vec<(i32, f64)>,
    /// Sign-aware multiplicative penalty for recent tokens.
    pub repetition_penalty: Option<f64>,
    /// How many recent tokens the repetition penalty looks at.
    pub repetition_context_size: i32,
    /// Additive penalty for tokens present in the recent context.
    pub presence_penalty: Option<f64>,
    /// How many recent tokens the presence penalty looks at.
    pub presence_context_size: i32,
    /// Additive penalty per occurrence in the recent context.
    pub frequency_penalty: Option<f64>,
    /// How many recent tokens the frequency penalty looks at.
    pub frequency_context_size: i32,
}

impl Default for LogitsParams {
    fn default() -> Self {
        LogitsParams {
            logit_bias: Vec::new(),
            repetition_penalty: None,
            repetition_context_size: 20,
            presence_penalty: None,
            presence_context_size: 20,
            frequency_penalty: None,
            frequency_context_size: 20,
        }
    }
}

/// mlx-lm's `make_logits_processors`: the bias (if any), then the repetition, presence
/// and frequency penalties that are set and non-zero, in that order.
pub fn make_logits_processors(p: &LogitsParams) -> Result<Vec<Box<dyn LogitsProcessor>>> {
    let mut out: Vec<Box<dyn LogitsProcessor>> = Vec::new();
    if !p.logit_bias.is_empty() {
        out.push(Box::new(LogitBias::new(&p.logit_bias)?));
    }
    if let Some(pen) = p.repetition_penalty.filter(|&x| x != 0.0) {
        out.push(Box::new(RepetitionPenalty::new(
            pen,
            p.repetition_context_size,
        )?));
    }
    if let Some(pen) = p.presence_penalty.filter(|&x| x != 0.0) {
        out.push(Box::new(PresencePenalty {
            penalty: pen,
            context_size: p.presence_context_size,
        }));
    }
    if let Some(pen) = p.frequency_penalty.filter(|&x| x != 0.0) {
        out.push(Box::new(FrequencyPenalty {
            penalty: pen,
            context_size: p.frequency_context_size,
        }));
    }
    Ok(out)
}

/// Applies `processors` in order (mlx-lm's loop in `generate_step`).
pub fn apply_processors(
    processors: &[Box<dyn LogitsProcessor>],
    tokens: &Array,
    logits: &Array,
) -> Result<Array> {
    let mut l = logits.clone();
    for p in processors {
        l = p.process(tokens, &l)?;
    }
    Ok(l)
}

fn history_len(tokens: &Array) -> Result<i32> {
    match tokens.shape().as_slice() {
        [n] => Ok(*n),
        s => Err(SampleError::param(
            "tokens",
            "must be a 1-D array of token ids",
            format!("{s:?}"),
        )),
    }
}

/// `logits.at[:, idx].add(update)` (`scatter_add` after MLX's argument building).
fn scatter_cols(kind: ScatterKind, logits: &Array, idx: &Array, update: &Array) -> Result<Array> {
    let ([rows, cols], upd) = column_scatter_args(logits, idx, update)?;
    Ok(logits.scatter(kind, &[&rows, &cols], &upd, &[0, 1])?)
}

/// mlx-lm's `logit_bias_processor`: `logits.at[:, ids].add(values)`.
#[derive(Debug, Clone)]
pub struct LogitBias {
    ids: Array,
    values: Array,
}

impl LogitBias {
    /// Token ids become an int32 array and biases a float32 array, as `mx.array` makes
    /// them from the dict's keys and values.
    pub fn new(bias: &[(i32, f64)]) -> Result<LogitBias> {
        let ids = Array::from_vec(bias.iter().map(|(t, _)| *t).collect())?;
        let values = Array::from_vec(bias.iter().map(|(_, v)| *v as f32).collect())?;
        Ok(LogitBias { ids, values })
    }
}

impl LogitsProcessor for LogitBias {
    fn process(&self, _tokens: &Array, logits: &Array) -> Result<Array> {
        let values = self.values.astype(logits.dtype())?;
        scatter_cols(ScatterKind::Add, logits, &self.ids, &values)
    }
}

/// mlx-lm's `make_repetition_penalty`: recent tokens' logits are multiplied by the
/// penalty when negative and divided by it otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct RepetitionPenalty {
    penalty: f64,
    context_size: i32,
}

impl RepetitionPenalty {
    /// Refuses a negative penalty, like mlx-lm.
    pub fn new(penalty: f64, context_size: i32) -> Result<RepetitionPenalty> {
        if penalty < 0.0 || penalty.is_nan() {
            return Err(SampleError::param(
                "penalty",
                "must be a non-negative float",
                penalty,
            ));
        }
        Ok(RepetitionPenalty {
            penalty,
            context_size,
        })
    }
}

impl LogitsProcessor for RepetitionPenalty {
    fn process(&self, tokens: &Array, logits: &Array) -> Result<Array> {
        if history_len(tokens)? == 0 {
            return Ok(logits.clone());
        }
        let recent = last_tokens(tokens, self.context_size)?;
        let selected = logits.take(&recent, Some(1))?;
        let dt = selected.dtype();
        let neg = selected.less(&Array::scalar_i64(0, zero_dtype(dt))?)?;
        let pen = py_float(self.penalty, dt)?;
        let updated = where_(&neg, &selected.multiply(&pen)?, &selected.divide(&pen)?)?;
        scatter_cols(ScatterKind::Set, logits, &recent, &updated)
    }
}

/// The dtype a Python `int` takes next to an array of dtype `dt`.
fn zero_dtype(dt: Dtype) -> Dtype {
    if dt == Dtype::Bool {
        Dtype::Int32
    } else {
        dt
    }
}

/// mlx-lm's `make_presence_penalty`: subtracts the penalty once from every token
/// present in the recent context (`logits[:, tokens] -= penalty`).
#[derive(Debug, Clone, PartialEq)]
pub struct PresencePenalty {
    /// The penalty.
    pub penalty: f64,
    /// How many recent tokens are looked at.
    pub context_size: i32,
}

impl LogitsProcessor for PresencePenalty {
    fn process(&self, tokens: &Array, logits: &Array) -> Result<Array> {
        if history_len(tokens)? == 0 {
            return Ok(logits.clone());
        }
        let recent = last_tokens(tokens, self.context_size)?;
        let selected = logits.take(&recent, Some(1))?;
        let updated = selected.subtract(&py_float(self.penalty, selected.dtype())?)?;
        scatter_cols(ScatterKind::Set, logits, &recent, &updated)
    }
}

/// mlx-lm's `make_frequency_penalty`: subtracts the penalty once per occurrence in the
/// recent context (`logits.at[:, tokens].subtract(penalty)`).
#[derive(Debug, Clone, PartialEq)]
pub struct FrequencyPenalty {
    /// The penalty.
    pub penalty: f64,
    /// How many recent tokens are looked at.
    pub context_size: i32,
}

impl LogitsProcessor for FrequencyPenalty {
    fn process(&self, tokens: &Array, logits: &Array) -> Result<Array> {
        if history_len(tokens)? == 0 {
            return Ok(logits.clone());
        }
        let recent = last_tokens(tokens, self.context_size)?;
        let update = py_float(self.penalty, logits.dtype())?.negative()?;
        scatter_cols(ScatterKind::Add, logits, &recent, &update)
    }
}

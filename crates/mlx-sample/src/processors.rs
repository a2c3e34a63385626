//! Logits processors: mlx-lm's `make_logits_processors` (logit bias, repetition,
//! presence and frequency penalties) on a stateful processor interface.
//!
//! A [`LogitsProcessor`] sees, like mlx-lm's processors, the 1-D token history (prompt
//! and generated tokens so far, the step's input included, as a device array) and the
//! logits `[B, V]`, and returns new logits. It may also keep host state: it is told the
//! prompt ([`LogitsProcessor::prompt`]) and every token the sequence accepts
//! ([`LogitsProcessor::accept`], on the host, once the token is read back), can be
//! forked for a sibling sequence, and can ask for the accepted token before the next
//! step is built ([`LogitsProcessor::needs_accepted_token`]: a grammar needs the last
//! token to compute the next mask; penalties do not, so their sequences keep
//! queueing a step ahead). [`LogitsProcessors`] is one sequence's chain with its
//! history. Reads and writes of `logits[:, tokens]` use the same gather/scatter MLX's
//! Python indexing builds, so results are bit-identical.
use crate::error::{Result, SampleError};
use crate::util::{column_scatter_args, last_tokens, py_float};
use mlx_array::{ops, ops::ScatterKind, where_, Array, Dtype};

/// Rewrites the logits of one sequence, given the tokens so far.
pub trait LogitsProcessor: Send {
    /// Prompt tokens that go into the caches without a sample (prompt-cache prefix,
    /// prefill chunks), in order; called before the first [`Self::process`], possibly
    /// several times. The default ignores them.
    fn prompt(&mut self, _tokens: &[u32]) -> Result<()> {
        Ok(())
    }

    /// `history` is 1-D (every token so far, this step's input included), `logits` is
    /// `[B, V]`.
    fn process(&mut self, history: &Array, logits: &Array) -> Result<Array>;

    /// The token the sequence accepted, on the host (once read back). Unless
    /// [`Self::needs_accepted_token`], the next step may already have been built. The
    /// default ignores it.
    fn accept(&mut self, _token: u32) -> Result<()> {
        Ok(())
    }

    /// Whether [`Self::process`] needs the previous token [accepted](Self::accept)
    /// first: the sequence then waits for each token before building its next step
    /// (other sequences keep queueing ahead). `false` by default.
    fn needs_accepted_token(&self) -> bool {
        false
    }

    /// A copy in the same state, for another sequence continuing from here.
    fn fork(&self) -> Box<dyn LogitsProcessor>;

    /// Whether the processor reached a dead end: it cannot let the sequence go on
    /// validly (a grammar that allows no token of the vocabulary, or a token it had to
    /// reject). It then allows only end-of-sequence tokens, and the sequence ends with
    /// its own finish reason instead of `stop`. `false` by default.
    fn dead_end(&self) -> bool {
        false
    }

    /// Whether [`Self::process`] reads the token history. A chain none of whose
    /// processors do keeps no history (a grammar's state lives in the processor).
    /// `true` by default.
    fn uses_history(&self) -> bool {
        true
    }

    /// For a processor that only forbids tokens and decides which on the host (a
    /// grammar): the tokens this step's [`Self::process`] would leave among the first
    /// `vocab` ids, as a bitset (bit `i % 32` of word `i / 32`, `vocab.div_ceil(32)`
    /// words), computed instead of calling `process` (the state moves on as if it had
    /// run). The caller then sets every other logit to `-inf` itself (a batch masks all
    /// its rows in one op); this host work must not touch MLX. `None` (the default):
    /// call `process`.
    fn allowed_bits(&mut self, _vocab: usize) -> Option<Result<Vec<u32>>> {
        None
    }

    /// [`Self::allowed_bits`] written into `dst` (`vocab.div_ceil(32)` words, every one
    /// written): a batch's buffer of all its rows' masks, so that no bitset of the
    /// processor's own is made and copied again. `None` (`dst` untouched) where
    /// `allowed_bits` gives `None`. The default copies `allowed_bits`' bitset.
    fn allowed_bits_into(&mut self, vocab: usize, dst: &mut [u32]) -> Option<Result<()>> {
        Some(self.allowed_bits(vocab)?.and_then(|w| {
            if w.len() != dst.len() {
                return Err(SampleError::Constraint(format!(
                    "a token mask of {} words where {} were expected for {vocab} tokens",
                    w.len(),
                    dst.len()
                )));
            }
            dst.copy_from_slice(&w);
            Ok(())
        }))
    }
}

impl<F> LogitsProcessor for F
where
    F: Fn(&Array, &Array) -> Result<Array> + Clone + Send + 'static,
{
    fn process(&mut self, history: &Array, logits: &Array) -> Result<Array> {
        self(history, logits)
    }

    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }
}

/// Builds a fresh processor for each sequence of a request (e.g. from its fields).
pub trait BuildProcessor: Send + Sync + std::fmt::Debug {
    /// A new processor in its initial state.
    fn build(&self) -> Result<Box<dyn LogitsProcessor>>;
}

/// One sequence's processors, in order, with the token history they see (kept only
/// when there is a processor).
#[derive(Default)]
pub struct LogitsProcessors {
    list: Vec<Box<dyn LogitsProcessor>>,
    history: Option<Array>,
}

impl LogitsProcessors {
    /// A chain of `list`, with an empty history.
    pub fn new(list: Vec<Box<dyn LogitsProcessor>>) -> LogitsProcessors {
        LogitsProcessors {
            list,
            history: None,
        }
    }

    /// Appends a processor (applied after the others).
    pub fn push(&mut self, p: Box<dyn LogitsProcessor>) {
        self.list.push(p);
    }

    /// Number of processors.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there is none (the logits pass through untouched).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether some processor needs each accepted token before the next step.
    pub fn needs_accepted_token(&self) -> bool {
        self.list.iter().any(|p| p.needs_accepted_token())
    }

    /// Whether some processor reached a dead end ([`LogitsProcessor::dead_end`]).
    pub fn dead_end(&self) -> bool {
        self.list.iter().any(|p| p.dead_end())
    }

    /// Whether some processor reads the token history (else none is kept).
    pub fn keeps_history(&self) -> bool {
        self.list.iter().any(|p| p.uses_history())
    }

    /// Prompt tokens put into the caches without a sample: extends the history and
    /// tells every processor.
    pub fn prompt(&mut self, tokens: &[u32]) -> Result<()> {
        if self.list.is_empty() || tokens.is_empty() {
            return Ok(());
        }
        if self.keeps_history() {
            let chunk = Array::from_slice(tokens, &[tokens.len() as i32])?;
            self.history = Some(match &self.history {
                Some(t) => ops::concatenate(&[t, &chunk], 0)?,
                None => chunk,
            });
        }
        for p in &mut self.list {
            p.prompt(tokens)?;
        }
        Ok(())
    }

    /// mlx-lm's processor loop of `_step`: the history grows by `input` (the tokens
    /// fed to the model this step, 1-D) and every processor rewrites `logits` in turn.
    pub fn process(&mut self, input: &Array, logits: &Array) -> Result<Array> {
        let n = self.list.len();
        self.process_first(n, input, logits)
    }

    /// The last processor's [`LogitsProcessor::allowed_bits`] for this step; when it
    /// gives them, the step goes on with [`Self::process_masked`] instead of
    /// [`Self::process`].
    pub fn host_mask(&mut self, vocab: usize) -> Option<Result<Vec<u32>>> {
        self.list.last_mut()?.allowed_bits(vocab)
    }

    /// [`Self::host_mask`] written into `dst` ([`LogitsProcessor::allowed_bits_into`]).
    pub fn host_mask_into(&mut self, vocab: usize, dst: &mut [u32]) -> Option<Result<()>> {
        self.list.last_mut()?.allowed_bits_into(vocab, dst)
    }

    /// Whether the only work of a step whose [`Self::host_mask`] was taken is that mask
    /// (one processor, no history): [`Self::process_masked`] would return `logits`.
    pub fn only_masks(&self) -> bool {
        self.list.len() == 1 && !self.keeps_history()
    }

    /// [`Self::process`] of a step whose last processor's mask was taken with
    /// [`Self::host_mask`]: every other processor, in order (the caller applies the
    /// mask after them, where the last processor would have).
    pub fn process_masked(&mut self, input: &Array, logits: &Array) -> Result<Array> {
        let n = self.list.len().saturating_sub(1);
        self.process_first(n, input, logits)
    }

    /// The first `n` processors on `logits`, the history grown by `input` (when kept).
    fn process_first(&mut self, n: usize, input: &Array, logits: &Array) -> Result<Array> {
        if self.list.is_empty() {
            return Ok(logits.clone());
        }
        if !self.keeps_history() {
            let mut l = logits.clone();
            for p in &mut self.list[..n] {
                l = p.process(input, &l)?;
            }
            return Ok(l);
        }
        let all = match &self.history {
            Some(t) => ops::concatenate(&[t, input], 0)?,
            None => input.clone(),
        };
        let mut l = logits.clone();
        for p in &mut self.list[..n] {
            l = p.process(&all, &l)?;
        }
        self.history = Some(all);
        Ok(l)
    }

    /// Every processor on `logits` with the given full `history` (the stored history
    /// is neither used nor changed).
    pub fn process_with_history(&mut self, history: &Array, logits: &Array) -> Result<Array> {
        let mut l = logits.clone();
        for p in &mut self.list {
            l = p.process(history, &l)?;
        }
        Ok(l)
    }

    /// Tells every processor the token the sequence accepted.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        for p in &mut self.list {
            p.accept(token)?;
        }
        Ok(())
    }

    /// A copy with the same history and processor states.
    pub fn fork(&self) -> LogitsProcessors {
        LogitsProcessors {
            list: self.list.iter().map(|p| p.fork()).collect(),
            history: self.history.clone(),
        }
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
pub fn make_logits_processors(p: &LogitsParams) -> Result<LogitsProcessors> {
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
    Ok(LogitsProcessors::new(out))
}

/// The last `context_size` tokens of the 1-D history (`tokens[-context_size:]`), or
/// `None` when the history is empty (the penalties then leave the logits as they are).
fn recent_tokens(tokens: &Array, context_size: i32) -> Result<Option<Array>> {
    match tokens.shape().as_slice() {
        [0] => Ok(None),
        [_] => Ok(Some(last_tokens(tokens, context_size)?)),
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
    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }

    fn process(&mut self, _tokens: &Array, logits: &Array) -> Result<Array> {
        let values = self.values.astype(logits.dtype())?;
        scatter_cols(ScatterKind::Add, logits, &self.ids, &values)
    }
}

/// vLLM's `min_tokens`: the given tokens (end-of-sequence and stop tokens) are
/// impossible until the sequence has generated `min_tokens` tokens. Built for each
/// sequence of a request; the count comes from the token history (`prompt_len` tokens
/// of prompt, then the generated ones), so it holds across forks and verified drafts.
#[derive(Debug, Clone)]
pub struct MinTokens {
    ids: Vec<u32>,
    min_tokens: usize,
    prompt_len: usize,
}

impl MinTokens {
    /// Masks `ids` while fewer than `min_tokens` tokens follow the `prompt_len` tokens
    /// of the prompt.
    pub fn new(ids: Vec<u32>, min_tokens: usize, prompt_len: usize) -> MinTokens {
        MinTokens {
            ids,
            min_tokens,
            prompt_len,
        }
    }
}

impl BuildProcessor for MinTokens {
    fn build(&self) -> Result<Box<dyn LogitsProcessor>> {
        let bias: Vec<(i32, f64)> = self
            .ids
            .iter()
            .map(|&id| (id as i32, f64::NEG_INFINITY))
            .collect();
        Ok(Box::new(MinTokensProcessor {
            mask: LogitBias::new(&bias)?,
            until: self.prompt_len + self.min_tokens,
        }))
    }
}

#[derive(Debug, Clone)]
struct MinTokensProcessor {
    mask: LogitBias,
    /// The history length (prompt and generated tokens) from which nothing is masked.
    until: usize,
}

impl LogitsProcessor for MinTokensProcessor {
    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }

    fn process(&mut self, history: &Array, logits: &Array) -> Result<Array> {
        // The history ends with this step's input: the prompt, then the tokens
        // generated so far.
        let seen = history.shape().first().copied().unwrap_or(0).max(0) as usize;
        if seen < self.until {
            self.mask.process(history, logits)
        } else {
            Ok(logits.clone())
        }
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
    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }

    fn process(&mut self, tokens: &Array, logits: &Array) -> Result<Array> {
        let Some(recent) = recent_tokens(tokens, self.context_size)? else {
            return Ok(logits.clone());
        };
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
    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }

    fn process(&mut self, tokens: &Array, logits: &Array) -> Result<Array> {
        let Some(recent) = recent_tokens(tokens, self.context_size)? else {
            return Ok(logits.clone());
        };
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
    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }

    fn process(&mut self, tokens: &Array, logits: &Array) -> Result<Array> {
        let Some(recent) = recent_tokens(tokens, self.context_size)? else {
            return Ok(logits.clone());
        };
        let update = py_float(self.penalty, logits.dtype())?.negative()?;
        scatter_cols(ScatterKind::Add, logits, &recent, &update)
    }
}

//! Scoring for lm-evaluation-harness requests, ported from mlx-lm 0.32.2's
//! `mlx_lm/evaluate.py` (`MLXLM._process_prompt`, `_score_fn`, `loglikelihood`,
//! `loglikelihood_rolling`) with the same op sequence, chunking and cache reuse, so the
//! same model and requests give the same log-likelihoods bit for bit.
//!
//! Only the single-process path of mlx-lm is ported (no `mx.distributed` ranks).
use crate::{EvalError, Result};
use mlx_array::{activations::log_softmax, memory, ops, transforms, Array, Dtype, Scalar};
use mlx_cache::PromptCache;
use mlx_models::LanguageModel;
use mlx_tokenizer::Tokenizer;

/// mlx-lm's `step_size`: prompt positions the model sees per forward call.
pub const STEP_SIZE: usize = 2048;
/// mlx-lm's `DEFAULT_MAX_TOKENS`: the context budget of `loglikelihood` (and the
/// generation cap of `generate_until`) when `--max-tokens` is not given.
pub const DEFAULT_MAX_TOKENS: usize = 8192;

/// What [`score`] returns (mlx-lm's `_score_fn` triple).
#[derive(Debug)]
pub struct Scores {
    /// `[B, maxlen - 1]` float32: the log-probability of each next token (padding too).
    pub scores: Array,
    /// Each sequence's length before padding.
    pub lengths: Vec<usize>,
    /// `[B, maxlen - 1]` bool: whether the next token was the argmax, false past
    /// `lengths` (mlx-lm's mask, kept as it is).
    pub is_greedy: Array,
}

/// A private copy of per-layer caches (mlx-lm: `copy.deepcopy(cache)`), through
/// [`mlx_cache::copy_cache`]; a cache kind without a copy is an error naming it.
pub fn copy_caches(caches: &PromptCache) -> Result<PromptCache> {
    caches
        .iter()
        .map(|c| {
            mlx_cache::copy_cache(c.as_ref()).ok_or_else(|| {
                EvalError::Invalid(format!(
                    "cannot copy a {} cache for prefix reuse",
                    c.class_name()
                ))
            })
        })
        .collect()
}

fn new_cache(model: &dyn LanguageModel) -> Result<PromptCache> {
    Ok(mlx_cache::make_prompt_cache(&model.cache_specs(), None)?)
}

fn eval_cache(cache: &PromptCache) -> Result<()> {
    let state: Vec<Array> = cache.iter().flat_map(|c| c.state()).collect();
    transforms::eval(&state.iter().collect::<Vec<_>>())?;
    Ok(())
}

/// mlx-lm's `_process_prompt`: the prompt through the model `step_size` tokens at a
/// time; returns the float32 log-softmax `[1, vocab]` of the last position and the cache.
pub fn process_prompt(
    model: &dyn LanguageModel,
    prompt: &[u32],
    step_size: usize,
) -> Result<(Array, PromptCache)> {
    if prompt.is_empty() || step_size == 0 {
        return Err(EvalError::Invalid(
            "process_prompt needs at least one token and a positive step size".into(),
        ));
    }
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let mut cache = new_cache(model)?;
    let mut logits = None;
    for chunk in ids.chunks(step_size) {
        let inp = Array::from_slice(chunk, &[1, chunk.len() as i32])?;
        logits = Some(model.forward(&inp, &mut cache)?);
        eval_cache(&cache)?;
        memory::clear_cache();
    }
    let logits = logits.ok_or_else(|| EvalError::Invalid("empty prompt".into()))?;
    let (l, v) = (logits.dim(1)?, logits.dim(2)?);
    let last = logits
        .slice(&[0, l - 1, 0], &[1, l, v], None)?
        .squeeze(Some(&[1]))?;
    let logprobs = log_softmax(&last.astype(Dtype::Float32)?, -1)?;
    Ok((logprobs, cache))
}

/// mlx-lm's `_score_fn`: the sequences right-padded with 0 into one batch, inputs all
/// but the last position, targets all but the first, `step_size` positions per forward
/// call through `cache` (a fresh one when `None`).
pub fn score(
    model: &dyn LanguageModel,
    inputs: &[&[u32]],
    cache: Option<PromptCache>,
    step_size: usize,
) -> Result<Scores> {
    if inputs.is_empty() || step_size == 0 {
        return Err(EvalError::Invalid(
            "scoring needs at least one sequence and a positive step size".into(),
        ));
    }
    let lengths: Vec<usize> = inputs.iter().map(|x| x.len()).collect();
    let maxlen = lengths.iter().copied().max().unwrap_or(0);
    if maxlen < 2 {
        return Err(EvalError::Invalid(
            "scoring needs a sequence of at least two tokens (one to predict from, one to \
             predict)"
                .into(),
        ));
    }
    let b = inputs.len() as i32;
    let mut padded = vec![0i32; inputs.len() * maxlen];
    for (row, x) in inputs.iter().enumerate() {
        for (j, &t) in x.iter().enumerate() {
            padded[row * maxlen + j] = t as i32;
        }
    }
    let all = Array::from_slice(&padded, &[b, maxlen as i32])?;
    let width = maxlen as i32 - 1;
    let inp_all = all.slice(&[0, 0], &[b, width], None)?;
    let targets = all.slice(&[0, 1], &[b, width + 1], None)?;
    let len_i32: Vec<i32> = lengths.iter().map(|&l| l as i32).collect();
    let lens = Array::from_slice(&len_i32, &[b, 1])?;

    let mut cache = match cache {
        Some(c) if !c.is_empty() => c,
        _ => new_cache(model)?,
    };
    let mut scores = Vec::new();
    let mut greedy = Vec::new();
    let mut offset = 0i32;
    let step = step_size as i32;
    let mut i = 0i32;
    while i < width {
        let e = (i + step).min(width);
        let inp = inp_all.slice(&[0, i], &[b, e], None)?;
        let t = e - i;
        let tgt = targets.slice(&[0, i], &[b, e], None)?;
        let logits = model.forward(&inp, &mut cache)?;
        let log_probs = log_softmax(&logits.astype(Dtype::Float32)?, -1)?;
        let s = log_probs
            .take_along_axis(&tgt.expand_dims(&[-1])?, -1)?
            .squeeze(Some(&[-1]))?;
        let ig = tgt.equal(&logits.argmax(Some(-1), false)?)?;
        let pos = ops::arange(f64::from(offset), f64::from(t + offset), 1.0, Dtype::Int32)?;
        let ig = ops::where_(
            &pos.less(&lens)?,
            &ig,
            &Array::weak_scalar(Scalar::Bool(false), Dtype::Bool)?,
        )?;
        transforms::eval(&[&s, &ig])?;
        memory::clear_cache();
        scores.push(s);
        greedy.push(ig);
        offset += t;
        i = e;
    }
    let scores = ops::concatenate(&scores.iter().collect::<Vec<_>>(), 1)?;
    let is_greedy = ops::concatenate(&greedy.iter().collect::<Vec<_>>(), 1)?;
    Ok(Scores {
        scores,
        lengths,
        is_greedy,
    })
}

/// mlx-lm's `_tokenize`: special tokens added unless a chat template is in use.
fn tokenize(tok: &Tokenizer, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
    tok.encode(text, add_special_tokens)
        .map_err(|source| EvalError::Tokenizer {
            context: "tokenizing a request".into(),
            source,
        })
}

/// mlx-lm's `MLXLM.loglikelihood` for `(context, continuation)` pairs: requests sharing
/// a context are scored from one prompt pass whose cache each continuation copies; the
/// context is cut from the left so the longest context + continuation fits
/// `max_tokens` (default [`DEFAULT_MAX_TOKENS`]) + 1 tokens, and a context cut away
/// entirely scores `-inf`. Returns `(log-likelihood, is greedy)` in request order, the
/// log-likelihood rounded through float32 like mlx-lm's gather.
pub fn loglikelihood(
    model: &dyn LanguageModel,
    tok: &Tokenizer,
    requests: &[(String, String)],
    max_tokens: Option<usize>,
    add_special_tokens: bool,
) -> Result<Vec<(f64, bool)>> {
    // Group by context, in first-seen order (a Python dict).
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, (ctx, _)) in requests.iter().enumerate() {
        let g = *index.entry(ctx.as_str()).or_insert_with(|| {
            groups.push((ctx.as_str(), Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i);
    }
    let max_tokens = max_tokens.filter(|&m| m > 0).unwrap_or(DEFAULT_MAX_TOKENS);
    let mut out = vec![(0f64, false); requests.len()];
    let mut long_completions = 0usize;
    for (q, idxs) in &groups {
        let prefix = tokenize(tok, q, add_special_tokens)?;
        let completion_start = prefix.len();
        let full = idxs
            .iter()
            .map(|&i| tokenize(tok, &format!("{q}{}", requests[i].1), add_special_tokens))
            .collect::<Result<Vec<_>>>()?;
        let max_completed = full.iter().map(Vec::len).max().unwrap_or(0);
        let truncation = max_completed.saturating_sub(max_tokens + 1);
        let prefix_l = prefix.len().saturating_sub(truncation);
        if prefix_l == 0 {
            long_completions += 1;
            for &i in idxs {
                out[i] = (f64::NEG_INFINITY, false);
            }
            continue;
        }
        let prefix = &prefix[prefix.len() - prefix_l..];
        let (logprobs, cache) = process_prompt(model, prefix, STEP_SIZE)?;
        let max_idx: u32 = logprobs.argmax(None, false)?.item()?;
        let lp: Vec<f32> = logprobs.to_vec()?;
        for (&i, s) in idxs.iter().zip(&full) {
            let inputs = s
                .get(completion_start..)
                .filter(|x| !x.is_empty())
                .ok_or_else(|| {
                    EvalError::Data(format!(
                        "request {i}: the continuation {:?} adds no tokens to its context (mlx-lm \
                     fails here too)",
                        requests[i].1
                    ))
                })?;
            let first = inputs[0] as usize;
            let mut value = f64::from(*lp.get(first).ok_or_else(|| {
                EvalError::Data(format!(
                    "request {i}: token {first} is outside the vocabulary"
                ))
            })?);
            let mut greedy = inputs[0] == max_idx;
            if inputs.len() > 1 {
                let r = score(model, &[inputs], Some(copy_caches(&cache)?), STEP_SIZE)?;
                let sum: f32 = r.scores.sum(None, false)?.item()?;
                value += f64::from(sum);
                let all: bool = r.is_greedy.all(None, false)?.item()?;
                greedy &= all;
            }
            // mlx-lm gathers the Python floats into a float32 array.
            out[i] = (f64::from(value as f32), greedy);
        }
    }
    if long_completions > 0 {
        tracing::info!(
            "Prefix eliminated for {long_completions} requests with completion longer than \
             context."
        );
    }
    Ok(out)
}

/// mlx-lm's `MLXLM.loglikelihood_rolling`: each text's total log-likelihood, scored in
/// batches of `batch_size` right-padded sequences (no context window: mlx-lm scores the
/// whole text in one pass).
pub fn loglikelihood_rolling(
    model: &dyn LanguageModel,
    tok: &Tokenizer,
    texts: &[String],
    batch_size: usize,
    add_special_tokens: bool,
) -> Result<Vec<f64>> {
    if batch_size == 0 {
        return Err(EvalError::Invalid("--batch-size must be at least 1".into()));
    }
    let inputs = texts
        .iter()
        .map(|t| tokenize(tok, t, add_special_tokens))
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(texts.len());
    for batch in inputs.chunks(batch_size) {
        let refs: Vec<&[u32]> = batch.iter().map(Vec::as_slice).collect();
        let r = score(model, &refs, None, STEP_SIZE)?;
        let width = r.scores.dim(-1)?;
        let lens: Vec<i32> = r.lengths.iter().map(|&l| l as i32).collect();
        let lens = Array::from_slice(&lens, &[lens.len() as i32, 1])?;
        let pos = ops::arange(0.0, f64::from(width), 1.0, Dtype::Int32)?;
        let mask = pos.less(&lens.subtract(1i32)?)?;
        let sums = mask.multiply(&r.scores)?.sum(Some(&[-1]), false)?;
        out.extend(sums.to_vec::<f32>()?.into_iter().map(f64::from));
    }
    Ok(out)
}

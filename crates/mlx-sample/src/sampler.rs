//! Samplers: mlx-lm's `make_sampler` and its steps (`sample_utils.py`).
//!
//! mlx-lm wraps the steps in `mx.compile(inputs=mx.random.state,
//! outputs=mx.random.state)`; compiling only fuses kernels and threads the global key
//! through, so running the same ops uncompiled on MLX's global key sequence draws the
//! same keys and gives the same tokens (checked against mlx-lm's goldens).
use crate::error::{Result, SampleError};
use crate::util::{last_axis, py_float};
use mlx_array::{random, where_, Array, Dtype};

/// Turns log-probabilities `[B, V]` into sampled token ids `[B]` (uint32).
pub trait Sampler: Send {
    /// Samples one token per row.
    fn sample(&self, logprobs: &Array) -> Result<Array>;

    /// Whether it takes the most likely token, drawing nothing at random
    /// ([`GreedySampler`]); false unless a sampler says so.
    fn is_greedy(&self) -> bool {
        false
    }
}

impl<F> Sampler for F
where
    F: Fn(&Array) -> Result<Array> + Send,
{
    fn sample(&self, logprobs: &Array) -> Result<Array> {
        self(logprobs)
    }
}

/// The arguments of mlx-lm's `make_sampler`, with its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Temperature; 0 means greedy argmax.
    pub temp: f64,
    /// Nucleus sampling mass, used when `0 < top_p < 1`.
    pub top_p: f64,
    /// Min-p threshold (relative to the top token), used when not 0.
    pub min_p: f64,
    /// Tokens min-p never removes.
    pub min_tokens_to_keep: i32,
    /// Keep only the `top_k` most likely tokens, used when positive.
    pub top_k: i32,
    /// Probability of applying XTC, used when positive.
    pub xtc_probability: f64,
    /// XTC probability threshold.
    pub xtc_threshold: f64,
    /// Token ids XTC never removes.
    pub xtc_special_tokens: Vec<i32>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temp: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            top_k: 0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            xtc_special_tokens: Vec::new(),
        }
    }
}

/// One filtering step of the chain.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// [`apply_top_p`].
    TopP(f64),
    /// [`apply_min_p`].
    MinP {
        /// Threshold.
        min_p: f64,
        /// Tokens never removed.
        min_tokens_to_keep: i32,
    },
    /// [`apply_xtc`].
    Xtc {
        /// Probability of applying XTC.
        probability: f64,
        /// Probability threshold.
        threshold: f64,
        /// Tokens never removed.
        special_tokens: Vec<i32>,
    },
    /// [`apply_top_k`].
    TopK(i32),
}

impl Filter {
    /// Applies the step.
    pub fn apply(&self, logprobs: &Array) -> Result<Array> {
        match self {
            Filter::TopP(p) => apply_top_p(logprobs, *p),
            Filter::MinP {
                min_p,
                min_tokens_to_keep,
            } => apply_min_p(logprobs, *min_p, *min_tokens_to_keep),
            Filter::Xtc {
                probability,
                threshold,
                special_tokens,
            } => apply_xtc(logprobs, *probability, *threshold, special_tokens),
            Filter::TopK(k) => apply_top_k(logprobs, *k),
        }
    }
}

/// mlx-lm's `greedy_sampler`: `argmax(logprobs, axis=-1)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GreedySampler;

impl Sampler for GreedySampler {
    fn sample(&self, logprobs: &Array) -> Result<Array> {
        Ok(logprobs.argmax(Some(-1), false)?)
    }

    fn is_greedy(&self) -> bool {
        true
    }
}

/// The sampler `make_sampler` builds for `temp != 0`: the filters in mlx-lm's order
/// (top-p, min-p, XTC, top-k), then [`categorical_sampling`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChainSampler {
    /// Temperature.
    pub temp: f64,
    /// Filters applied before sampling, in order.
    pub filters: Vec<Filter>,
}

impl Sampler for ChainSampler {
    fn sample(&self, logprobs: &Array) -> Result<Array> {
        let mut lp = logprobs.clone();
        for f in &self.filters {
            lp = f.apply(&lp)?;
        }
        categorical_sampling(&lp, self.temp)
    }
}

fn check_min_p(min_p: f64, min_tokens_to_keep: i32) -> Result<()> {
    if !(0.0..=1.0).contains(&min_p) {
        return Err(SampleError::param(
            "min_p",
            "has to be a float in the [0, 1] interval",
            min_p,
        ));
    }
    if min_tokens_to_keep < 1 {
        return Err(SampleError::param(
            "min_tokens_to_keep",
            "has to be a positive integer",
            min_tokens_to_keep,
        ));
    }
    Ok(())
}

fn check_xtc(probability: f64, threshold: f64) -> Result<()> {
    if !(0.0..=0.5).contains(&threshold) {
        return Err(SampleError::param(
            "threshold",
            "has to be a float in the [0, 0.5] interval",
            threshold,
        ));
    }
    if !(0.0..=1.0).contains(&probability) {
        return Err(SampleError::param(
            "probability",
            "has to be a float in the [0, 1] interval",
            probability,
        ));
    }
    Ok(())
}

/// mlx-lm's `make_sampler`. Parameters mlx-lm would reject on the first call are
/// rejected here already (the vocabulary-dependent `top_k` bound is checked per call).
pub fn make_sampler(p: &SamplerParams) -> Result<Box<dyn Sampler>> {
    if p.temp == 0.0 {
        return Ok(Box::new(GreedySampler));
    }
    let mut filters = Vec::new();
    if 0.0 < p.top_p && p.top_p < 1.0 {
        filters.push(Filter::TopP(p.top_p));
    }
    if p.min_p != 0.0 {
        check_min_p(p.min_p, p.min_tokens_to_keep)?;
        filters.push(Filter::MinP {
            min_p: p.min_p,
            min_tokens_to_keep: p.min_tokens_to_keep,
        });
    }
    if p.xtc_probability > 0.0 {
        check_xtc(p.xtc_probability, p.xtc_threshold)?;
        filters.push(Filter::Xtc {
            probability: p.xtc_probability,
            threshold: p.xtc_threshold,
            special_tokens: p.xtc_special_tokens.clone(),
        });
    }
    if p.top_k > 0 {
        filters.push(Filter::TopK(p.top_k));
    }
    Ok(Box::new(ChainSampler {
        temp: p.temp,
        filters,
    }))
}

fn neg_inf(like: Dtype) -> mlx_array::Result<Array> {
    py_float(f64::NEG_INFINITY, like)
}

/// mlx-lm's `apply_top_k`: every token outside the `top_k` largest gets `-inf`.
pub fn apply_top_k(logprobs: &Array, top_k: i32) -> Result<Array> {
    let vocab = logprobs.dim(-1)?;
    if !(0 < top_k && top_k < vocab) {
        return Err(SampleError::param(
            "top_k",
            &format!("has to be an integer in the (0, {vocab}) interval"),
            top_k,
        ));
    }
    let idx = logprobs.negative()?.argpartition(top_k - 1, Some(-1))?;
    let mask_idx = last_axis(&idx, top_k, None)?;
    let fill = Array::scalar_f64(f64::NEG_INFINITY, logprobs.dtype())?;
    Ok(logprobs.put_along_axis(&mask_idx, &fill, -1)?)
}

/// mlx-lm's `apply_min_p`: tokens less likely than `min_p` times the top token get
/// `-inf`, except the `min_tokens_to_keep` most likely.
pub fn apply_min_p(logprobs: &Array, min_p: f64, min_tokens_to_keep: i32) -> Result<Array> {
    check_min_p(min_p, min_tokens_to_keep)?;
    let top = logprobs.max(Some(&[-1]), true)?;
    let scaled = top.add(&py_float(min_p.ln(), top.dtype())?)?;
    let mut remove = logprobs.less(&scaled)?;
    if min_tokens_to_keep > 1 {
        let idx = logprobs.argpartition(-min_tokens_to_keep, Some(-1))?;
        let top_idx = last_axis(&idx, -min_tokens_to_keep, None)?;
        let keep = Array::scalar(false)?;
        remove = remove.put_along_axis(&top_idx, &keep, -1)?;
    }
    Ok(where_(&remove, &neg_inf(logprobs.dtype())?, logprobs)?)
}

/// mlx-lm's `apply_top_p`: keeps the smallest set of most likely tokens whose mass
/// reaches `top_p` (ties at the threshold kept), the rest get `-inf`.
pub fn apply_top_p(logprobs: &Array, top_p: f64) -> Result<Array> {
    let sorted = logprobs.sort(Some(-1))?;
    let probs = sorted.astype(Dtype::Float32)?.exp()?;
    let mass_above = probs.cumsum(-1, true, false)?;
    let total = last_axis(&mass_above, 0, Some(1))?.add(&last_axis(&probs, 0, Some(1))?)?;
    let limit = py_float(top_p, total.dtype())?.multiply(&total)?;
    let dropped = mass_above.greater_equal(&limit)?.sum(Some(&[-1]), true)?;
    let threshold = sorted.take_along_axis(&dropped, -1)?;
    let below = logprobs.less(&threshold)?;
    Ok(where_(&below, &neg_inf(logprobs.dtype())?, logprobs)?)
}

/// mlx-lm's `apply_xtc` ("exclude top choices"): with probability `xtc_probability`,
/// every token above `xtc_threshold` except the least likely of them (and the special
/// tokens) gets `-inf`. Draws one uniform number from MLX's global key.
pub fn apply_xtc(
    logits: &Array,
    xtc_probability: f64,
    xtc_threshold: f64,
    xtc_special_tokens: &[i32],
) -> Result<Array> {
    check_xtc(xtc_probability, xtc_threshold)?;
    let probs = logits.softmax(Some(&[-1]), false)?;
    let above = probs.greater(&py_float(xtc_threshold, probs.dtype())?)?;
    let inf = py_float(f64::INFINITY, probs.dtype())?;
    let least = where_(&above, &probs, &inf)?.min(Some(&[-1]), true)?;
    let mut mask = probs.greater(&least)?;
    if !xtc_special_tokens.is_empty() {
        let vocab = logits.dim(-1)?;
        let mut ids = Vec::with_capacity(xtc_special_tokens.len());
        for &t in xtc_special_tokens {
            let i = if t < 0 { t + vocab } else { t };
            if !(0..vocab).contains(&i) {
                return Err(SampleError::param(
                    "xtc_special_tokens",
                    &format!("must index the vocabulary of {vocab}"),
                    t,
                ));
            }
            ids.push(i);
        }
        let mut shape = mask.shape();
        let n = ids.len() as i32;
        let lead = vec![1; shape.len() - 1];
        let idx = Array::from_vec(ids)?.reshape(&[lead.as_slice(), &[n]].concat())?;
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        let idx = idx.broadcast_to(&shape)?;
        mask = mask.put_along_axis(&idx, &Array::scalar(false)?, -1)?;
    }
    let u = random::uniform(
        &Array::scalar(0i32)?,
        &Array::scalar(1i32)?,
        &[],
        Dtype::Float32,
        None,
    )?;
    let skip = u.greater(&py_float(xtc_probability, u.dtype())?)?;
    let removed = where_(&mask, &neg_inf(logits.dtype())?, logits)?;
    Ok(where_(&skip, logits, &removed)?)
}

/// mlx-lm's `categorical_sampling`: `mx.random.categorical(logits * (1 / temp))` with
/// MLX's global key.
pub fn categorical_sampling(logits: &Array, temp: f64) -> Result<Array> {
    let scaled = logits.multiply(&py_float(1.0 / temp, logits.dtype())?)?;
    Ok(random::categorical(&scaled, -1, None, None)?)
}

/// mlx-lm's `greedy_sampler`.
pub fn greedy(logprobs: &Array) -> Result<Array> {
    GreedySampler.sample(logprobs)
}

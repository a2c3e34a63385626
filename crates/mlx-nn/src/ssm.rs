//! The SSD state-space scan of Mamba-2 layers, following `mlx_lm/models/ssm.py`: the
//! chunked "surrogate attention" form (`ssm_attn`) that mlx-lm runs everywhere but for
//! single-token steps on Metal, with its compiled `compute_dt`.
use crate::activations::softplus;
use mlx_array::{ops, Array, Closure, Dtype, Result, Scalar};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    /// `compute_dt` compiled per `time_step_limit` (a constant of mlx-lm's trace).
    static COMPUTE_DT: RefCell<HashMap<(u64, u64), &'static Closure>> = RefCell::new(HashMap::new());
}

/// mlx-lm's `compute_dt(dt, dt_bias, time_step_limit)`: `clip(softplus(dt + dt_bias))`
/// in float32 (compiled, as `@mx.compile` does).
#[track_caller]
pub fn compute_dt(dt: &Array, dt_bias: &Array, limit: (f64, f64)) -> Result<Array> {
    let key = (limit.0.to_bits(), limit.1.to_bits());
    let found = COMPUTE_DT.with(|c| c.borrow().get(&key).copied());
    let f = match found {
        Some(f) => f,
        None => {
            let (lo, hi) = limit;
            let body = move |x: &[Array]| -> Result<Vec<Array>> {
                let dt = softplus(&x[0].astype(Dtype::Float32)?.add(&x[1])?)?;
                let lo = Array::weak_scalar(Scalar::Float(lo), dt.dtype())?;
                let hi = Array::weak_scalar(Scalar::Float(hi), dt.dtype())?;
                Ok(vec![dt.clip(Some(&lo), Some(&hi))?])
            };
            let f: &'static Closure = Box::leak(Box::new(Closure::new(body)?.compile(false)?));
            COMPUTE_DT.with(|c| c.borrow_mut().insert(key, f));
            f
        }
    };
    f.call(&[dt, dt_bias])?
        .pop()
        .ok_or_else(|| mlx_array::Error::InvalidArgument("compute_dt: no output".into()))
}

/// mlx-lm's `segsum(x, mask)` over the last axis.
fn segsum(x: &Array, mask: Option<&Array>) -> Result<Array> {
    let l = x.dim(-1)?;
    let mut x = x.clone();
    let mask = mask.map(|m| m.expand_dims(&[1])).transpose()?;
    if let Some(m) = &mask {
        x = x.multiply(m)?;
    }
    let x = x.expand_dims(&[-1])?.repeat(l, Some(-1))?.tril(-1)?;
    let mut s = x.cumsum(-2, false, true)?;
    if let Some(m) = &mask {
        let both = m.expand_dims(&[-2])?.multiply(&m.expand_dims(&[-1])?)?;
        let ninf = Array::weak_scalar(Scalar::Float(f64::NEG_INFINITY), s.dtype())?;
        s = ops::where_(&both, &s, &ninf)?;
    }
    Ok(s)
}

/// The inputs of [`ssm_attn`] besides the sequence.
pub struct SsmParams<'a> {
    /// `A_log` `[h]`.
    pub a_log: &'a Array,
    /// The skip weight `D` `[h]`.
    pub d: &'a Array,
    /// `dt_bias` `[h]`.
    pub dt_bias: &'a Array,
    /// `time_step_limit`.
    pub time_step_limit: (f64, f64),
}

/// mlx-lm's `ssm_attn(x, A_log, B, C, D, dt, dt_bias, state, time_step_limit, mask,
/// lengths, step=256)`: x `[b, l, h, dh]`, B and C `[b, l, g, d]`, dt `[b, l, h]`;
/// returns y `[b, l, h, dh]` and the state `[b, h, dh, d]`.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn ssm_attn(
    x: &Array,
    b_in: &Array,
    c_in: &Array,
    dt: &Array,
    p: &SsmParams<'_>,
    state: Option<&Array>,
    mask: Option<&Array>,
    lengths: Option<&Array>,
) -> Result<(Array, Option<Array>)> {
    const STEP: i32 = 256;
    let xs = x.shape();
    let bs = b_in.shape();
    if xs.len() != 4 || bs.len() != 4 || bs[2] == 0 || xs[2] % bs[2] != 0 {
        return Err(mlx_array::Error::InvalidArgument(format!(
            "ssm: x {xs:?} and B {bs:?} must be [b, l, h, dh] and [b, l, g, d] with g dividing h"
        )));
    }
    let (b, l, h, dh) = (xs[0], xs[1], xs[2], xs[3]);
    let (g, d) = (bs[2], bs[3]);
    let dt = compute_dt(dt, p.dt_bias, p.time_step_limit)?;
    let repeats = h / g;
    let a = p.a_log.exp()?.negative()?.astype(dt.dtype())?;
    let mut dta = dt.multiply(&a.reshape(&[1, 1, -1])?)?;
    if let Some(m) = mask {
        dta = dta.multiply(&m.expand_dims(&[-1])?)?;
    }
    let dtx = dt.reshape(&[b, l, h, 1])?.multiply(x)?;

    let mut state = state.cloned();
    let mut lengths = lengths.cloned();
    let mut ys = Vec::new();
    let mut i = 0;
    while i < l {
        let end = (i + STEP).min(l);
        let dtx = dtx.slice_axis(1, i, end)?;
        let dta = dta.slice_axis(1, i, end)?;
        let bb = b_in.slice_axis(1, i, end)?;
        let cc = c_in.slice_axis(1, i, end)?;
        let mm = mask.map(|m| m.slice_axis(-1, i, end)).transpose()?;
        let s = dtx.dim(1)?;

        let bt = bb.transpose(Some(&[0, 2, 3, 1]))?;
        let cb = cc.swapaxes(1, 2)?.matmul(&bt)?.repeat(repeats, Some(1))?;
        let decay = segsum(&dta.swapaxes(1, 2)?, mm.as_ref())?.exp()?;
        let surrogate = cb.multiply(&decay)?.tril(0)?;
        let mut y = surrogate.matmul(&dtx.swapaxes(1, 2)?)?.swapaxes(1, 2)?;
        let decay = match &lengths {
            Some(len) => {
                let one = Array::weak_scalar(Scalar::Int(1), len.dtype())?;
                let zero = Array::weak_scalar(Scalar::Int(0), len.dtype())?;
                let stepa = Array::weak_scalar(Scalar::Int(STEP.into()), len.dtype())?;
                let pos = len.minimum(&stepa)?.subtract(&one)?.maximum(&zero)?;
                decay.take_along_axis(&pos.expand_dims(&[1, 2, 3])?, 2)?
            }
            None => {
                let n = decay.dim(2)?;
                decay.slice_axis(2, n - 1, n)?
            }
        };
        let decay = decay.transpose(Some(&[0, 3, 1, 2]))?;
        let bt = bt.repeat(h / g, Some(1))?.swapaxes(2, 3)?;
        let dtxdecay = dtx.multiply(&decay)?.swapaxes(1, 2)?.swapaxes(2, 3)?;
        let mut next_state = dtxdecay.matmul(&bt)?;
        if let Some(st) = &state {
            let cum = dta.cumsum(-2, false, true)?.exp()?;
            let n = cum.dim(1)?;
            let last = cum
                .slice_axis(1, n - 1, n)?
                .squeeze(Some(&[1]))?
                .expand_dims(&[-1, -2])?;
            next_state = next_state.add(&last.multiply(st)?)?;
            let c6 = cc.reshape(&[b, s, g, 1, d, 1])?;
            let y_prev = st
                .reshape(&[b, 1, g, repeats, dh, d])?
                .matmul(&c6)?
                .squeeze(Some(&[-1]))?
                .flatten(2, 3)?;
            y = y.add(&cum.expand_dims(&[-1])?.multiply(&y_prev)?)?;
        }
        if let (Some(len), Some(st)) = (&lengths, &state) {
            let zero = Array::weak_scalar(Scalar::Int(0), len.dtype())?;
            let done = len.less(&zero)?.expand_dims(&[1, 2, 3])?;
            next_state = ops::where_(&done, st, &next_state)?;
        }
        ys.push(y.astype(x.dtype())?);
        state = Some(next_state);
        if let Some(len) = &lengths {
            lengths = Some(len.subtract(STEP)?);
        }
        i = end;
    }
    let refs: Vec<&Array> = ys.iter().collect();
    let y = ops::concatenate(&refs, 1)?.add(&x.multiply(&p.d.reshape(&[1, 1, h, 1])?)?)?;
    Ok((y, state))
}

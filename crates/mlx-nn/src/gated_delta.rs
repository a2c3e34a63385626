//! The gated delta rule of linear-attention layers (Qwen3-Next, Qwen3.5), following
//! `mlx_lm/models/gated_delta.py`: the gate `g`, the q/k normalization and the
//! recurrence run as mlx-lm's ops path (`gated_delta_ops`: one compiled step per
//! token), which is what mlx-lm runs everywhere but on Metal. The compiled pieces are
//! compiled as mlx-lm compiles them, so their fused kernels are the same.
use crate::activations::{call_compiled, silu, softplus};
use mlx_array::{fast, ops, Array, Closure, Dtype, Error, Result};
use std::cell::RefCell;

/// mlx-lm's `precise_swiglu(h, gate, x)`: `silu(gate) * x` in float32, cast to `h`'s
/// dtype (compiled, shapeless).
#[track_caller]
pub fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array> {
    call_compiled(
        "precise_swiglu",
        |a| {
            let g = silu(&a[1].astype(Dtype::Float32)?)?;
            let x = a[2].astype(Dtype::Float32)?;
            Ok(vec![g.multiply(&x)?.astype(a[0].dtype())?])
        },
        &[h, gate, x],
    )
}

/// mlx-lm's `compute_g(A_log, a, dt_bias)`: `exp(-exp(A_log) * softplus(a + dt_bias))`
/// in float32 (compiled, shapeless).
#[track_caller]
pub fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    call_compiled(
        "gated_delta_compute_g",
        |x| {
            let decay = x[0].astype(Dtype::Float32)?.exp()?.negative()?;
            Ok(vec![decay
                .multiply(&softplus(&x[1].add(&x[2])?)?)?
                .exp()?])
        },
        &[a_log, a, dt_bias],
    )
}

/// mlx-lm's `normalize_qk(q, k, inv_scale, eps)`: both L2-normalized through
/// `fast.rms_norm` (the eps scaled to a mean), q also scaled by `inv_scale^2`, k by
/// `inv_scale`.
#[track_caller]
pub fn normalize_qk(q: &Array, k: &Array, inv_scale: f64, eps: f64) -> Result<(Array, Array)> {
    let sq = inv_scale.powf(2.0);
    let rms_eps = (eps * sq) as f32;
    let q = fast::rms_norm(q, None, rms_eps)?.multiply(sq)?;
    let k = fast::rms_norm(k, None, rms_eps)?.multiply(inv_scale)?;
    Ok((q, k))
}

/// One recurrent step (mlx-lm's `_gated_delta_step_ops`), inputs
/// `[q, k, v, g, beta, state(, mask)]`.
fn step_body(x: &[Array]) -> Result<Vec<Array>> {
    let (q, k, v, g, beta, state) = (&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]);
    let old_state = state;
    let decay = match g.ndim() {
        2 => g.expand_dims(&[-1, -2])?,
        3 => g.expand_dims(&[-2])?,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "unsupported gating shape {:?}",
                g.shape()
            )))
        }
    };
    let state = state.multiply(&decay)?;
    let k_row = k.expand_dims(&[-2])?;
    let kv_mem = state.multiply(&k_row)?.sum(Some(&[-1]), false)?;
    let delta = v.subtract(&kv_mem)?.multiply(&beta.expand_dims(&[-1])?)?;
    let state = state.add(&k_row.multiply(&delta.expand_dims(&[-1])?)?)?;
    let y = state
        .multiply(&q.expand_dims(&[-2])?)?
        .sum(Some(&[-1]), false)?;
    let state = match x.get(6) {
        Some(mask) => ops::where_(&mask.expand_dims(&[1, 2, 3])?, &state, old_state)?,
        None => state,
    };
    Ok(vec![y.astype(q.dtype())?, state])
}

thread_local! {
    /// The step compiled (not shapeless, as `@mx.compile` in mlx-lm), without and with
    /// a mask; leaked like [`call_compiled`]'s closures.
    static STEP: RefCell<[Option<&'static Closure>; 2]> = const { RefCell::new([None, None]) };
}

fn compiled_step(masked: bool) -> Result<&'static Closure> {
    let i = usize::from(masked);
    if let Some(f) = STEP.with(|s| s.borrow()[i]) {
        return Ok(f);
    }
    let f: &'static Closure = Box::leak(Box::new(Closure::new(step_body)?.compile(false)?));
    STEP.with(|s| s.borrow_mut()[i] = Some(f));
    Ok(f)
}

/// mlx-lm's `gated_delta_ops`: the recurrence over `T` tokens, one compiled step each.
///
/// Shapes: q, k `[B, T, Hk, Dk]`; v `[B, T, Hv, Dv]`; g `[B, T, Hv]` (or
/// `[B, T, Hv, Dk]`); beta `[B, T, Hv]`; state `[B, Hv, Dv, Dk]` (zeros in float32 when
/// `None`); mask `[B, T]`. Returns y `[B, T, Hv, Dv]` and the new state.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn gated_delta_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let qs = q.shape();
    let vs = v.shape();
    if qs.len() != 4 || vs.len() != 4 {
        return Err(Error::InvalidArgument(format!(
            "gated delta: q {qs:?} and v {vs:?} must be [B, T, H, D]"
        )));
    }
    let (b, t, hk, dk) = (qs[0], qs[1], qs[2], qs[3]);
    let (hv, dv) = (vs[2], vs[3]);
    if hk == 0 || hv % hk != 0 {
        return Err(Error::InvalidArgument(format!(
            "gated delta: {hv} value heads are not a multiple of {hk} key heads"
        )));
    }
    let mut state = match state {
        Some(s) => s.clone(),
        None => ops::zeros(&[b, hv, dv, dk], Dtype::Float32)?,
    };
    let (mut q, mut k) = (q.clone(), k.clone());
    let repeat = hv / hk;
    if repeat > 1 {
        q = q.repeat(repeat, Some(-2))?;
        k = k.repeat(repeat, Some(-2))?;
    }
    let step = compiled_step(mask.is_some())?;
    let at =
        |a: &Array, i: i32| -> Result<Array> { a.slice_axis(1, i, i + 1)?.squeeze(Some(&[1])) };
    let mut ys = Vec::with_capacity(t.max(0) as usize);
    for i in 0..t {
        let (qt, kt, vt, gt, bt) = (at(&q, i)?, at(&k, i)?, at(v, i)?, at(g, i)?, at(beta, i)?);
        let mt = mask.map(|m| at(m, i)).transpose()?;
        let mut inputs = vec![&qt, &kt, &vt, &gt, &bt, &state];
        if let Some(m) = &mt {
            inputs.push(m);
        }
        let mut out = step.call(&inputs)?;
        let new_state = out
            .pop()
            .ok_or_else(|| Error::InvalidArgument("gated delta step: no state".into()))?;
        let y = out
            .pop()
            .ok_or_else(|| Error::InvalidArgument("gated delta step: no output".into()))?;
        ys.push(y);
        state = new_state;
    }
    let refs: Vec<&Array> = ys.iter().collect();
    Ok((ops::stack(&refs, 1)?, state))
}

/// mlx-lm's `gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask)` with the
/// default bounds (beta in [0, 1], no lower bound), on the ops path.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let beta = b.sigmoid()?;
    let g = compute_g(a_log, a, dt_bias)?;
    gated_delta_ops(q, k, v, &g, &beta, state, mask)
}

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
/// `[q, k, v, g, beta, state(, mask)]` shaped as mlx-lm's: q, k `[B, H, Dk]`, v
/// `[B, H, Dv]`, g `[B, H]` or `[B, H, Dk]`, beta `[B, H]`, mask `[B]`.
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

/// The same step with its inputs shaped for broadcasting before the loop (the default;
/// see [`lean`]), each with the token axis of length 1 kept: q, k `[B, 1, H, 1, Dk]`, v
/// `[B, 1, H, Dv, 1]`, g `[B, 1, H, 1, 1]` or `[B, 1, H, 1, Dk]`, beta
/// `[B, 1, H, 1, 1]`, state `[B, 1, H, Dv, Dk]`, mask `[B, 1, 1, 1, 1]`; y comes out
/// `[B, 1, H, Dv, 1]`.
/// Every product, difference and sum is mlx-lm's, operand for operand, on the same
/// broadcast shapes, and the two sums reduce the same rows (MLX's reduction keeps the
/// axis and its `keepdims=False` only adds a squeeze), so the values are the same bits;
/// what goes is the graph's bookkeeping per token and layer: the five expand_dims and
/// the two squeezes, which the compiled step cannot fuse (each was a node MLX schedules,
/// and the expand_dims of delta also split the delta and state-update kernels in two),
/// and outside the step the inputs' squeezes and the stack's expand_dims.
fn lean_step_body(x: &[Array]) -> Result<Vec<Array>> {
    let (q, k, v, g, beta, state) = (&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]);
    let old_state = state;
    let state = state.multiply(g)?;
    let kv_mem = state.multiply(k)?.sum(Some(&[-1]), true)?;
    let delta = v.subtract(&kv_mem)?.multiply(beta)?;
    let state = state.add(&k.multiply(&delta)?)?;
    let y = state.multiply(q)?.sum(Some(&[-1]), true)?;
    let state = match x.get(6) {
        Some(mask) => ops::where_(mask, &state, old_state)?,
        None => state,
    };
    Ok(vec![y.astype(q.dtype())?, state])
}

/// Whether the recurrence runs `lean_step_body` (default) or mlx-lm's graph op for op
/// (`step_body`, `MLX_GDN_LEAN=0`: for A/B runs and for checking the two agree bit for
/// bit on a backend). Read once.
pub fn lean() -> bool {
    static LEAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LEAN.get_or_init(|| std::env::var("MLX_GDN_LEAN").map_or(true, |v| v != "0"))
}

thread_local! {
    /// The steps compiled (not shapeless, as `@mx.compile` in mlx-lm), [lean][masked];
    /// leaked like [`call_compiled`]'s closures.
    static STEP: RefCell<[[Option<&'static Closure>; 2]; 2]> =
        const { RefCell::new([[None, None], [None, None]]) };
}

fn compiled_step(lean: bool, masked: bool) -> Result<&'static Closure> {
    let (i, j) = (usize::from(lean), usize::from(masked));
    if let Some(f) = STEP.with(|s| s.borrow()[i][j]) {
        return Ok(f);
    }
    let body = if lean { lean_step_body } else { step_body };
    let f: &'static Closure = Box::leak(Box::new(Closure::new(body)?.compile(false)?));
    STEP.with(|s| s.borrow_mut()[i][j] = Some(f));
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
    gated_delta_ops_as(lean(), q, k, v, g, beta, state, mask)
}

/// [`gated_delta_ops`] with the step chosen by the caller instead of [`lean`]: `false`
/// builds mlx-lm's step op for op (tests compare the two forms bit for bit).
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn gated_delta_ops_as(
    lean: bool,
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
    if !matches!(g.ndim(), 3 | 4) {
        return Err(Error::InvalidArgument(format!(
            "gated delta: unsupported gating shape {:?}",
            g.shape()
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
    if lean {
        return lean_loop(&q, &k, v, g, beta, state, mask, t);
    }
    let step = compiled_step(false, mask.is_some())?;
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
        let (y, new_state) = two(step.call(&inputs)?)?;
        ys.push(y);
        state = new_state;
    }
    let refs: Vec<&Array> = ys.iter().collect();
    Ok((ops::stack(&refs, 1)?, state))
}

/// The loop of [`gated_delta_ops`] on [`lean_step_body`]: each input reshaped once
/// (views) and split into its `T` tokens, which keep their token axis.
#[allow(clippy::too_many_arguments)]
fn lean_loop(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Array,
    mask: Option<&Array>,
    t: i32,
) -> Result<(Array, Array)> {
    let step = compiled_step(true, mask.is_some())?;
    // [B, T, ...] -> T arrays [B, 1, ...] (one split; the token axis stays, so the step
    // runs on [B, 1, H, ...] and no squeeze is needed).
    let tokens = |a: &Array| -> Result<Vec<Array>> {
        if t == 1 {
            return Ok(vec![a.clone()]);
        }
        a.split_sections(t, 1)
    };
    let qs = tokens(&q.expand_dims(&[-2])?)?;
    let ks = tokens(&k.expand_dims(&[-2])?)?;
    let vs = tokens(&v.expand_dims(&[-1])?)?;
    let g = match g.ndim() {
        3 => g.expand_dims(&[-1, -2])?,
        _ => g.expand_dims(&[-2])?,
    };
    let gs = tokens(&g)?;
    let bs = tokens(&beta.expand_dims(&[-1, -2])?)?;
    let ms = mask
        .map(|m| tokens(&m.expand_dims(&[-1, -2, -3])?))
        .transpose()?;
    // The state [B, Hv, Dv, Dk] as [B, 1, Hv, Dv, Dk] (a view) through the loop.
    let mut state = state.expand_dims(&[1])?;
    let mut ys = Vec::with_capacity(t.max(0) as usize);
    for i in 0..t as usize {
        let mut inputs = vec![&qs[i], &ks[i], &vs[i], &gs[i], &bs[i], &state];
        if let Some(m) = &ms {
            inputs.push(&m[i]);
        }
        let (y, new_state) = two(step.call(&inputs)?)?;
        ys.push(y);
        state = new_state;
    }
    // y_t [B, 1, Hv, Dv, 1] -> [B, T, Hv, Dv]: mlx-lm's stack along axis 1 is a
    // concatenate of the tokens' rows, and so is this (then a view).
    let y = match ys.as_slice() {
        [] => return Err(Error::InvalidArgument("gated delta: no tokens".into())),
        [y] => y.clone(),
        _ => ops::concatenate(&ys.iter().collect::<Vec<_>>(), 1)?,
    };
    let shape = y.shape();
    let out: Vec<i32> = match shape.as_slice() {
        [b, t, h, d, 1] => vec![*b, *t, *h, *d],
        _ => {
            return Err(Error::InvalidArgument(format!(
                "gated delta step: output {shape:?}"
            )))
        }
    };
    Ok((y.reshape(&out)?, state.squeeze(Some(&[1]))?))
}

/// The step's two outputs (y, state).
fn two(mut out: Vec<Array>) -> Result<(Array, Array)> {
    let state = out
        .pop()
        .ok_or_else(|| Error::InvalidArgument("gated delta step: no state".into()))?;
    let y = out
        .pop()
        .ok_or_else(|| Error::InvalidArgument("gated delta step: no output".into()))?;
    Ok((y, state))
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

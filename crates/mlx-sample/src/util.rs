//! Python-scalar and indexing semantics shared by samplers and processors.
use mlx_array::{ops::arange, Array, Dtype, Result};

/// A Python `float` next to an array of dtype `like`, as MLX's Python API makes it: the
/// value goes through `float` (f32) unless the target is float64, then takes `like`'s
/// dtype when that is floating (float32 otherwise).
#[track_caller]
pub(crate) fn py_float(v: f64, like: Dtype) -> Result<Array> {
    if like == Dtype::Float64 {
        return Array::scalar_f64(v, like);
    }
    let dtype = if like.is_floating() {
        like
    } else {
        Dtype::Float32
    };
    Array::scalar_f64(f64::from(v as f32), dtype)
}

/// Python's `a[..., start:stop]` on the last axis with Python's bound handling.
#[track_caller]
pub(crate) fn last_axis(a: &Array, start: i32, stop: Option<i32>) -> Result<Array> {
    let shape = a.shape();
    let Some(&n) = shape.last() else {
        return Err(mlx_array::Error::InvalidArgument(
            "cannot slice a 0-d array".into(),
        ));
    };
    let norm = |i: i32| if i < 0 { (i + n).max(0) } else { i.min(n) };
    let b = norm(start);
    let e = norm(stop.unwrap_or(n)).max(b);
    let mut lo = vec![0; shape.len()];
    let mut hi = shape.clone();
    lo[shape.len() - 1] = b;
    hi[shape.len() - 1] = e;
    a.slice(&lo, &hi, None)
}

/// The scatter arguments MLX's Python indexing builds for `logits[:, tokens]` on a
/// `[B, V]` array: row and column indices broadcast to `[B, T]`, and `update` broadcast
/// to `[B, T]` then reshaped to `[B, T, 1, 1]`, on axes `[0, 1]`.
#[track_caller]
pub(crate) fn column_scatter_args(
    logits: &Array,
    tokens: &Array,
    update: &Array,
) -> Result<([Array; 2], Array)> {
    let b = logits.dim(0)?;
    let t = tokens.dim(0)?;
    let rows = arange(0.0, f64::from(b), 1.0, Dtype::Uint32)?
        .reshape(&[b, 1])?
        .broadcast_to(&[b, t])?;
    let cols = tokens.reshape(&[1, t])?.broadcast_to(&[b, t])?;
    let upd = update.broadcast_to(&[b, t])?.reshape(&[b, t, 1, 1])?;
    Ok(([rows, cols], upd))
}

/// Python's `tokens[-context_size:]` on a 1-D array.
#[track_caller]
pub(crate) fn last_tokens(tokens: &Array, context_size: i32) -> Result<Array> {
    last_axis(tokens, -context_size, None)
}

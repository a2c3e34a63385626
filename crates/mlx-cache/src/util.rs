//! Small helpers shared by the cache implementations.

/// The `KvCache` methods that read the same way in every cache whose state is
/// `keys: Option<Array>` and `values: Option<Array>` (mlx-lm's `KVCache` family): bytes
/// held, emptiness, the `[keys, values]` state, and the `Any` views, plus the class name
/// mlx-lm's prompt-cache files record. Expanded inside `impl KvCache for ...`.
macro_rules! kv_pair_methods {
    ($class:literal) => {
        fn nbytes(&self) -> usize {
            match (&self.keys, &self.values) {
                (Some(k), Some(v)) => k.nbytes() + v.nbytes(),
                _ => 0,
            }
        }

        fn is_empty(&self) -> bool {
            self.keys.is_none()
        }

        fn state(&self) -> Vec<mlx_array::Array> {
            self.keys
                .iter()
                .chain(self.values.iter())
                .cloned()
                .collect()
        }

        fn class_name(&self) -> &'static str {
            $class
        }

        fn as_any(&self) -> &dyn std::any::Any {
            self
        }

        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
    };
}
pub(crate) use kv_pair_methods;
use mlx_array::{Array, Error, Result};

/// The 4 dimensions `[B, n_kv_heads, S, head_dim]` of a key or value tensor.
#[track_caller]
pub(crate) fn dims4(a: &Array, what: &str) -> Result<[i32; 4]> {
    let s = a.shape();
    match s.as_slice() {
        &[b, h, t, d] => Ok([b, h, t, d]),
        _ => Err(Error::InvalidArgument(format!(
            "{what} must have shape [B, n_kv_heads, S, head_dim], got {s:?}"
        ))),
    }
}

/// Python's `a[..., start:stop, :]` (slice of the second-to-last axis, with Python's
/// clamping of out-of-range and negative bounds).
#[track_caller]
pub(crate) fn seq(a: &Array, start: Option<i32>, stop: Option<i32>) -> Result<Array> {
    let shape = a.shape();
    if shape.len() < 2 {
        return Err(Error::InvalidArgument(format!(
            "cannot slice the sequence axis of an array of shape {shape:?}"
        )));
    }
    let ax = shape.len() - 2;
    let n = shape[ax];
    let norm = |i: i32| if i < 0 { (i + n).max(0) } else { i.min(n) };
    let b = norm(start.unwrap_or(0));
    let e = norm(stop.unwrap_or(n)).max(b);
    let mut lo = vec![0; shape.len()];
    let mut hi = shape.clone();
    lo[ax] = b;
    hi[ax] = e;
    a.slice(&lo, &hi, None)
}

/// Python's `a[..., start:stop, :] = update` (a functional `slice_update`).
#[track_caller]
pub(crate) fn seq_update(a: &Array, update: &Array, start: i32, stop: i32) -> Result<Array> {
    let shape = a.shape();
    if shape.len() < 2 {
        return Err(Error::InvalidArgument(format!(
            "cannot update the sequence axis of an array of shape {shape:?}"
        )));
    }
    let ax = shape.len() - 2;
    let mut lo = vec![0; shape.len()];
    let mut hi = shape;
    lo[ax] = start;
    hi[ax] = stop;
    a.slice_update(update, &lo, &hi, None)
}

/// `mx.concatenate(arrays, axis=2)`.
#[track_caller]
pub(crate) fn cat2(arrays: &[&Array]) -> Result<Array> {
    mlx_array::concatenate(arrays, 2)
}

/// The buffers an `update` of `keys`/`values` (`[B, H, S, D]`) writes at `prev`: the
/// held ones while they have room for the `S` new positions, else the held ones (cut to
/// `prev` when that is not a multiple of `step`) followed by zeros for `S` rounded up to
/// whole `step`s, as mlx-lm's `KVCache.update_and_fetch` grows them.
#[track_caller]
pub(crate) fn grown_buffers(
    held: (&Option<Array>, &Option<Array>),
    keys: &Array,
    values: &Array,
    prev: i32,
    step: i32,
) -> Result<(Array, Array)> {
    let [b, h, s, kd] = dims4(keys, "keys")?;
    let [_, _, _, vd] = dims4(values, "values")?;
    match held {
        (Some(k), Some(v)) if prev + s <= k.dim(2)? => Ok((k.clone(), v.clone())),
        (old_k, old_v) => {
            let n = (step + s - 1) / step * step;
            let new_k = mlx_array::ops::zeros(&[b, h, n, kd], keys.dtype())?;
            let new_v = mlx_array::ops::zeros(&[b, h, n, vd], values.dtype())?;
            match (old_k, old_v) {
                (Some(k), Some(v)) => {
                    let (k, v) = if prev % step != 0 {
                        (seq(k, None, Some(prev))?, seq(v, None, Some(prev))?)
                    } else {
                        (k.clone(), v.clone())
                    };
                    Ok((cat2(&[&k, &new_k])?, cat2(&[&v, &new_v])?))
                }
                _ => Ok((new_k, new_v)),
            }
        }
    }
}

/// The held `keys`/`values`, or an error saying `what` was read while empty.
#[track_caller]
pub(crate) fn held<'a>(
    keys: &'a Option<Array>,
    values: &'a Option<Array>,
    what: &str,
) -> Result<(&'a Array, &'a Array)> {
    match (keys, values) {
        (Some(k), Some(v)) => Ok((k, v)),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: keys_and_values called on an empty cache"
        ))),
    }
}

/// The first `n` positions of the held buffers while they are longer, else the whole
/// buffers (mlx-lm's `keys_and_values` of `KVCache` and `RotatingKVCache`).
#[track_caller]
pub(crate) fn first_positions(
    keys: &Option<Array>,
    values: &Option<Array>,
    n: i32,
    what: &str,
) -> Result<(Array, Array)> {
    let (k, v) = held(keys, values, what)?;
    if n < k.dim(2)? {
        Ok((seq(k, None, Some(n))?, seq(v, None, Some(n))?))
    } else {
        Ok((k.clone(), v.clone()))
    }
}

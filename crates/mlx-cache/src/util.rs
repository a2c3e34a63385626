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

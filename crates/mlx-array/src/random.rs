//! Random numbers with MLX's counter-based keys (`mx.random`). With the same seed and
//! the same calls, results equal Python MLX's.
use crate::array::{opt, out1, Array};
use crate::dtype::Dtype;
use crate::error::{check, Result};
use mlx_sys as sys;

/// Seeds MLX's global key.
#[track_caller]
pub fn seed(seed: u64) -> Result<()> {
    check(unsafe { sys::mlxs_random_seed(seed) })
}

/// A key for `seed`.
#[track_caller]
pub fn key(seed: u64) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_random_key(o, seed) })
}

/// Splits a key into `num` keys (stacked on axis 0).
#[track_caller]
pub fn split(key: &Array, num: i32) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_random_split(o, key.as_raw(), num, Array::s()) })
}

/// Random bits of `width` bytes per element.
#[track_caller]
pub fn bits(shape: &[i32], width: i32, key: Option<&Array>) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_random_bits(o, shape.as_ptr(), shape.len(), width, opt(key), Array::s())
    })
}

/// The C signature of the draws between two bounds ([`uniform`], [`randint`],
/// [`truncated_normal`]): `(out, low, high, shape, ndim, dtype, key, stream)`.
type BoundedDraw = unsafe extern "C" fn(
    *mut sys::mlxs_array,
    sys::mlxs_array,
    sys::mlxs_array,
    *const i32,
    usize,
    i32,
    sys::mlxs_array,
    sys::mlxs_stream,
) -> std::os::raw::c_int;

/// `draw` of `shape` and `dtype` between `low` and `high`.
#[track_caller]
fn bounded(
    draw: BoundedDraw,
    low: &Array,
    high: &Array,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
) -> Result<Array> {
    // SAFETY: every handle passed is alive for the call, `shape` is read for
    // `shape.len()` elements, and `out1` owns what the call writes to `o`.
    out1(|o| unsafe {
        draw(
            o,
            low.as_raw(),
            high.as_raw(),
            shape.as_ptr(),
            shape.len(),
            dtype.to_raw(),
            opt(key),
            Array::s(),
        )
    })
}

/// Uniform in `[low, high)`.
#[track_caller]
pub fn uniform(
    low: &Array,
    high: &Array,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
) -> Result<Array> {
    bounded(sys::mlxs_random_uniform, low, high, shape, dtype, key)
}

/// Normal with optional `loc` and `scale`.
#[track_caller]
pub fn normal(
    shape: &[i32],
    dtype: Dtype,
    loc: Option<&Array>,
    scale: Option<&Array>,
    key: Option<&Array>,
) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_random_normal(
            o,
            shape.as_ptr(),
            shape.len(),
            dtype.to_raw(),
            opt(loc),
            opt(scale),
            opt(key),
            Array::s(),
        )
    })
}

/// Integers in `[low, high)`.
#[track_caller]
pub fn randint(
    low: &Array,
    high: &Array,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
) -> Result<Array> {
    bounded(sys::mlxs_random_randint, low, high, shape, dtype, key)
}

/// Bernoulli draws with probability `p`.
#[track_caller]
pub fn bernoulli(p: &Array, shape: &[i32], key: Option<&Array>) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_random_bernoulli(
            o,
            p.as_raw(),
            shape.as_ptr(),
            shape.len(),
            opt(key),
            Array::s(),
        )
    })
}

/// Standard Gumbel draws.
#[track_caller]
pub fn gumbel(shape: &[i32], dtype: Dtype, key: Option<&Array>) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_random_gumbel(
            o,
            shape.as_ptr(),
            shape.len(),
            dtype.to_raw(),
            opt(key),
            Array::s(),
        )
    })
}

/// Samples from the categorical distribution given by unnormalized `logits` along
/// `axis`; `num_samples = None` draws one and removes the axis.
#[track_caller]
pub fn categorical(
    logits: &Array,
    axis: i32,
    num_samples: Option<i32>,
    key: Option<&Array>,
) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_random_categorical(
            o,
            logits.as_raw(),
            axis,
            num_samples.unwrap_or(0),
            opt(key),
            Array::s(),
        )
    })
}

/// Normal truncated to `[lower, upper]`.
#[track_caller]
pub fn truncated_normal(
    lower: &Array,
    upper: &Array,
    shape: &[i32],
    dtype: Dtype,
    key: Option<&Array>,
) -> Result<Array> {
    bounded(
        sys::mlxs_random_truncated_normal,
        lower,
        upper,
        shape,
        dtype,
        key,
    )
}

/// A random permutation of `x` along `axis`.
#[track_caller]
pub fn permutation(x: &Array, axis: i32, key: Option<&Array>) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_random_permutation(o, x.as_raw(), axis, opt(key), Array::s()) })
}

/// A random permutation of `0..n` as uint32, like Python's `mx.random.permutation(n)`.
#[track_caller]
pub fn permutation_n(n: i32, key: Option<&Array>) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_random_permutation_n(o, n, opt(key), Array::s()) })
}

/// The next key of this thread's global key sequence: what a draw with `key = None` would
/// use, and what Python's `mx.compile(inputs=mx.random.state, ...)` samplers consume. Pass
/// it to a draw inside a compiled closure so each call gets fresh randomness with the same
/// bits as the Python sampler. The global sequence is per thread ([`seed`] seeds the
/// calling thread's).
#[track_caller]
pub fn next_key() -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_random_next_key(o) })
}

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

/// A copy of a thread's global key sequence (its key), to draw from later: what Python's
/// `mx.random.state` holds. [`KeyState::save`] copies the calling thread's sequence,
/// [`KeyState::restore`] makes a copy the thread's sequence again, so draws with
/// `key = None` (and [`next_key`]) continue from where that copy was. A seeded request
/// keeps its own sequence this way: seeded once, continued draw after draw as if it had
/// the thread to itself (mlx-lm's server seeds the global sequence per request).
pub struct KeyState {
    raw: std::ptr::NonNull<sys::mlxs_keyseq_s>,
}

// SAFETY: the handle owns a copy of a key sequence (one MLX array) that no thread shares;
// it moves between threads like an `Array` and is never used from two at once.
unsafe impl Send for KeyState {}

impl KeyState {
    /// A copy of the calling thread's global key sequence.
    #[track_caller]
    pub fn save() -> Result<KeyState> {
        let mut p = std::ptr::null_mut();
        // SAFETY: on success the shim writes a new owned handle to `p`.
        check(unsafe { sys::mlxs_random_state_save(&mut p) })?;
        Self::owned(p)
    }

    /// The sequence `seed` starts (`mx.random.seed(seed)`), leaving the thread's own as
    /// it was.
    #[track_caller]
    pub fn seeded(seed: u64) -> Result<KeyState> {
        let before = KeyState::save()?;
        self::seed(seed)?;
        let seeded = KeyState::save();
        before.restore()?;
        seeded
    }

    /// Makes a copy of this sequence the calling thread's global key sequence.
    #[track_caller]
    pub fn restore(&self) -> Result<()> {
        // SAFETY: `self.raw` is a live handle owned by `self`.
        check(unsafe { sys::mlxs_random_state_restore(self.raw.as_ptr()) })
    }

    /// An independent copy (draws from one do not advance the other).
    #[track_caller]
    pub fn try_clone(&self) -> Result<KeyState> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `self.raw` is live; on success the shim writes a new owned handle.
        check(unsafe { sys::mlxs_keyseq_clone(&mut p, self.raw.as_ptr()) })?;
        Self::owned(p)
    }

    #[track_caller]
    fn owned(p: sys::mlxs_keyseq) -> Result<KeyState> {
        std::ptr::NonNull::new(p)
            .map(|raw| KeyState { raw })
            .ok_or_else(|| crate::Error::Mlx {
                message: "MLX returned no key sequence".into(),
                location: std::panic::Location::caller(),
            })
    }
}

impl Drop for KeyState {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_keyseq_free(self.raw.as_ptr()) }
    }
}

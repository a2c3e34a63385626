//! Operations on arrays, with MLX's names and semantics. Every operation is lazy; it runs
//! on the current stream (see [`crate::with_stream`]) when the result is evaluated.
use crate::array::{opt, out1, outv, Array, Operand, VecHandle};
use crate::dtype::Dtype;
use crate::error::Result;
use mlx_sys as sys;

mod construct;
mod indexing;

pub use construct::*;
pub use indexing::ScatterKind;

pub(crate) fn s() -> sys::mlxs_stream {
    Array::s()
}

fn axes_ptr(axes: Option<&[i32]>) -> (*const i32, usize) {
    match axes {
        Some(a) => (a.as_ptr(), a.len()),
        None => (std::ptr::null(), 0),
    }
}

macro_rules! unary {
    ($($(#[$m:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {$(
            $(#[$m])*
            #[track_caller]
            pub fn $name(&self) -> Result<Array> {
                out1(|o| unsafe { sys::mlxs_unary(o, sys::$code as i32, self.as_raw(), s()) })
            }
        )*}
    };
}

unary! {
    /// Element-wise absolute value.
    abs => MLXS_ABS,
    /// Element-wise negation.
    negative => MLXS_NEGATIVE,
    /// Element-wise sign.
    sign => MLXS_SIGN,
    /// Element-wise floor.
    floor => MLXS_FLOOR,
    /// Element-wise ceiling.
    ceil => MLXS_CEIL,
    /// Element-wise square root.
    sqrt => MLXS_SQRT,
    /// Element-wise reciprocal square root.
    rsqrt => MLXS_RSQRT,
    /// Element-wise square.
    square => MLXS_SQUARE,
    /// Element-wise reciprocal.
    reciprocal => MLXS_RECIPROCAL,
    /// Element-wise exponential.
    exp => MLXS_EXP,
    /// Element-wise `exp(x) - 1`.
    expm1 => MLXS_EXPM1,
    /// Element-wise natural logarithm.
    log => MLXS_LOG,
    /// Element-wise `log(1 + x)`.
    log1p => MLXS_LOG1P,
    /// Element-wise base-2 logarithm.
    log2 => MLXS_LOG2,
    /// Element-wise base-10 logarithm.
    log10 => MLXS_LOG10,
    /// Element-wise sine.
    sin => MLXS_SIN,
    /// Element-wise cosine.
    cos => MLXS_COS,
    /// Element-wise tangent.
    tan => MLXS_TAN,
    /// Element-wise arcsine.
    arcsin => MLXS_ARCSIN,
    /// Element-wise arccosine.
    arccos => MLXS_ARCCOS,
    /// Element-wise arctangent.
    arctan => MLXS_ARCTAN,
    /// Element-wise hyperbolic sine.
    sinh => MLXS_SINH,
    /// Element-wise hyperbolic cosine.
    cosh => MLXS_COSH,
    /// Element-wise hyperbolic tangent.
    tanh => MLXS_TANH,
    /// Element-wise inverse hyperbolic sine.
    arcsinh => MLXS_ARCSINH,
    /// Element-wise inverse hyperbolic cosine.
    arccosh => MLXS_ARCCOSH,
    /// Element-wise inverse hyperbolic tangent.
    arctanh => MLXS_ARCTANH,
    /// Element-wise logistic sigmoid.
    sigmoid => MLXS_SIGMOID,
    /// Element-wise error function.
    erf => MLXS_ERF,
    /// Element-wise inverse error function.
    erfinv => MLXS_ERFINV,
    /// Element-wise logical not.
    logical_not => MLXS_LOGICAL_NOT,
    /// Element-wise bitwise inversion.
    bitwise_invert => MLXS_BITWISE_INVERT,
    /// Element-wise NaN test.
    isnan => MLXS_ISNAN,
    /// Element-wise infinity test.
    isinf => MLXS_ISINF,
    /// Element-wise finiteness test.
    isfinite => MLXS_ISFINITE,
    /// Element-wise +inf test.
    isposinf => MLXS_ISPOSINF,
    /// Element-wise -inf test.
    isneginf => MLXS_ISNEGINF,
    /// The same values, but no gradient flows through.
    stop_gradient => MLXS_STOP_GRADIENT,
    /// A copy.
    copy => MLXS_COPY,
    /// Real part.
    real => MLXS_REAL,
    /// Imaginary part.
    imag => MLXS_IMAG,
    /// Complex conjugate.
    conjugate => MLXS_CONJUGATE,
    /// Radians to degrees.
    degrees => MLXS_DEGREES,
    /// Degrees to radians.
    radians => MLXS_RADIANS,
    /// Round toward zero.
    trunc => MLXS_TRUNC,
    /// A row-contiguous version of the array.
    contiguous => MLXS_CONTIGUOUS,
}

macro_rules! binary {
    ($($(#[$m:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {$(
            $(#[$m])*
            /// Broadcasts; a host scalar operand takes this array's dtype like in Python.
            #[track_caller]
            pub fn $name<'o>(&self, other: impl Operand<'o>) -> Result<Array> {
                let b = other.resolve(self.dtype())?;
                out1(|o| unsafe {
                    sys::mlxs_binary(o, sys::$code as i32, self.as_raw(), b.as_raw(), s())
                })
            }
        )*}
    };
}

binary! {
    /// Element-wise sum.
    add => MLXS_ADD,
    /// Element-wise difference.
    subtract => MLXS_SUBTRACT,
    /// Element-wise product.
    multiply => MLXS_MULTIPLY,
    /// Element-wise quotient.
    divide => MLXS_DIVIDE,
    /// Element-wise floor division.
    floor_divide => MLXS_FLOOR_DIVIDE,
    /// Element-wise remainder.
    remainder => MLXS_REMAINDER,
    /// Element-wise power.
    power => MLXS_POWER,
    /// Element-wise maximum.
    maximum => MLXS_MAXIMUM,
    /// Element-wise minimum.
    minimum => MLXS_MINIMUM,
    /// Element-wise `==`.
    equal => MLXS_EQUAL,
    /// Element-wise `!=`.
    not_equal => MLXS_NOT_EQUAL,
    /// Element-wise `>`.
    greater => MLXS_GREATER,
    /// Element-wise `>=`.
    greater_equal => MLXS_GREATER_EQUAL,
    /// Element-wise `<`.
    less => MLXS_LESS,
    /// Element-wise `<=`.
    less_equal => MLXS_LESS_EQUAL,
    /// Element-wise logical and.
    logical_and => MLXS_LOGICAL_AND,
    /// Element-wise logical or.
    logical_or => MLXS_LOGICAL_OR,
    /// Element-wise bitwise and.
    bitwise_and => MLXS_BITWISE_AND,
    /// Element-wise bitwise or.
    bitwise_or => MLXS_BITWISE_OR,
    /// Element-wise bitwise xor.
    bitwise_xor => MLXS_BITWISE_XOR,
    /// Element-wise left shift.
    left_shift => MLXS_LEFT_SHIFT,
    /// Element-wise right shift.
    right_shift => MLXS_RIGHT_SHIFT,
    /// Element-wise `atan2(self, other)`.
    arctan2 => MLXS_ARCTAN2,
    /// Element-wise `log(exp(a) + exp(b))`.
    logaddexp => MLXS_LOGADDEXP,
    /// Matrix product (`@`), batched over leading axes.
    matmul => MLXS_MATMUL,
    /// Inner product over the last axes.
    inner => MLXS_INNER,
    /// Outer product of two vectors.
    outer => MLXS_OUTER,
    /// Kronecker product.
    kron => MLXS_KRON,
}

macro_rules! reduce {
    ($($(#[$m:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {$(
            $(#[$m])*
            /// `axes = None` reduces over every axis.
            #[track_caller]
            pub fn $name(&self, axes: Option<&[i32]>, keepdims: bool) -> Result<Array> {
                let (p, n) = axes_ptr(axes);
                out1(|o| unsafe {
                    sys::mlxs_reduce(o, sys::$code as i32, self.as_raw(), p, n, keepdims, s())
                })
            }
        )*}
    };
}

reduce! {
    /// Sum.
    sum => MLXS_SUM,
    /// Mean.
    mean => MLXS_MEAN,
    /// Maximum.
    max => MLXS_MAX,
    /// Minimum.
    min => MLXS_MIN,
    /// Product.
    prod => MLXS_PROD,
    /// Logical and.
    all => MLXS_ALL,
    /// Logical or.
    any => MLXS_ANY,
    /// `log(sum(exp(x)))`, computed stably.
    logsumexp => MLXS_LOGSUMEXP,
}

macro_rules! scan {
    ($($(#[$m:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {$(
            $(#[$m])*
            #[track_caller]
            pub fn $name(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
                out1(|o| unsafe {
                    sys::mlxs_scan(o, sys::$code as i32, self.as_raw(), axis, reverse, inclusive, s())
                })
            }
        )*}
    };
}

scan! {
    /// Cumulative sum along `axis`.
    cumsum => MLXS_CUMSUM,
    /// Cumulative product along `axis`.
    cumprod => MLXS_CUMPROD,
    /// Cumulative maximum along `axis`.
    cummax => MLXS_CUMMAX,
    /// Cumulative minimum along `axis`.
    cummin => MLXS_CUMMIN,
    /// Cumulative log-sum-exp along `axis`.
    logcumsumexp => MLXS_LOGCUMSUMEXP,
}

pub(crate) fn has(axis: Option<i32>) -> (bool, i32) {
    (axis.is_some(), axis.unwrap_or(0))
}

impl Array {
    /// Round to `decimals` decimal places.
    #[track_caller]
    pub fn round(&self, decimals: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_round(o, self.as_raw(), decimals, s()) })
    }
    /// Clip to `[min, max]`; either bound may be absent.
    #[track_caller]
    pub fn clip(&self, min: Option<&Array>, max: Option<&Array>) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_clip(o, self.as_raw(), opt(min), opt(max), s()) })
    }
    /// Replace NaN and infinities.
    #[track_caller]
    pub fn nan_to_num(&self, nan: f32, posinf: Option<f32>, neginf: Option<f32>) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_nan_to_num(
                o,
                self.as_raw(),
                nan,
                posinf.is_some(),
                posinf.unwrap_or(0.0),
                neginf.is_some(),
                neginf.unwrap_or(0.0),
                s(),
            )
        })
    }
    /// Element-wise closeness test.
    #[track_caller]
    pub fn isclose(&self, other: &Array, rtol: f64, atol: f64, equal_nan: bool) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_isclose(o, self.as_raw(), other.as_raw(), rtol, atol, equal_nan, s())
        })
    }
    /// Whether all elements are close.
    #[track_caller]
    pub fn allclose(&self, other: &Array, rtol: f64, atol: f64, equal_nan: bool) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_allclose(o, self.as_raw(), other.as_raw(), rtol, atol, equal_nan, s())
        })
    }
    /// Whether shapes and values are equal (dtypes may differ).
    #[track_caller]
    pub fn array_equal(&self, other: &Array, equal_nan: bool) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_array_equal(o, self.as_raw(), other.as_raw(), equal_nan, s()) })
    }
    /// Convert to another dtype.
    #[track_caller]
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_astype(o, self.as_raw(), dtype.to_raw(), s()) })
    }
    /// Reinterpret the bytes as another dtype.
    #[track_caller]
    pub fn view(&self, dtype: Dtype) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_view(o, self.as_raw(), dtype.to_raw(), s()) })
    }
    /// Variance with `ddof` delta degrees of freedom.
    #[track_caller]
    pub fn var(&self, axes: Option<&[i32]>, keepdims: bool, ddof: i32) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        out1(|o| unsafe { sys::mlxs_var(o, self.as_raw(), p, n, keepdims, ddof, s()) })
    }
    /// Standard deviation with `ddof` delta degrees of freedom.
    #[track_caller]
    pub fn std(&self, axes: Option<&[i32]>, keepdims: bool, ddof: i32) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        out1(|o| unsafe { sys::mlxs_std(o, self.as_raw(), p, n, keepdims, ddof, s()) })
    }
    /// Index of the maximum; `axis = None` looks at the flattened array.
    #[track_caller]
    pub fn argmax(&self, axis: Option<i32>, keepdims: bool) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_argmax(o, self.as_raw(), h, a, keepdims, s()) })
    }
    /// Index of the minimum; `axis = None` looks at the flattened array.
    #[track_caller]
    pub fn argmin(&self, axis: Option<i32>, keepdims: bool) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_argmin(o, self.as_raw(), h, a, keepdims, s()) })
    }
    /// Softmax over `axes` (`None`: all); `precise` accumulates in float32.
    #[track_caller]
    pub fn softmax(&self, axes: Option<&[i32]>, precise: bool) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        out1(|o| unsafe { sys::mlxs_softmax(o, self.as_raw(), p, n, precise, s()) })
    }
    /// Sorted copy along `axis` (`None`: flattened).
    #[track_caller]
    pub fn sort(&self, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_sort(o, self.as_raw(), h, a, s()) })
    }
    /// Indices that sort along `axis` (`None`: flattened).
    #[track_caller]
    pub fn argsort(&self, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_argsort(o, self.as_raw(), h, a, s()) })
    }
    /// Partition around the `kth` element along `axis`.
    #[track_caller]
    pub fn partition(&self, kth: i32, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_partition(o, self.as_raw(), kth, h, a, s()) })
    }
    /// Indices that partition around the `kth` element along `axis`.
    #[track_caller]
    pub fn argpartition(&self, kth: i32, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_argpartition(o, self.as_raw(), kth, h, a, s()) })
    }
    /// The `k` largest elements along `axis` (unordered).
    #[track_caller]
    pub fn topk(&self, k: i32, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_topk(o, self.as_raw(), k, h, a, s()) })
    }

    /// Same data, new shape (one dimension may be -1).
    #[track_caller]
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_reshape(o, self.as_raw(), shape.as_ptr(), shape.len(), s()) })
    }
    /// Permute axes (`None`: reverse them).
    #[track_caller]
    pub fn transpose(&self, axes: Option<&[i32]>) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        out1(|o| unsafe { sys::mlxs_transpose(o, self.as_raw(), p, n, s()) })
    }
    /// Swap two axes.
    #[track_caller]
    pub fn swapaxes(&self, a1: i32, a2: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_swapaxes(o, self.as_raw(), a1, a2, s()) })
    }
    /// Move one axis to another position.
    #[track_caller]
    pub fn moveaxis(&self, source: i32, destination: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_moveaxis(o, self.as_raw(), source, destination, s()) })
    }
    /// Insert size-one axes.
    #[track_caller]
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_expand_dims(o, self.as_raw(), axes.as_ptr(), axes.len(), s()) })
    }
    /// Remove size-one axes (`None`: all of them).
    #[track_caller]
    pub fn squeeze(&self, axes: Option<&[i32]>) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        out1(|o| unsafe { sys::mlxs_squeeze(o, self.as_raw(), p, n, s()) })
    }
    /// Flatten axes `start..=end` into one.
    #[track_caller]
    pub fn flatten(&self, start: i32, end: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_flatten(o, self.as_raw(), start, end, s()) })
    }
    /// Split one axis into `shape`.
    #[track_caller]
    pub fn unflatten(&self, axis: i32, shape: &[i32]) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_unflatten(o, self.as_raw(), axis, shape.as_ptr(), shape.len(), s())
        })
    }
    /// Split into `n` equal sections along `axis`.
    #[track_caller]
    pub fn split_sections(&self, n: i32, axis: i32) -> Result<Vec<Array>> {
        outv(|o| unsafe { sys::mlxs_split_sections(o, self.as_raw(), n, axis, s()) })
    }
    /// Split at the given indices along `axis`.
    #[track_caller]
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
        outv(|o| unsafe {
            sys::mlxs_split_indices(o, self.as_raw(), indices.as_ptr(), indices.len(), axis, s())
        })
    }
    /// Pad `axes` with `low`/`high` elements; `mode` is "constant", "edge", "reflect" or
    /// "symmetric"; `value` (constant mode) defaults to 0.
    #[track_caller]
    pub fn pad(
        &self,
        axes: &[i32],
        low: &[i32],
        high: &[i32],
        value: Option<&Array>,
        mode: &str,
    ) -> Result<Array> {
        if axes.len() != low.len() || axes.len() != high.len() {
            return Err(crate::Error::InvalidArgument(
                "pad: axes, low and high must have the same length".into(),
            ));
        }
        if !matches!(mode, "constant" | "edge" | "reflect" | "symmetric") {
            // MLX's C++ pad treats any unknown mode as "constant"; Python refuses it.
            return Err(crate::Error::InvalidArgument(format!(
                "Invalid padding mode ({mode}) passed to pad"
            )));
        }
        let mode = cstr(mode)?;
        out1(|o| unsafe {
            sys::mlxs_pad(
                o,
                self.as_raw(),
                axes.as_ptr(),
                low.as_ptr(),
                high.as_ptr(),
                axes.len(),
                opt(value),
                mode.as_ptr(),
                s(),
            )
        })
    }
    /// Repeat each element `repeats` times along `axis` (`None`: flattened).
    #[track_caller]
    pub fn repeat(&self, repeats: i32, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_repeat(o, self.as_raw(), repeats, h, a, s()) })
    }
    /// Tile the array `reps` times per axis.
    #[track_caller]
    pub fn tile(&self, reps: &[i32]) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_tile(o, self.as_raw(), reps.as_ptr(), reps.len(), s()) })
    }
    /// Broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_broadcast_to(o, self.as_raw(), shape.as_ptr(), shape.len(), s())
        })
    }
    /// Reverse along `axes` (`None`: all).
    #[track_caller]
    pub fn flip(&self, axes: Option<&[i32]>) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        out1(|o| unsafe { sys::mlxs_flip(o, self.as_raw(), p, n, s()) })
    }
    /// Roll elements by `shift` along `axis` (`None`: flattened).
    #[track_caller]
    pub fn roll(&self, shift: i32, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_roll(o, self.as_raw(), shift, h, a, s()) })
    }
    /// A strided view.
    #[track_caller]
    pub fn as_strided(&self, shape: &[i32], strides: &[i64], offset: usize) -> Result<Array> {
        if shape.len() != strides.len() {
            return Err(crate::Error::InvalidArgument(
                "as_strided: shape and strides differ in length".into(),
            ));
        }
        out1(|o| unsafe {
            sys::mlxs_as_strided(
                o,
                self.as_raw(),
                shape.as_ptr(),
                shape.len(),
                strides.as_ptr(),
                offset,
                s(),
            )
        })
    }
}

pub(crate) fn cstr(s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s)
        .map_err(|_| crate::Error::InvalidArgument(format!("string {s:?} contains a NUL byte")))
}

/// `cond ? x : y`, element-wise with broadcasting.
#[track_caller]
pub fn where_(cond: &Array, x: &Array, y: &Array) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_where(o, cond.as_raw(), x.as_raw(), y.as_raw(), s()) })
}

/// `beta * c + alpha * (a @ b)`.
#[track_caller]
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_addmm(o, c.as_raw(), a.as_raw(), b.as_raw(), alpha, beta, s()) })
}

/// Join arrays along an existing axis.
#[track_caller]
pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
    let v = VecHandle::from_arrays(arrays.iter().copied())?;
    out1(|o| unsafe { sys::mlxs_concatenate(o, v.0, axis, s()) })
}

/// Join arrays along a new axis.
#[track_caller]
pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array> {
    let v = VecHandle::from_arrays(arrays.iter().copied())?;
    out1(|o| unsafe { sys::mlxs_stack(o, v.0, axis, s()) })
}

/// Broadcast arrays against each other.
#[track_caller]
pub fn broadcast_arrays(arrays: &[&Array]) -> Result<Vec<Array>> {
    let v = VecHandle::from_arrays(arrays.iter().copied())?;
    outv(|o| unsafe { sys::mlxs_broadcast_arrays(o, v.0, s()) })
}

/// Einstein summation.
#[track_caller]
pub fn einsum(subscripts: &str, operands: &[&Array]) -> Result<Array> {
    let v = VecHandle::from_arrays(operands.iter().copied())?;
    let sub = cstr(subscripts)?;
    out1(|o| unsafe { sys::mlxs_einsum(o, sub.as_ptr(), v.0, s()) })
}

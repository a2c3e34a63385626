//! The [`Array`] type: an owned handle to an MLX array.
use crate::device::cur;
use crate::dtype::{Dtype, Element};
use crate::error::{check, Error, Result};
use mlx_sys as sys;
use std::fmt;
use std::ptr::NonNull;

/// A lazily evaluated n-dimensional array living in MLX.
///
/// `Drop` releases the handle, `Clone` shares the same underlying array (cheap).
/// `Array` is `Send` but not `Sync`: see [`crate::device`] for the threading rule.
///
/// An array can move to another thread:
/// ```
/// let a = mlx_array::Array::from_slice(&[1.0f32, 2.0], &[2])?;
/// let v = std::thread::spawn(move || a.square()?.to_vec::<f32>()).join().unwrap()?;
/// assert_eq!(v, vec![1.0, 4.0]);
/// # Ok::<(), mlx_array::Error>(())
/// ```
/// but cannot be shared between threads:
/// ```compile_fail
/// fn shared<T: Sync>(_: &T) {}
/// let a = mlx_array::Array::from_slice(&[1.0f32], &[1]).unwrap();
/// shared(&a); // error: `NonNull<mlxs_array_s>` cannot be shared between threads safely
/// ```
#[repr(transparent)]
pub struct Array {
    raw: NonNull<sys::mlxs_array_s>,
}

// SAFETY: an MLX array handle may move between threads; it is not `Sync` because graph
// construction and evaluation are not thread-safe, so no `&Array` is shared across threads.
unsafe impl Send for Array {}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { sys::mlxs_array_free(self.raw.as_ptr()) }
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        // SAFETY: clone of a valid handle returns a new valid, owned handle, or null
        // when allocating the handle failed.
        let p = unsafe { sys::mlxs_array_clone(self.raw.as_ptr()) };
        match NonNull::new(p) {
            Some(raw) => Array { raw },
            // `Clone` cannot fail: out of memory for a handle ends the process, as Rust's
            // own allocation failures do.
            None => std::alloc::handle_alloc_error(std::alloc::Layout::new::<usize>()),
        }
    }
}

impl Array {
    /// Makes this handle hold `src`'s array, in place: every holder of this handle (not
    /// of its clones, which are other handles) sees the new value from now on. MLX's
    /// function transforms hand a traced function new input arrays; a layer whose
    /// parameters must become those inputs (mlx.nn's `module.update(params)` inside
    /// `mx.checkpoint`) is retargeted this way while other code only borrows it.
    pub fn assign(&self, src: &Array) {
        // SAFETY: both handles are valid; the shim copies the array (a shared pointer)
        // into `dst`'s object, which stays at the same address, so outstanding `&Array`s
        // stay valid. `Array` is not `Sync`, so no other thread reads it meanwhile.
        unsafe { sys::mlxs_array_assign(self.raw.as_ptr(), src.raw.as_ptr()) }
    }
}

/// The number of elements of `shape`: `None` for a negative dimension or an overflow.
fn element_count(shape: &[i32]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// Calls a shim function that writes one output array.
#[track_caller]
pub(crate) fn out1(f: impl FnOnce(*mut sys::mlxs_array) -> std::os::raw::c_int) -> Result<Array> {
    let mut p: sys::mlxs_array = std::ptr::null_mut();
    check(f(&mut p))?;
    // SAFETY: on success the shim wrote a new owned handle.
    Ok(unsafe { Array::from_raw(p) })
}

pub(crate) fn opt(a: Option<&Array>) -> sys::mlxs_array {
    a.map_or(std::ptr::null_mut(), |a| a.as_raw())
}

impl Array {
    /// Takes ownership of a raw handle.
    ///
    /// # Safety
    /// `p` must be a valid, owned, non-null handle from the shim.
    pub unsafe fn from_raw(p: sys::mlxs_array) -> Array {
        #[allow(clippy::expect_used)] // a null here breaks the caller's contract, not input
        Array {
            raw: NonNull::new(p).expect("null array handle from the shim"),
        }
    }

    /// The raw handle, still owned by `self`.
    pub fn as_raw(&self) -> sys::mlxs_array {
        self.raw.as_ptr()
    }

    /// Builds an array from host data in row-major order.
    ///
    /// ```
    /// let a = mlx_array::Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(a.shape(), vec![2, 2]);
    /// assert_eq!(a.sum(None, false)?.item::<f32>()?, 10.0);
    /// # Ok::<(), mlx_array::Error>(())
    /// ```
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let expected = element_count(shape);
        match expected {
            Some(n) if n == data.len() => {}
            _ => {
                return Err(Error::DataLength {
                    shape: shape.to_vec(),
                    expected: expected.unwrap_or(usize::MAX),
                    got: data.len(),
                })
            }
        }
        // SAFETY: `data` holds exactly `nbytes` bytes of `T` and outlives the call; the shim copies them.
        out1(|o| unsafe {
            sys::mlxs_array_from_data(
                o,
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                shape.as_ptr(),
                shape.len(),
                T::DTYPE.to_raw(),
            )
        })
    }

    /// A new array of `shape` whose elements `fill` writes in place (they start at
    /// zero): [`Self::from_slice`] without an intermediate buffer of the caller's (a
    /// batch's grammar masks, half a megabyte a step, are written straight into the
    /// array's host buffer).
    pub fn from_fill<T: Element>(shape: &[i32], fill: impl FnOnce(&mut [T])) -> Result<Array> {
        let n = element_count(shape);
        let (Some(n), Some(nbytes)) = (n, n.and_then(|n| n.checked_mul(std::mem::size_of::<T>())))
        else {
            return Err(Error::DataLength {
                shape: shape.to_vec(),
                expected: usize::MAX,
                got: 0,
            });
        };
        let mut data: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the shim allocates `nbytes` zeroed bytes for the array and hands back
        // their address; `shape` outlives the call.
        let a = out1(|o| unsafe {
            sys::mlxs_array_from_fill(
                o,
                nbytes,
                shape.as_ptr(),
                shape.len(),
                T::DTYPE.to_raw(),
                &mut data,
            )
        })?;
        if n > 0 && !data.is_null() {
            // SAFETY: `data` points at `n` zeroed, suitably aligned elements of `T` (a plain
            // number: every bit pattern is valid) that nothing else reads or writes until
            // this array is used, which needs `a` back from this function.
            let slice = unsafe { std::slice::from_raw_parts_mut(data.cast::<T>(), n) };
            fill(slice);
        }
        Ok(a)
    }

    /// Builds an array from raw little-endian bytes of the given dtype.
    #[track_caller]
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        // SAFETY: `data` holds exactly `nbytes` bytes of `T` and outlives the call; the shim copies them.
        out1(|o| unsafe {
            sys::mlxs_array_from_data(
                o,
                bytes.as_ptr().cast(),
                bytes.len(),
                shape.as_ptr(),
                shape.len(),
                dtype.to_raw(),
            )
        })
    }

    /// A 1-D array of the given values.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>) -> Result<Array> {
        let n = i32::try_from(data.len())
            .map_err(|_| Error::InvalidArgument("too many elements for one array".into()))?;
        Array::from_slice(&data, &[n])
    }

    /// A scalar (0-d) array of a host value, with its natural dtype.
    #[track_caller]
    pub fn scalar<T: Element>(v: T) -> Result<Array> {
        Array::from_slice(&[v], &[])
    }

    /// A scalar of `v` converted to `dtype`.
    #[track_caller]
    pub fn scalar_f64(v: f64, dtype: Dtype) -> Result<Array> {
        // SAFETY: plain constructor call; the shim writes a new owned handle to `o` on success.
        out1(|o| unsafe { sys::mlxs_array_from_f64(o, v, dtype.to_raw()) })
    }

    /// A scalar of integer `v` converted to `dtype`.
    #[track_caller]
    pub fn scalar_i64(v: i64, dtype: Dtype) -> Result<Array> {
        // SAFETY: plain constructor call; the shim writes a new owned handle to `o` on success.
        out1(|o| unsafe { sys::mlxs_array_from_i64(o, v, dtype.to_raw()) })
    }

    /// A Python-style "weak" scalar next to `like`: a float takes `like`'s dtype when that
    /// is floating (else float32); an integer takes `like`'s dtype unless it is bool.
    /// This reproduces what `x * 0.5` does in MLX's Python API, including its refusal of an
    /// integer that does not fit an integer dtype (`uint8_array + 300` is an error).
    #[track_caller]
    pub fn weak_scalar(v: Scalar, like: Dtype) -> Result<Array> {
        match v {
            Scalar::Float(f) => Array::scalar_f64(
                f,
                if like.is_floating() {
                    like
                } else {
                    Dtype::Float32
                },
            ),
            Scalar::Int(i) => {
                let dt = if like == Dtype::Bool {
                    Dtype::Int32
                } else {
                    like
                };
                if let Some((lo, hi)) = dt.int_range() {
                    if i128::from(i) < lo || i128::from(i) > hi {
                        return Err(Error::InvalidArgument(format!(
                            "converting {i} to {dt} would result in overflow"
                        )));
                    }
                }
                Array::scalar_i64(i, dt)
            }
            // SAFETY: plain constructor call; the shim writes a new owned handle to `o` on success.
            Scalar::Bool(b) => out1(|o| unsafe { sys::mlxs_array_from_bool(o, b) }),
        }
    }

    /// Whether the data exists: the array was evaluated or made from host data. An
    /// array that is not is a node of a lazy graph, which belongs to the stream (and on
    /// the GPU, the thread) it was made on.
    pub fn is_available(&self) -> bool {
        // SAFETY: read-only query on the live handle `self`.
        unsafe { sys::mlxs_array_is_available(self.as_raw()) }
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        // SAFETY: read-only query on the live handle `self`.
        unsafe { sys::mlxs_array_ndim(self.as_raw()) }
    }

    /// The shape.
    pub fn shape(&self) -> Vec<i32> {
        let n = self.ndim();
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: the shim returns a pointer to `ndim` ints owned by the array.
        unsafe { std::slice::from_raw_parts(sys::mlxs_array_shape(self.as_raw()), n).to_vec() }
    }

    /// Size of one axis; negative axes count from the end. An axis out of range is an
    /// error.
    #[track_caller]
    pub fn dim(&self, axis: i32) -> Result<i32> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(Error::InvalidArgument(format!(
                "axis {axis} is out of range for an array of {n} dimensions"
            )));
        }
        Ok(shape[a as usize])
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        // SAFETY: read-only query on the live handle `self`.
        Dtype::from_raw(unsafe { sys::mlxs_array_dtype(self.as_raw()) })
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        // SAFETY: read-only query on the live handle `self`.
        unsafe { sys::mlxs_array_size(self.as_raw()) }
    }

    /// Bytes taken by the elements.
    pub fn nbytes(&self) -> usize {
        // SAFETY: read-only query on the live handle `self`.
        unsafe { sys::mlxs_array_nbytes(self.as_raw()) }
    }

    /// Evaluates the array (and the graph it depends on).
    #[track_caller]
    pub fn eval(&self) -> Result<()> {
        // SAFETY: evaluates the live handle `self`; errors come back as a status.
        check(unsafe { sys::mlxs_array_eval(self.as_raw()) })
    }

    /// Evaluates and copies the elements to the host, in row-major order.
    /// The array's dtype must be `T`'s (use [`Array::astype`] first otherwise).
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::DtypeMismatch {
                actual: self.dtype(),
                requested: T::DTYPE,
            });
        }
        let mut v = vec![T::default(); self.size()];
        // SAFETY: `shape` outlives the call and the shim writes at most `shape.len()` entries.
        check(unsafe {
            sys::mlxs_array_read(
                self.as_raw(),
                v.as_mut_ptr().cast(),
                std::mem::size_of_val(v.as_slice()),
            )
        })?;
        Ok(v)
    }

    /// Evaluates and copies the raw bytes of the elements, in row-major order.
    #[track_caller]
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.nbytes()];
        // SAFETY: `v` is a buffer of exactly `v.len()` bytes, the array's byte size checked above.
        check(unsafe { sys::mlxs_array_read(self.as_raw(), v.as_mut_ptr().cast(), v.len()) })?;
        Ok(v)
    }

    /// The single element of a one-element array.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::InvalidArgument(format!(
                "item() needs an array of one element, this one has shape {:?}",
                self.shape()
            )));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// The stream this thread places operations on (see [`crate::with_stream`]).
    pub(crate) fn s() -> sys::mlxs_stream {
        cur()
    }
}

/// A host scalar used as an operand next to an array (see [`Array::weak_scalar`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A Python `float`.
    Float(f64),
    /// A Python `int`.
    Int(i64),
    /// A Python `bool`.
    Bool(bool),
}

/// Something that can stand on either side of a binary operation: an array, or a host
/// scalar that adopts the array's dtype as MLX's Python API does.
pub trait Operand<'a> {
    /// Resolves to an array, given the dtype of the other operand.
    fn resolve(self, other: Dtype) -> Result<ArrayRef<'a>>;
}

/// A borrowed or freshly made array.
pub enum ArrayRef<'a> {
    /// A borrowed array.
    Borrowed(&'a Array),
    /// A new array (from a scalar).
    Owned(Array),
}

impl std::ops::Deref for ArrayRef<'_> {
    type Target = Array;
    fn deref(&self) -> &Array {
        match self {
            ArrayRef::Borrowed(a) => a,
            ArrayRef::Owned(a) => a,
        }
    }
}

impl<'a> Operand<'a> for &'a Array {
    fn resolve(self, _other: Dtype) -> Result<ArrayRef<'a>> {
        Ok(ArrayRef::Borrowed(self))
    }
}
macro_rules! scalar_operand {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl Operand<'static> for $t {
            #[track_caller]
            fn resolve(self, other: Dtype) -> Result<ArrayRef<'static>> {
                Ok(ArrayRef::Owned(Array::weak_scalar(Scalar::$v(self as $c), other)?))
            }
        }
    )*};
}
scalar_operand!(f32 => Float as f64, f64 => Float as f64, i32 => Int as i64, i64 => Int as i64,
    u32 => Int as i64, usize => Int as i64);
impl Operand<'static> for bool {
    fn resolve(self, _other: Dtype) -> Result<ArrayRef<'static>> {
        Ok(ArrayRef::Owned(Array::weak_scalar(
            Scalar::Bool(self),
            Dtype::Bool,
        )?))
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut p: *mut std::os::raw::c_char = std::ptr::null_mut();
        // SAFETY: on success the shim writes a new C string to `p`, freed below.
        if unsafe { sys::mlxs_array_repr(self.as_raw(), &mut p) } != 0 || p.is_null() {
            return write!(f, "array(<unprintable: {}>)", crate::error::last_error());
        }
        // SAFETY: the shim returned a malloc'd NUL-terminated string that we free here.
        let s = unsafe { std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned() };
        // SAFETY: `p` came from mlxs_array_repr and is freed exactly once.
        unsafe { sys::mlxs_string_free(p) };
        f.write_str(&s)
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array(shape={:?}, dtype={})", self.shape(), self.dtype())
    }
}

/// An owned vector-of-arrays handle, used to pass lists through the shim.
pub(crate) struct VecHandle(pub(crate) sys::mlxs_vec);

impl VecHandle {
    #[track_caller]
    pub(crate) fn new() -> Result<VecHandle> {
        let mut p: sys::mlxs_vec = std::ptr::null_mut();
        // SAFETY: the shim writes a new owned (empty) vector on success.
        check(unsafe { sys::mlxs_vec_new(&mut p) })?;
        Ok(VecHandle(p))
    }
    #[track_caller]
    pub(crate) fn from_arrays<'a>(
        arrays: impl IntoIterator<Item = &'a Array>,
    ) -> Result<VecHandle> {
        let v = VecHandle::new()?;
        for a in arrays {
            // SAFETY: `v.0` is a live vector and `a` a live array; the shim copies the handle.
            check(unsafe { sys::mlxs_vec_push(v.0, a.as_raw()) })?;
        }
        Ok(v)
    }
    #[track_caller]
    pub(crate) fn to_arrays(&self) -> Result<Vec<Array>> {
        // SAFETY: `self.0` is a live vector owned by this handle.
        let n = unsafe { sys::mlxs_vec_len(self.0) };
        (0..n)
            .map(|i| {
                // SAFETY: `i < n`; on success the shim writes a new owned handle.
                out1(|o| unsafe { sys::mlxs_vec_get(self.0, i, o) })
            })
            .collect()
    }
    /// Takes ownership of a raw vector written by the shim.
    pub(crate) unsafe fn from_raw(p: sys::mlxs_vec) -> VecHandle {
        VecHandle(p)
    }
}

impl Drop for VecHandle {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we own the vector and free it exactly once (non-null checked above).
            unsafe { sys::mlxs_vec_free(self.0) }
        }
    }
}

/// Calls a shim function that writes a vector of arrays.
#[track_caller]
pub(crate) fn outv(
    f: impl FnOnce(*mut sys::mlxs_vec) -> std::os::raw::c_int,
) -> Result<Vec<Array>> {
    let mut p: sys::mlxs_vec = std::ptr::null_mut();
    check(f(&mut p))?;
    // SAFETY: on success the shim wrote a new owned vector to `p`.
    let v = unsafe { VecHandle::from_raw(p) };
    v.to_arrays()
}

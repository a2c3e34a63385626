//! Array construction (`arange`, `zeros`, `full`, `eye`, ...), convolutions and `depends`.
use super::s;
use crate::array::{out1, outv, Array, VecHandle};
use crate::dtype::Dtype;
use crate::error::Result;
use mlx_sys as sys;

/// `[start, stop)` with `step`.
#[track_caller]
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_arange(o, start, stop, step, dtype.to_raw(), s()) })
}

/// All zeros.
#[track_caller]
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_zeros(o, shape.as_ptr(), shape.len(), dtype.to_raw(), s()) })
}

/// All ones.
#[track_caller]
pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_ones(o, shape.as_ptr(), shape.len(), dtype.to_raw(), s()) })
}

/// Zeros with the shape and dtype of `like`.
#[track_caller]
pub fn zeros_like(like: &Array) -> Result<Array> {
    zeros(&like.shape(), like.dtype())
}

/// Ones with the shape and dtype of `like`.
#[track_caller]
pub fn ones_like(like: &Array) -> Result<Array> {
    ones(&like.shape(), like.dtype())
}

/// `value` broadcast to `shape`, as `dtype`.
#[track_caller]
pub fn full(shape: &[i32], value: &Array, dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_full(
            o,
            shape.as_ptr(),
            shape.len(),
            value.as_raw(),
            dtype.to_raw(),
            s(),
        )
    })
}

/// Identity-like matrix with ones on diagonal `k`.
#[track_caller]
pub fn eye(n: i32, m: Option<i32>, k: i32, dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_eye(o, n, m.unwrap_or(n), k, dtype.to_raw(), s()) })
}

/// Lower-triangular matrix of ones.
#[track_caller]
pub fn tri(n: i32, m: Option<i32>, k: i32, dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_tri(o, n, m.unwrap_or(n), k, dtype.to_raw(), s()) })
}

/// `num` evenly spaced values in `[start, stop]`.
#[track_caller]
pub fn linspace(start: f64, stop: f64, num: i32, dtype: Dtype) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linspace(o, start, stop, num, dtype.to_raw(), s()) })
}

/// 1-D convolution (NLC input, OKC weight).
#[track_caller]
pub fn conv1d(
    input: &Array,
    weight: &Array,
    stride: i32,
    padding: i32,
    dilation: i32,
    groups: i32,
) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_conv1d(
            o,
            input.as_raw(),
            weight.as_raw(),
            stride,
            padding,
            dilation,
            groups,
            s(),
        )
    })
}

/// 2-D convolution (NHWC input, OHWC weight).
#[track_caller]
pub fn conv2d(
    input: &Array,
    weight: &Array,
    stride: [i32; 2],
    padding: [i32; 2],
    dilation: [i32; 2],
    groups: i32,
) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_conv2d(
            o,
            input.as_raw(),
            weight.as_raw(),
            stride.as_ptr(),
            padding.as_ptr(),
            dilation.as_ptr(),
            groups,
            s(),
        )
    })
}

/// The same `inputs`, evaluated only after `dependencies` (`mx.depends`).
#[track_caller]
pub fn depends(inputs: &[&Array], dependencies: &[&Array]) -> Result<Vec<Array>> {
    let i = VecHandle::from_arrays(inputs.iter().copied())?;
    let d = VecHandle::from_arrays(dependencies.iter().copied())?;
    outv(|o| unsafe { sys::mlxs_depends(o, i.0, d.0) })
}

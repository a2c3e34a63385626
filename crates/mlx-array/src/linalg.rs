//! Linear algebra (`mx.linalg`). Most of these run on the CPU stream only, as in MLX.
use crate::array::{out1, outv, Array};
use crate::error::{check, Result};
use crate::ops::cstr;
use mlx_sys as sys;

/// The order of [`norm`].
pub enum NormOrd<'a> {
    /// Frobenius for matrices, 2-norm for vectors.
    Default,
    /// A numeric order (`inf` allowed).
    Num(f64),
    /// `"fro"` or `"nuc"`.
    Name(&'a str),
}

/// Vector or matrix norm over `axes` (`None`: all).
#[track_caller]
pub fn norm(a: &Array, ord: NormOrd<'_>, axes: Option<&[i32]>, keepdims: bool) -> Result<Array> {
    let (kind, num, name) = match ord {
        NormOrd::Default => (0, 0.0, String::new()),
        NormOrd::Num(v) => (1, v, String::new()),
        NormOrd::Name(n) => (2, 0.0, n.to_string()),
    };
    let name = cstr(&name)?;
    let (p, n) = axes.map_or((std::ptr::null(), 0), |a| (a.as_ptr(), a.len()));
    out1(|o| unsafe {
        sys::mlxs_linalg_norm(
            o,
            a.as_raw(),
            kind,
            num,
            name.as_ptr(),
            p,
            n,
            keepdims,
            Array::s(),
        )
    })
}

/// QR decomposition `(q, r)`.
#[track_caller]
pub fn qr(a: &Array) -> Result<(Array, Array)> {
    let mut q = std::ptr::null_mut();
    let mut r = std::ptr::null_mut();
    check(unsafe { sys::mlxs_linalg_qr(&mut q, &mut r, a.as_raw(), Array::s()) })?;
    Ok(unsafe { (Array::from_raw(q), Array::from_raw(r)) })
}

/// Singular value decomposition: `[u, s, vt]`, or `[s]` without `compute_uv`.
#[track_caller]
pub fn svd(a: &Array, compute_uv: bool) -> Result<Vec<Array>> {
    outv(|o| unsafe { sys::mlxs_linalg_svd(o, a.as_raw(), compute_uv, Array::s()) })
}

/// Matrix inverse.
#[track_caller]
pub fn inv(a: &Array) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linalg_inv(o, a.as_raw(), Array::s()) })
}

/// Pseudo-inverse.
#[track_caller]
pub fn pinv(a: &Array) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linalg_pinv(o, a.as_raw(), Array::s()) })
}

/// Cholesky factor.
#[track_caller]
pub fn cholesky(a: &Array, upper: bool) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linalg_cholesky(o, a.as_raw(), upper, Array::s()) })
}

/// Inverse from a Cholesky factor.
#[track_caller]
pub fn cholesky_inv(a: &Array, upper: bool) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linalg_cholesky_inv(o, a.as_raw(), upper, Array::s()) })
}

/// Inverse of a triangular matrix.
#[track_caller]
pub fn tri_inv(a: &Array, upper: bool) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linalg_tri_inv(o, a.as_raw(), upper, Array::s()) })
}

/// Solve `a @ x = b`.
#[track_caller]
pub fn solve(a: &Array, b: &Array) -> Result<Array> {
    out1(|o| unsafe { sys::mlxs_linalg_solve(o, a.as_raw(), b.as_raw(), Array::s()) })
}

/// Solve a triangular system.
#[track_caller]
pub fn solve_triangular(a: &Array, b: &Array, upper: bool) -> Result<Array> {
    out1(|o| unsafe {
        sys::mlxs_linalg_solve_triangular(o, a.as_raw(), b.as_raw(), upper, Array::s())
    })
}

/// Eigen-decomposition of a symmetric matrix: `(eigenvalues, eigenvectors)`.
#[track_caller]
pub fn eigh(a: &Array, uplo: &str) -> Result<(Array, Array)> {
    let u = cstr(uplo)?;
    let mut w = std::ptr::null_mut();
    let mut v = std::ptr::null_mut();
    check(unsafe { sys::mlxs_linalg_eigh(&mut w, &mut v, a.as_raw(), u.as_ptr(), Array::s()) })?;
    Ok(unsafe { (Array::from_raw(w), Array::from_raw(v)) })
}

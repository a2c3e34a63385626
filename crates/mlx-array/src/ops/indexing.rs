//! Indexing: slices (static and dynamic), take, gather, scatter, triangles, diagonals.
use super::{has, s};
use crate::array::{out1, Array, VecHandle};
use crate::dtype::Dtype;
use crate::error::Result;
use mlx_sys as sys;

impl Array {
    /// `a[start:stop:strides]` on every axis.
    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: Option<&[i32]>) -> Result<Array> {
        let ones = vec![1; start.len()];
        let strides = strides.unwrap_or(&ones);
        check_len3(start, stop, strides)?;
        out1(|o| unsafe {
            sys::mlxs_slice(
                o,
                self.as_raw(),
                start.as_ptr(),
                stop.as_ptr(),
                strides.as_ptr(),
                start.len(),
                s(),
            )
        })
    }
    /// `a[..., start:stop, ...]` along one axis.
    #[track_caller]
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let nd = shape.len() as i32;
        let ax = if axis < 0 { axis + nd } else { axis };
        if ax < 0 || ax >= nd {
            return Err(crate::Error::InvalidArgument(format!(
                "slice_axis: axis {axis} out of range for {nd} dimensions"
            )));
        }
        let mut b = vec![0; shape.len()];
        let mut e = shape.clone();
        b[ax as usize] = start;
        e[ax as usize] = stop;
        self.slice(&b, &e, None)
    }
    /// Slice with start offsets held in an array (for use inside compiled graphs).
    #[track_caller]
    pub fn slice_dynamic(&self, start: &Array, axes: &[i32], size: &[i32]) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_slice_dynamic(
                o,
                self.as_raw(),
                start.as_raw(),
                axes.as_ptr(),
                axes.len(),
                size.as_ptr(),
                size.len(),
                s(),
            )
        })
    }
    /// A copy of `self` with `self[start:stop:strides] = update`.
    #[track_caller]
    pub fn slice_update(
        &self,
        update: &Array,
        start: &[i32],
        stop: &[i32],
        strides: Option<&[i32]>,
    ) -> Result<Array> {
        let ones = vec![1; start.len()];
        let strides = strides.unwrap_or(&ones);
        check_len3(start, stop, strides)?;
        out1(|o| unsafe {
            sys::mlxs_slice_update(
                o,
                self.as_raw(),
                update.as_raw(),
                start.as_ptr(),
                stop.as_ptr(),
                strides.as_ptr(),
                start.len(),
                s(),
            )
        })
    }
    /// `slice_update` with start offsets held in an array.
    #[track_caller]
    pub fn slice_update_dynamic(
        &self,
        update: &Array,
        start: &Array,
        axes: &[i32],
    ) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_slice_update_dynamic(
                o,
                self.as_raw(),
                update.as_raw(),
                start.as_raw(),
                axes.as_ptr(),
                axes.len(),
                s(),
            )
        })
    }
    /// Gather elements at `indices` along `axis` (`None`: flattened).
    #[track_caller]
    pub fn take(&self, indices: &Array, axis: Option<i32>) -> Result<Array> {
        let (h, a) = has(axis);
        out1(|o| unsafe { sys::mlxs_take(o, self.as_raw(), indices.as_raw(), h, a, s()) })
    }
    /// Gather along `axis` with an index array of matching rank.
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_take_along_axis(o, self.as_raw(), indices.as_raw(), axis, s())
        })
    }
    /// A copy with `values` written at `indices` along `axis`.
    #[track_caller]
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_put_along_axis(
                o,
                self.as_raw(),
                indices.as_raw(),
                values.as_raw(),
                axis,
                s(),
            )
        })
    }
    /// General gather (MLX's `gather`).
    #[track_caller]
    pub fn gather(&self, indices: &[&Array], axes: &[i32], slice_sizes: &[i32]) -> Result<Array> {
        let v = VecHandle::from_arrays(indices.iter().copied())?;
        out1(|o| unsafe {
            sys::mlxs_gather(
                o,
                self.as_raw(),
                v.0,
                axes.as_ptr(),
                axes.len(),
                slice_sizes.as_ptr(),
                slice_sizes.len(),
                s(),
            )
        })
    }
    /// General scatter (MLX's `scatter`, `scatter_add`, ...).
    #[track_caller]
    pub fn scatter(
        &self,
        kind: ScatterKind,
        indices: &[&Array],
        updates: &Array,
        axes: &[i32],
    ) -> Result<Array> {
        let v = VecHandle::from_arrays(indices.iter().copied())?;
        out1(|o| unsafe {
            sys::mlxs_scatter(
                o,
                kind as i32,
                self.as_raw(),
                v.0,
                updates.as_raw(),
                axes.as_ptr(),
                axes.len(),
                s(),
            )
        })
    }
    /// Write `src` into the positions where `mask` is true.
    #[track_caller]
    pub fn masked_scatter(&self, mask: &Array, src: &Array) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_masked_scatter(o, self.as_raw(), mask.as_raw(), src.as_raw(), s())
        })
    }
    /// Lower triangle (below diagonal `k`).
    #[track_caller]
    pub fn tril(&self, k: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_tril(o, self.as_raw(), k, s()) })
    }
    /// Upper triangle (above diagonal `k`).
    #[track_caller]
    pub fn triu(&self, k: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_triu(o, self.as_raw(), k, s()) })
    }
    /// Extract a diagonal or build a diagonal matrix.
    #[track_caller]
    pub fn diag(&self, k: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_diag(o, self.as_raw(), k, s()) })
    }
    /// A diagonal between two axes.
    #[track_caller]
    pub fn diagonal(&self, offset: i32, axis1: i32, axis2: i32) -> Result<Array> {
        out1(|o| unsafe { sys::mlxs_diagonal(o, self.as_raw(), offset, axis1, axis2, s()) })
    }
    /// Sum along a diagonal.
    #[track_caller]
    pub fn trace(&self, offset: i32, axis1: i32, axis2: i32, dtype: Dtype) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_trace(o, self.as_raw(), offset, axis1, axis2, dtype.to_raw(), s())
        })
    }
    /// Walsh-Hadamard transform along the last axis.
    #[track_caller]
    pub fn hadamard_transform(&self, scale: Option<f32>) -> Result<Array> {
        out1(|o| unsafe {
            sys::mlxs_hadamard_transform(
                o,
                self.as_raw(),
                scale.is_some(),
                scale.unwrap_or(1.0),
                s(),
            )
        })
    }
}

/// The combine rule of [`Array::scatter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ScatterKind {
    /// Overwrite.
    Set = sys::MLXS_SCATTER as i32,
    /// Add.
    Add = sys::MLXS_SCATTER_ADD as i32,
    /// Multiply.
    Prod = sys::MLXS_SCATTER_PROD as i32,
    /// Maximum.
    Max = sys::MLXS_SCATTER_MAX as i32,
    /// Minimum.
    Min = sys::MLXS_SCATTER_MIN as i32,
}

#[track_caller]
fn check_len3(a: &[i32], b: &[i32], c: &[i32]) -> Result<()> {
    if a.len() != b.len() || a.len() != c.len() {
        return Err(crate::Error::InvalidArgument(format!(
            "slice: start ({}), stop ({}) and strides ({}) must have one entry per axis",
            a.len(),
            b.len(),
            c.len()
        )));
    }
    Ok(())
}

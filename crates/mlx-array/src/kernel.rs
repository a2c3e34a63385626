//! Custom kernels: `fast.metal_kernel` (macOS) and `fast.cuda_kernel` (CUDA builds).
//! On a backend without the kind asked for, building or running one is an error.
use crate::array::{Array, VecHandle};
use crate::dtype::Dtype;
use crate::error::{check, Result};
use crate::ops::cstr;
use mlx_sys as sys;

/// Which backend's kernel language the source is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelBackend {
    /// Metal Shading Language.
    Metal,
    /// CUDA C++.
    Cuda,
}

/// A template argument of a kernel.
#[derive(Debug, Clone, Copy)]
pub enum TemplateArg {
    /// An integer.
    Int(i32),
    /// A boolean.
    Bool(bool),
    /// A dtype.
    Dtype(Dtype),
}

/// How one launch of a [`CustomKernel`] looks.
#[derive(Debug, Clone)]
pub struct KernelLaunch {
    /// Shapes of the outputs.
    pub output_shapes: Vec<Vec<i32>>,
    /// Dtypes of the outputs.
    pub output_dtypes: Vec<Dtype>,
    /// Grid size (threads).
    pub grid: [i32; 3],
    /// Threadgroup (block) size.
    pub threadgroup: [i32; 3],
    /// Template arguments.
    pub template: Vec<(String, TemplateArg)>,
    /// Initial value of the outputs, if any.
    pub init_value: Option<f32>,
    /// Print the generated source.
    pub verbose: bool,
}

/// A kernel built from source.
pub struct CustomKernel {
    raw: sys::mlxs_kernel,
}

impl Drop for CustomKernel {
    fn drop(&mut self) {
        // SAFETY: we own the kernel handle and free it exactly once.
        unsafe { sys::mlxs_kernel_free(self.raw) }
    }
}

impl CustomKernel {
    /// Builds a kernel; `source` is the body, `header` goes before it.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn new(
        backend: KernelBackend,
        name: &str,
        input_names: &[&str],
        output_names: &[&str],
        source: &str,
        header: &str,
        ensure_row_contiguous: bool,
        atomic_outputs: bool,
    ) -> Result<CustomKernel> {
        let name = cstr(name)?;
        let ins = input_names
            .iter()
            .map(|s| cstr(s))
            .collect::<Result<Vec<_>>>()?;
        let outs = output_names
            .iter()
            .map(|s| cstr(s))
            .collect::<Result<Vec<_>>>()?;
        let in_p: Vec<_> = ins.iter().map(|c| c.as_ptr()).collect();
        let out_p: Vec<_> = outs.iter().map(|c| c.as_ptr()).collect();
        let (src, hdr) = (cstr(source)?, cstr(header)?);
        let mut raw = std::ptr::null_mut();
        // SAFETY: every pointer/length pair describes a live Rust slice or CString for the whole call.
        check(unsafe {
            sys::mlxs_kernel_new(
                &mut raw,
                if backend == KernelBackend::Metal {
                    0
                } else {
                    1
                },
                name.as_ptr(),
                in_p.as_ptr(),
                in_p.len(),
                out_p.as_ptr(),
                out_p.len(),
                src.as_ptr(),
                hdr.as_ptr(),
                ensure_row_contiguous,
                atomic_outputs,
                0,
            )
        })?;
        Ok(CustomKernel { raw })
    }

    /// Runs the kernel on `inputs`.
    #[track_caller]
    pub fn apply(&self, inputs: &[&Array], launch: &KernelLaunch) -> Result<Vec<Array>> {
        let v = VecHandle::from_arrays(inputs.iter().copied())?;
        let shapes: Vec<i32> = launch.output_shapes.iter().flatten().copied().collect();
        let ndims: Vec<usize> = launch.output_shapes.iter().map(|s| s.len()).collect();
        let dtypes: Vec<i32> = launch.output_dtypes.iter().map(|d| d.to_raw()).collect();
        if ndims.len() != dtypes.len() {
            return Err(crate::Error::InvalidArgument(
                "custom kernel: one dtype per output shape is needed".into(),
            ));
        }
        let names = launch
            .template
            .iter()
            .map(|(n, _)| cstr(n))
            .collect::<Result<Vec<_>>>()?;
        let name_p: Vec<_> = names.iter().map(|c| c.as_ptr()).collect();
        let (kinds, values): (Vec<i32>, Vec<i32>) = launch
            .template
            .iter()
            .map(|(_, a)| match a {
                TemplateArg::Int(i) => (0, *i),
                TemplateArg::Bool(b) => (1, *b as i32),
                TemplateArg::Dtype(d) => (2, d.to_raw()),
            })
            .unzip();
        let mut out = std::ptr::null_mut();
        // SAFETY: every pointer/length pair describes a live Rust slice or CString for the whole call.
        check(unsafe {
            sys::mlxs_kernel_apply(
                &mut out,
                self.raw,
                v.0,
                shapes.as_ptr(),
                ndims.as_ptr(),
                dtypes.as_ptr(),
                dtypes.len(),
                launch.grid.as_ptr(),
                launch.threadgroup.as_ptr(),
                name_p.as_ptr(),
                kinds.as_ptr(),
                values.as_ptr(),
                kinds.len(),
                launch.init_value.is_some(),
                launch.init_value.unwrap_or(0.0),
                launch.verbose,
                Array::s(),
            )
        })?;
        // SAFETY: on success the shim wrote a new owned vector to `out`.
        unsafe { VecHandle::from_raw(out) }.to_arrays()
    }
}

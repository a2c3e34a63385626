//! Safe arrays and operations over Apple's MLX.
//!
//! [`Array`] owns an MLX array handle; every operation is lazy and returns a
//! [`Result`]: an MLX failure (shape mismatch, bad dtype, out of memory) comes back as
//! [`Error::Mlx`] with MLX's message and the Rust call site, never as an abort.
//!
//! ```
//! use mlx_array::{ops, Array, Dtype};
//! let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let b = ops::ones(&[2, 2], Dtype::Float32)?;
//! let c = a.matmul(&b)?.multiply(0.5)?; // a host scalar takes the array's dtype
//! assert_eq!(c.to_vec::<f32>()?, vec![1.5, 1.5, 3.5, 3.5]);
//! assert!(a.reshape(&[3, 3]).is_err()); // a bad reshape is an error, not a crash
//! # Ok::<(), mlx_array::Error>(())
//! ```
//!
//! Threading: `Array` is `Send` but not `Sync`; see [`device`].
//!
//! Safety: every `unsafe` block here is a call into the C shim (`mlx-sys`). The shim's
//! contract: handles passed in are live (owned by an `Array` or a container guard) and
//! only read; an entry point writes a new owned handle to its out-pointer only when it
//! returns status 0; no C++ exception crosses into Rust. The operator modules (`ops`,
//! `fast`, `linalg`, `random`, `quant`, `memory`, `device`, `activations`) make nothing
//! but such plain calls, so their blocks carry no comments of their own; the modules
//! that transfer ownership, pass raw buffers or hand Rust closures to MLX (`array`,
//! `io`, `kernel`, `transforms`) say at each block why it holds.
#![warn(missing_docs)]

#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod activations;
mod array;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod device;
mod dtype;
mod error;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod fast;
pub mod io;
pub mod kernel;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod linalg;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod memory;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod ops;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod quant;
#[allow(clippy::undocumented_unsafe_blocks)] // plain shim calls: see the crate docs
pub mod random;
pub mod transforms;

pub use array::{Array, ArrayRef, Operand, Scalar};
pub use device::{
    current_device, current_stream, synchronize, with_stream, Device, DeviceType, Stream,
};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use ops::{concatenate, stack, where_};
pub use transforms::{async_eval, eval, Closure};

/// The MLX version this build runs against.
pub fn mlx_version() -> String {
    // SAFETY: mlxs_version returns a pointer to a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(mlx_sys::mlxs_version()) }
        .to_string_lossy()
        .into_owned()
}

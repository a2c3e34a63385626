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
#![warn(missing_docs)]

pub mod activations;
mod array;
pub mod device;
mod dtype;
mod error;
pub mod fast;
pub mod io;
pub mod kernel;
pub mod linalg;
pub mod memory;
pub mod ops;
pub mod quant;
pub mod random;
pub mod transforms;

pub use array::{Array, ArrayRef, Operand, Scalar};
pub use device::{current_stream, synchronize, with_stream, Device, DeviceType, Stream};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use ops::{concatenate, stack, where_};
pub use transforms::{async_eval, eval, Closure};

/// The MLX version this build runs against.
pub fn mlx_version() -> String {
    unsafe { std::ffi::CStr::from_ptr(mlx_sys::mlxs_version()) }
        .to_string_lossy()
        .into_owned()
}

//! The crate's error type.
use std::panic::Location;
use std::path::PathBuf;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MLX refused an operation (shape mismatch, bad dtype, out of memory, ...).
    #[error("MLX: {message} (called at {location})")]
    Mlx {
        /// MLX's own message.
        message: String,
        /// The Rust call site of the failing operation.
        location: &'static Location<'static>,
    },
    /// Host data does not fit the requested shape.
    #[error("data has {got} elements but shape {shape:?} needs {expected}")]
    DataLength {
        /// The requested shape.
        shape: Vec<i32>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements supplied.
        got: usize,
    },
    /// The array's dtype does not match the host type asked for.
    #[error("array has dtype {actual} but {requested} was requested")]
    DtypeMismatch {
        /// The array's dtype.
        actual: crate::Dtype,
        /// The dtype of the requested host type.
        requested: crate::Dtype,
    },
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// An argument is invalid before MLX is even asked.
    #[error("{0}")]
    InvalidArgument(String),
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a shim status code into a `Result`, taking MLX's message on failure.
#[track_caller]
pub(crate) fn check(rc: std::os::raw::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Mlx {
            message: last_error(),
            location: Location::caller(),
        })
    }
}

pub(crate) fn last_error() -> String {
    // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string.
    unsafe {
        let p = mlx_sys::mlxs_last_error();
        if p.is_null() {
            String::from("unknown MLX error")
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

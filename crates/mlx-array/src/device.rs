//! Devices and streams.
//!
//! # Threading
//! MLX keeps per-thread default streams and its graph is not safe to build from two
//! threads at once. An [`Array`](crate::Array) is `Send` (it can be moved to another
//! thread) but not `Sync`: one thread at a time builds and evaluates a graph. Programs
//! that serve many clients keep one thread that owns the model and all evaluation, and
//! talk to it over channels.
//!
//! Since MLX 0.32 every thread has its own streams, so evaluate an array on the thread
//! that built it before sending it elsewhere: an unevaluated graph evaluated on another
//! thread fails with `There is no Stream(cpu, 0) in current thread` (an `Err`, as in
//! Python). Evaluated arrays can be used freely as inputs on the receiving thread.
use crate::error::{check, Result};
use mlx_sys as sys;
use std::cell::Cell;

/// The kind of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// The host CPU.
    Cpu,
    /// A GPU (Metal on macOS, CUDA on Linux).
    Gpu,
}

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// CPU or GPU.
    pub kind: DeviceType,
    /// Index among devices of that kind.
    pub index: i32,
}

impl Device {
    /// The CPU.
    pub const fn cpu() -> Device {
        Device {
            kind: DeviceType::Cpu,
            index: 0,
        }
    }
    /// The first GPU.
    pub const fn gpu() -> Device {
        Device {
            kind: DeviceType::Gpu,
            index: 0,
        }
    }
    pub(crate) fn raw(self) -> sys::mlxs_device {
        sys::mlxs_device {
            type_: if self.kind == DeviceType::Gpu {
                sys::MLXS_GPU
            } else {
                sys::MLXS_CPU
            } as i32,
            index: self.index,
        }
    }
    pub(crate) fn from_raw(d: sys::mlxs_device) -> Device {
        Device {
            kind: if d.type_ == sys::MLXS_GPU as i32 {
                DeviceType::Gpu
            } else {
                DeviceType::Cpu
            },
            index: d.index,
        }
    }
    /// MLX's default device (GPU when one is available).
    #[track_caller]
    pub fn default_device() -> Result<Device> {
        let mut d = sys::mlxs_device { type_: 0, index: 0 };
        check(unsafe { sys::mlxs_default_device(&mut d) })?;
        Ok(Device::from_raw(d))
    }
    /// Makes `self` MLX's default device.
    #[track_caller]
    pub fn set_default(self) -> Result<()> {
        check(unsafe { sys::mlxs_set_default_device(self.raw()) })
    }
    /// Whether this device can run in this build of MLX.
    #[track_caller]
    pub fn is_available(self) -> Result<bool> {
        let mut out = false;
        check(unsafe { sys::mlxs_device_is_available(self.raw(), &mut out) })?;
        Ok(out)
    }
    /// The default stream of this device on the current thread.
    #[track_caller]
    pub fn default_stream(self) -> Result<Stream> {
        let mut s = Stream::DEFAULT.0;
        check(unsafe { sys::mlxs_default_stream(self.raw(), &mut s) })?;
        Ok(Stream(s))
    }
    /// A new stream on this device.
    #[track_caller]
    pub fn new_stream(self) -> Result<Stream> {
        let mut s = Stream::DEFAULT.0;
        check(unsafe { sys::mlxs_new_stream(self.raw(), &mut s) })?;
        Ok(Stream(s))
    }
}

/// Where operations run: a stream, a device's default stream, or MLX's default.
#[derive(Debug, Clone, Copy)]
pub struct Stream(pub(crate) sys::mlxs_stream);

impl Stream {
    /// The default stream of the default device.
    pub const DEFAULT: Stream = Stream(sys::mlxs_stream {
        kind: 0,
        index: 0,
        device: sys::mlxs_device { type_: 0, index: 0 },
    });

    /// The default stream of `device`.
    pub fn of_device(device: Device) -> Stream {
        Stream(sys::mlxs_stream {
            kind: 1,
            index: 0,
            device: device.raw(),
        })
    }

    /// The device this stream runs on, when it names one.
    pub fn device(&self) -> Option<Device> {
        (self.0.kind != 0).then(|| Device::from_raw(self.0.device))
    }

    /// Waits for everything queued on this stream.
    #[track_caller]
    pub fn synchronize(&self) -> Result<()> {
        check(unsafe { sys::mlxs_synchronize(self.0) })
    }

    /// Makes this (concrete) stream the default for its device on this thread.
    #[track_caller]
    pub fn set_default(&self) -> Result<()> {
        check(unsafe { sys::mlxs_set_default_stream(self.0) })
    }
}

impl From<Device> for Stream {
    fn from(d: Device) -> Stream {
        Stream::of_device(d)
    }
}

thread_local! {
    static CURRENT: Cell<sys::mlxs_stream> = const { Cell::new(Stream::DEFAULT.0) };
}

/// The stream operations on this thread use (see [`with_stream`]).
pub fn current_stream() -> Stream {
    Stream(CURRENT.with(|c| c.get()))
}

/// The device operations on this thread run on: the current stream's, else the default
/// device.
pub fn current_device() -> Result<Device> {
    match current_stream().device() {
        Some(d) => Ok(d),
        None => Device::default_device(),
    }
}

pub(crate) fn cur() -> sys::mlxs_stream {
    CURRENT.with(|c| c.get())
}

/// Runs `f` with every operation on this thread placed on `stream` (like Python's
/// `with mx.stream(s):`), restoring the previous stream afterwards, even on panic.
pub fn with_stream<R>(stream: impl Into<Stream>, f: impl FnOnce() -> R) -> R {
    struct Restore(sys::mlxs_stream);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let s = stream.into();
    let _restore = Restore(CURRENT.with(|c| c.replace(s.0)));
    f()
}

/// Waits for all queued work on the default stream.
#[track_caller]
pub fn synchronize() -> Result<()> {
    Stream::DEFAULT.synchronize()
}

//! MLX's allocator statistics and limits (`mx.get_active_memory`, ...).
use crate::error::{check, Result};
use mlx_sys as sys;

/// Bytes held by live arrays.
pub fn active_memory() -> usize {
    unsafe { sys::mlxs_get_active_memory() }
}
/// The most bytes held at once since the last [`reset_peak_memory`].
pub fn peak_memory() -> usize {
    unsafe { sys::mlxs_get_peak_memory() }
}
/// Bytes kept in MLX's buffer cache.
pub fn cache_memory() -> usize {
    unsafe { sys::mlxs_get_cache_memory() }
}
/// Resets the peak counter.
pub fn reset_peak_memory() {
    unsafe { sys::mlxs_reset_peak_memory() }
}
/// Sets the memory limit; returns the previous one.
#[track_caller]
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    let mut prev = 0;
    check(unsafe { sys::mlxs_set_memory_limit(bytes, &mut prev) })?;
    Ok(prev)
}
/// The memory limit in force (MLX's default is derived from the device's memory);
/// read by setting it and putting it back.
#[track_caller]
pub fn memory_limit() -> Result<usize> {
    let current = set_memory_limit(usize::MAX)?;
    set_memory_limit(current)?;
    Ok(current)
}
/// Sets the buffer-cache limit; returns the previous one.
#[track_caller]
pub fn set_cache_limit(bytes: usize) -> Result<usize> {
    let mut prev = 0;
    check(unsafe { sys::mlxs_set_cache_limit(bytes, &mut prev) })?;
    Ok(prev)
}
/// Sets the wired-memory limit (Metal); returns the previous one.
#[track_caller]
pub fn set_wired_limit(bytes: usize) -> Result<usize> {
    let mut prev = 0;
    check(unsafe { sys::mlxs_set_wired_limit(bytes, &mut prev) })?;
    Ok(prev)
}
/// Host data made into arrays ([`Array::from_slice`](crate::Array::from_slice); more
/// than 8 bytes) take buffers from a pool of their own, given back when the array is freed (after the device is done with it), rather
/// than from MLX's buffer cache: on CUDA that cache may hand a host upload a device
/// buffer, which MLX then replaces by new managed memory with a synchronous copy, every
/// time (a batch's grammar masks, uploaded at every decoding step, paid it on most
/// steps). On by default where CUDA is available, off elsewhere (`MLX_HOST_BUFFER_POOL=0`
/// / `1` at start); at most 64 MiB is kept, and those bytes count as active memory until
/// [`clear_cache`] gives them back.
pub fn set_host_buffer_pool(on: bool) {
    unsafe { sys::mlxs_set_host_buffer_pool(i32::from(on)) }
}

/// How many host arrays of this process took a buffer from that pool.
pub fn host_buffer_pool_reuses() -> u64 {
    unsafe { sys::mlxs_host_buffer_pool_reuses() }
}

/// How many buffers that pool took from MLX were advised to stay in host memory: on
/// CUDA, managed memory migrates to the processor that touched it last, so a kept
/// buffer the device read would be faulted back page block by page block when the host
/// writes the next upload into it. Buffers of up to 4 MiB (per-step uploads such as
/// tokens and grammar masks); larger host data is left to move to the device
/// (`MLX_HOST_BUFFER_ADVISE=0` leaves them all to migrate).
pub fn host_buffer_pool_advised() -> u64 {
    unsafe { sys::mlxs_host_buffer_pool_advised() }
}

/// Frees the buffer cache (and the host-upload pool's kept buffers).
pub fn clear_cache() {
    unsafe { sys::mlxs_clear_cache() }
}

/// `"MLX memory: active A GB, peak P GB"` (1e9 bytes, four decimals), for log lines.
pub fn note() -> String {
    format!(
        "MLX memory: active {:.4} GB, peak {:.4} GB",
        active_memory() as f64 / 1e9,
        peak_memory() as f64 / 1e9
    )
}

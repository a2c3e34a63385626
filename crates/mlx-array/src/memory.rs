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
/// Frees the buffer cache.
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

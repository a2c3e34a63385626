//! Loss functions of `mlx.nn.losses`, with its op sequence (same bits).
use crate::{Error, Result};
use mlx_array::{fast, Array, Device, DeviceType};

/// `mlx.nn.losses.cross_entropy(logits, targets, reduction="none")` for integer class
/// `targets` (`[...]`, the logits `[..., V]`): one loss per target, in the logits' dtype.
///
/// Like MLX, it runs the fused `fast::cross_entropy` kernel when the default device is a
/// GPU and composes `logsumexp(l) - l[target]` of the max-shifted logits otherwise (the
/// CPU reduces in the logits' dtype: upcast half-precision logits first for accuracy).
pub fn cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    let ls = logits.shape();
    let ts = targets.shape();
    if ls.is_empty() || ls[..ls.len() - 1] != ts[..] {
        return Err(Error::Invalid(format!(
            "cross_entropy: targets shape {ts:?} does not match logits shape {ls:?}"
        )));
    }
    if !targets.dtype().is_integer() {
        return Err(Error::Invalid(format!(
            "cross_entropy: class targets must be integers, got {}",
            targets.dtype()
        )));
    }
    let gpu = Device::default_device()?.kind == DeviceType::Gpu;
    if gpu && logits.dtype().is_floating() {
        return Ok(fast::cross_entropy(logits, targets)?.astype(logits.dtype())?);
    }
    let shifted = logits.subtract(&logits.max(Some(&[-1]), true)?.stop_gradient()?)?;
    let score = shifted
        .take_along_axis(&targets.expand_dims(&[-1])?, -1)?
        .squeeze(Some(&[-1]))?;
    let lse = shifted.logsumexp(Some(&[-1]), false)?;
    Ok(lse.subtract(&score)?)
}

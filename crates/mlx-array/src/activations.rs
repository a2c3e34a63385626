//! Activation functions with the exact formulas of `mlx.nn` (so results match bit for
//! bit when compiled the same way; `mlx-nn` wraps these in shapeless compiled closures
//! like `mlx.nn` does).
use crate::array::Array;
use crate::error::Result;

/// `x * sigmoid(x)`.
#[track_caller]
pub fn silu(x: &Array) -> Result<Array> {
    x.multiply(&x.sigmoid()?)
}

/// `max(x, 0)`.
#[track_caller]
pub fn relu(x: &Array) -> Result<Array> {
    x.maximum(0)
}

/// `square(max(x, 0))`.
#[track_caller]
pub fn relu2(x: &Array) -> Result<Array> {
    x.maximum(0)?.square()
}

/// Exact GELU: `x * (1 + erf(x / sqrt(2))) / 2`.
#[track_caller]
pub fn gelu(x: &Array) -> Result<Array> {
    let e = x.divide(std::f64::consts::SQRT_2)?.erf()?;
    x.multiply(&e.add(1)?)?.divide(2)
}

/// Tanh-approximated GELU: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`.
#[track_caller]
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let cube = x.power(3)?;
    let inner = x.add(&cube.multiply(0.044715)?)?;
    let t = inner.multiply(c)?.tanh()?;
    x.multiply(0.5)?.multiply(&t.add(1)?)
}

/// Sigmoid-approximated GELU: `x * sigmoid(1.702 * x)`.
#[track_caller]
pub fn gelu_fast_approx(x: &Array) -> Result<Array> {
    x.multiply(&x.multiply(1.702)?.sigmoid()?)
}

/// `log(1 + exp(x))` as `logaddexp(x, 0)`.
#[track_caller]
pub fn softplus(x: &Array) -> Result<Array> {
    x.logaddexp(0)
}

/// `x * tanh(softplus(x))`.
#[track_caller]
pub fn mish(x: &Array) -> Result<Array> {
    x.multiply(&softplus(x)?.tanh()?)
}

/// `silu(gate) * x`, the SwiGLU gate of llama-style MLPs.
#[track_caller]
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    silu(gate)?.multiply(x)
}

/// `x - logsumexp(x, axis)`.
#[track_caller]
pub fn log_softmax(x: &Array, axis: i32) -> Result<Array> {
    x.subtract(&x.logsumexp(Some(&[axis]), true)?)
}

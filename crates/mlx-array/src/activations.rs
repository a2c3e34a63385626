//! Activation functions with the exact op sequence of `mlx.nn` and `mlx_lm.models.activations`,
//! so results match bit for bit. Python wraps each of them in `mx.compile(shapeless=True)`;
//! on the CPU backend the compiled and plain versions give identical bits (checked by the
//! op goldens), and `mlx-nn` may wrap these in [`crate::Closure::compile`] the same way.
use crate::array::Array;
use crate::error::Result;

/// `x * sigmoid(x)` (`nn.silu`).
#[track_caller]
pub fn silu(x: &Array) -> Result<Array> {
    x.multiply(&x.sigmoid()?)
}

/// `max(x, 0)` (`nn.relu`).
#[track_caller]
pub fn relu(x: &Array) -> Result<Array> {
    x.maximum(0)
}

/// `square(max(x, 0))` (`nn.relu2`).
#[track_caller]
pub fn relu2(x: &Array) -> Result<Array> {
    x.maximum(0)?.square()
}

/// `min(max(x, 0), 6)` (`nn.relu6`).
#[track_caller]
pub fn relu6(x: &Array) -> Result<Array> {
    x.maximum(0)?.minimum(6.0)
}

/// `max(slope * x, x)` (`nn.leaky_relu`, default slope 0.01).
#[track_caller]
pub fn leaky_relu(x: &Array, negative_slope: f64) -> Result<Array> {
    x.multiply(negative_slope)?.maximum(x)
}

/// `where(x > 0, x, alpha * (exp(x) - 1))` (`nn.elu`, default alpha 1).
#[track_caller]
pub fn elu(x: &Array, alpha: f64) -> Result<Array> {
    let neg = x.exp()?.subtract(1)?.multiply(alpha)?;
    crate::ops::where_(&x.greater(0)?, x, &neg)
}

/// Exact GELU: `x * (1 + erf(x / sqrt(2))) / 2` (`nn.gelu`).
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

/// `log(1 + exp(x))` as `logaddexp(x, 0)` (`nn.softplus`).
#[track_caller]
pub fn softplus(x: &Array) -> Result<Array> {
    x.logaddexp(0)
}

/// `x / (1 + |x|)` (`nn.softsign`).
#[track_caller]
pub fn softsign(x: &Array) -> Result<Array> {
    x.divide(&x.abs()?.add(1)?)
}

/// `-softplus(-x)` (`nn.log_sigmoid`).
#[track_caller]
pub fn log_sigmoid(x: &Array) -> Result<Array> {
    softplus(&x.negative()?)?.negative()
}

/// `x * tanh(softplus(x))` (`nn.mish`).
#[track_caller]
pub fn mish(x: &Array) -> Result<Array> {
    x.multiply(&softplus(x)?.tanh()?)
}

/// `x * min(max(x + 3, 0), 6) / 6` (`nn.hardswish`).
#[track_caller]
pub fn hardswish(x: &Array) -> Result<Array> {
    let m = x.add(3)?.maximum(0)?;
    x.multiply(&m.minimum(6)?)?.divide(6)
}

/// `silu(gate) * x`, the SwiGLU gate of llama-style MLPs (`mlx_lm` `swiglu`).
#[track_caller]
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    silu(gate)?.multiply(x)
}

/// SwiGLU computed in float32 and cast back to `h`'s dtype (`mlx_lm` `precise_swiglu`).
#[track_caller]
pub fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array> {
    let g = silu(&gate.astype(crate::Dtype::Float32)?)?;
    g.multiply(&x.astype(crate::Dtype::Float32)?)?
        .astype(h.dtype())
}

/// GPT-OSS SwiGLU (`mlx_lm` `swiglu_oai`, defaults `alpha = 1.702`, `limit = 7`):
/// `(clip(x, -limit, limit) + 1) * (g * sigmoid(alpha * g))` with `g = min(gate, limit)`.
#[track_caller]
pub fn swiglu_oai(gate: &Array, x: &Array, alpha: f64, limit: f64) -> Result<Array> {
    let g = gate.minimum(limit)?;
    let dt = x.dtype();
    let lo = Array::weak_scalar(crate::Scalar::Float(-limit), dt)?;
    let hi = Array::weak_scalar(crate::Scalar::Float(limit), dt)?;
    let xc = x.clip(Some(&lo), Some(&hi))?;
    let glu = g.multiply(&g.multiply(alpha)?.sigmoid()?)?;
    xc.add(1.0)?.multiply(&glu)
}

/// `x - logsumexp(x)` along `axis`, after shifting by the (gradient-stopped) maximum like
/// `nn.log_softmax` does.
#[track_caller]
pub fn log_softmax(x: &Array, axis: i32) -> Result<Array> {
    let m = x.max(Some(&[axis]), true)?.stop_gradient()?;
    let x = x.subtract(&m)?;
    x.subtract(&x.logsumexp(Some(&[axis]), true)?)
}

//! Activations compiled the way mlx.nn and mlx-lm compile them
//! (`mx.compile(shapeless=True)`), so fused kernels match Python bit for bit.
//!
//! Each compiled function is built once per thread and kept for the thread's life.
use mlx_array::{activations as raw, Array, Closure, Result, Scalar};
use std::cell::RefCell;
use std::collections::HashMap;

type Body = fn(&[Array]) -> Result<Vec<Array>>;

thread_local! {
    static COMPILED: RefCell<HashMap<&'static str, &'static Closure>> = RefCell::new(HashMap::new());
}

/// Calls the shapeless-compiled version of `body`, cached per thread under `name`.
#[track_caller]
pub fn call_compiled(name: &'static str, body: Body, inputs: &[&Array]) -> Result<Array> {
    let found = COMPILED.with(|c| c.borrow().get(name).copied());
    let f = match found {
        Some(f) => f,
        None => {
            let compiled = Closure::new(body)?.compile(true)?;
            // Leaked on purpose: MLX keeps the compiled graph in a global cache that may
            // be torn down before thread-locals, so these are never freed.
            let f: &'static Closure = Box::leak(Box::new(compiled));
            COMPILED.with(|c| c.borrow_mut().insert(name, f));
            f
        }
    };
    let mut out = f.call(inputs)?;
    out.pop()
        .ok_or_else(|| mlx_array::Error::InvalidArgument(format!("{name}: no output")))
}

thread_local! {
    static COMPILED_KEYED: RefCell<HashMap<String, &'static Closure>> = RefCell::new(HashMap::new());
}

/// A function [`call_compiled_keyed`] compiles.
pub type KeyedBody = Box<dyn Fn(&[Array]) -> Result<Vec<Array>>>;

/// The function `make` returns, compiled as `mx.compile` compiles a function that is not
/// shapeless (traced again for each new input shape), built once per thread for each
/// `key`. `key` must name the function and every constant it captures (mlx-lm's compiled
/// routers take their top-k and scaling as Python constants).
#[track_caller]
pub fn call_compiled_keyed(
    key: &str,
    make: impl FnOnce() -> KeyedBody,
    inputs: &[&Array],
) -> Result<Vec<Array>> {
    let found = COMPILED_KEYED.with(|c| c.borrow().get(key).copied());
    let f = match found {
        Some(f) => f,
        None => {
            let body = make();
            let compiled = Closure::new(move |a| body(a))?.compile(false)?;
            // Leaked on purpose, as in `call_compiled`.
            let f: &'static Closure = Box::leak(Box::new(compiled));
            COMPILED_KEYED.with(|c| c.borrow_mut().insert(key.to_string(), f));
            f
        }
    };
    f.call(inputs)
}

macro_rules! unary_activation {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {$(
        $(#[$m])*
        #[track_caller]
        pub fn $name(x: &Array) -> Result<Array> {
            call_compiled(stringify!($name), |a| Ok(vec![raw::$name(&a[0])?]), &[x])
        }
    )*};
}

unary_activation! {
    /// mlx.nn `silu`: `x * sigmoid(x)`.
    silu,
    /// mlx.nn `relu`.
    relu,
    /// mlx.nn `relu2`.
    relu2,
    /// mlx.nn `gelu` (exact, erf based).
    gelu,
    /// mlx.nn `gelu_approx` (tanh approximation).
    gelu_approx,
    /// mlx.nn `gelu_fast_approx` (sigmoid approximation).
    gelu_fast_approx,
    /// mlx.nn `softplus`.
    softplus,
}

/// mlx.nn `mish`: `x * tanh(softplus(x))` with the compiled `softplus` nested.
#[track_caller]
pub fn mish(x: &Array) -> Result<Array> {
    call_compiled(
        "mish",
        |a| Ok(vec![a[0].multiply(&softplus(&a[0])?.tanh()?)?]),
        &[x],
    )
}

/// mlx.nn `softmax` over the last axis (compiled `mx.softmax(x, axis=-1)`).
#[track_caller]
pub fn softmax(x: &Array) -> Result<Array> {
    call_compiled(
        "softmax",
        |a| Ok(vec![a[0].softmax(Some(&[-1]), false)?]),
        &[x],
    )
}

/// mlx.nn `sigmoid` (compiled `mx.sigmoid`).
#[track_caller]
pub fn sigmoid(x: &Array) -> Result<Array> {
    call_compiled("sigmoid", |a| Ok(vec![a[0].sigmoid()?]), &[x])
}

/// Step 3.5's `clamped_swiglu(x, gate, limit)`: `min(silu(gate), limit) * clip(x,
/// -limit, limit)`, compiled (the limit a constant of the trace, a weak scalar as
/// Python's float).
#[track_caller]
pub fn clamped_swiglu(x: &Array, gate: &Array, limit: f64) -> Result<Array> {
    let key = format!("clamped_swiglu:{limit:e}");
    let make = move || -> KeyedBody {
        Box::new(move |a| {
            let (x, gate) = (&a[0], &a[1]);
            let g_hi = Array::weak_scalar(Scalar::Float(limit), gate.dtype())?;
            let g = silu(gate)?.clip(None, Some(&g_hi))?;
            let lo = Array::weak_scalar(Scalar::Float(-limit), x.dtype())?;
            let hi = Array::weak_scalar(Scalar::Float(limit), x.dtype())?;
            Ok(vec![g.multiply(&x.clip(Some(&lo), Some(&hi))?)?])
        })
    };
    call_compiled_keyed(&key, make, &[x, gate])?
        .pop()
        .ok_or_else(|| mlx_array::Error::InvalidArgument("clamped_swiglu: no output".into()))
}

/// mlx-lm's `swiglu(gate, x) = silu(gate) * x`, compiled with the compiled `silu`
/// nested inside, as in `mlx_lm/models/activations.py`.
#[track_caller]
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    call_compiled(
        "swiglu",
        |a| Ok(vec![silu(&a[0])?.multiply(&a[1])?]),
        &[gate, x],
    )
}

/// mlx-lm's `geglu(gate, x) = gelu_approx(gate) * x` (Gemma 4), compiled with the
/// compiled `gelu_approx` nested inside.
#[track_caller]
pub fn geglu(gate: &Array, x: &Array) -> Result<Array> {
    call_compiled(
        "geglu",
        |a| Ok(vec![gelu_approx(&a[0])?.multiply(&a[1])?]),
        &[gate, x],
    )
}

/// mlx-lm's `xielu(x, alpha_p, alpha_n, beta, eps)` (Apertus's XieLU), compiled with
/// the compiled `softplus` nested inside: `softplus(alpha_p) * x^2 + beta * x` where `x
/// > 0`, else `(expm1(min(x, eps)) - x) * (beta + softplus(alpha_n)) + beta * x`.
#[track_caller]
pub fn xielu(
    x: &Array,
    alpha_p: &Array,
    alpha_n: &Array,
    beta: &Array,
    eps: &Array,
) -> Result<Array> {
    call_compiled(
        "xielu",
        |a| {
            let (x, beta, eps) = (&a[0], &a[3], &a[4]);
            let alpha_p = softplus(&a[1])?;
            let alpha_n = beta.add(&softplus(&a[2])?)?;
            let beta_x = beta.multiply(x)?;
            let positive = alpha_p.multiply(&x.square()?)?.add(&beta_x)?;
            let negative = x
                .minimum(eps)?
                .expm1()?
                .subtract(x)?
                .multiply(&alpha_n)?
                .add(&beta_x)?;
            Ok(vec![mlx_array::ops::where_(
                &x.greater(0.0)?,
                &positive,
                &negative,
            )?])
        },
        &[x, alpha_p, alpha_n, beta, eps],
    )
}

/// mlx-lm's `swiglu_oai(gate, x)` (GPT-OSS; alpha 1.702, limit 7.0, its defaults):
/// `gate` clipped from above, `x` to +-limit, then `(x + 1) * (gate * sigmoid(alpha *
/// gate))`, compiled.
#[track_caller]
pub fn swiglu_oai(gate: &Array, x: &Array) -> Result<Array> {
    call_compiled(
        "swiglu_oai",
        |a| {
            let (gate, x) = (&a[0], &a[1]);
            let (alpha, limit) = (1.702, 7.0);
            let gate = gate.minimum(limit)?;
            let lo = Array::weak_scalar(Scalar::Float(-limit), x.dtype())?;
            let hi = Array::weak_scalar(Scalar::Float(limit), x.dtype())?;
            let x = x.clip(Some(&lo), Some(&hi))?;
            let glu = gate.multiply(&gate.multiply(alpha)?.sigmoid()?)?;
            Ok(vec![x.add(1.0)?.multiply(&glu)?])
        },
        &[gate, x],
    )
}

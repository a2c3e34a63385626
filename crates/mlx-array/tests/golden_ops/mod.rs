//! Replays one golden case (op name + JSON parameters) through mlx-array's API.
use mlx_array::fast::{self, RopeOffset, SdpaMask};
use mlx_array::linalg::{self, NormOrd};
use mlx_array::quant::{self, QuantMode};
use mlx_array::transforms::{jvp, value_and_grad, vjp};
use mlx_array::{
    activations as act, ops, random, Array, Closure, Dtype, Error, Operand, Result, Scalar,
};
use serde_json::Value;

/// The parameters of a case.
pub struct P<'a>(pub &'a Value);

fn bad(what: String) -> Error {
    Error::InvalidArgument(what)
}

impl P<'_> {
    fn get(&self, k: &str) -> Result<&Value> {
        self.0
            .get(k)
            .ok_or_else(|| bad(format!("missing param `{k}`")))
    }
    fn is_null(&self, k: &str) -> bool {
        self.0.get(k).is_none_or(Value::is_null)
    }
    fn f64(&self, k: &str) -> Result<f64> {
        self.get(k)?
            .as_f64()
            .ok_or_else(|| bad(format!("param `{k}` is not a number")))
    }
    fn i32(&self, k: &str) -> Result<i32> {
        let v = self
            .get(k)?
            .as_i64()
            .ok_or_else(|| bad(format!("param `{k}` is not an int")))?;
        i32::try_from(v).map_err(|_| bad(format!("param `{k}` out of i32 range")))
    }
    fn opt_i32(&self, k: &str) -> Result<Option<i32>> {
        if self.is_null(k) {
            Ok(None)
        } else {
            self.i32(k).map(Some)
        }
    }
    fn bool(&self, k: &str) -> Result<bool> {
        self.get(k)?
            .as_bool()
            .ok_or_else(|| bad(format!("param `{k}` is not a bool")))
    }
    fn str(&self, k: &str) -> Result<&str> {
        self.get(k)?
            .as_str()
            .ok_or_else(|| bad(format!("param `{k}` is not a string")))
    }
    fn ints(&self, k: &str) -> Result<Vec<i32>> {
        self.get(k)?
            .as_array()
            .ok_or_else(|| bad(format!("param `{k}` is not a list")))?
            .iter()
            .map(|v| v.as_i64().and_then(|v| i32::try_from(v).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(format!("param `{k}` is not a list of ints")))
    }
    fn opt_ints(&self, k: &str) -> Result<Option<Vec<i32>>> {
        if self.is_null(k) {
            Ok(None)
        } else {
            self.ints(k).map(Some)
        }
    }
    fn dtype(&self, k: &str) -> Result<Dtype> {
        let n = self.str(k)?;
        Dtype::from_name(n).ok_or_else(|| bad(format!("unknown dtype `{n}`")))
    }
    fn mode(&self) -> Result<QuantMode> {
        QuantMode::parse(self.str("mode")?)
    }
}

fn unary(name: &str, a: &Array) -> Result<Array> {
    match name {
        "abs" => a.abs(),
        "negative" => a.negative(),
        "sign" => a.sign(),
        "floor" => a.floor(),
        "ceil" => a.ceil(),
        "square" => a.square(),
        "sqrt" => a.sqrt(),
        "rsqrt" => a.rsqrt(),
        "reciprocal" => a.reciprocal(),
        "exp" => a.exp(),
        "expm1" => a.expm1(),
        "log" => a.log(),
        "log1p" => a.log1p(),
        "log2" => a.log2(),
        "log10" => a.log10(),
        "sin" => a.sin(),
        "cos" => a.cos(),
        "tan" => a.tan(),
        "arcsin" => a.arcsin(),
        "arccos" => a.arccos(),
        "arctan" => a.arctan(),
        "sinh" => a.sinh(),
        "cosh" => a.cosh(),
        "tanh" => a.tanh(),
        "arcsinh" => a.arcsinh(),
        "arccosh" => a.arccosh(),
        "arctanh" => a.arctanh(),
        "sigmoid" => a.sigmoid(),
        "erf" => a.erf(),
        "erfinv" => a.erfinv(),
        "round" => a.round(0),
        "degrees" => a.degrees(),
        "radians" => a.radians(),
        "isnan" => a.isnan(),
        "isinf" => a.isinf(),
        "isfinite" => a.isfinite(),
        "stop_gradient" => a.stop_gradient(),
        "trunc" => a.trunc(),
        "logical_not" => a.logical_not(),
        "bitwise_invert" => a.bitwise_invert(),
        other => Err(bad(format!("unknown unary op `{other}`"))),
    }
}

fn binary<'o>(name: &str, a: &Array, b: impl Operand<'o>) -> Result<Array> {
    match name {
        "add" => a.add(b),
        "subtract" => a.subtract(b),
        "multiply" => a.multiply(b),
        "divide" => a.divide(b),
        "floor_divide" => a.floor_divide(b),
        "remainder" => a.remainder(b),
        "power" => a.power(b),
        "maximum" => a.maximum(b),
        "minimum" => a.minimum(b),
        "equal" => a.equal(b),
        "not_equal" => a.not_equal(b),
        "greater" => a.greater(b),
        "greater_equal" => a.greater_equal(b),
        "less" => a.less(b),
        "less_equal" => a.less_equal(b),
        "logical_and" => a.logical_and(b),
        "logical_or" => a.logical_or(b),
        "bitwise_and" => a.bitwise_and(b),
        "bitwise_or" => a.bitwise_or(b),
        "bitwise_xor" => a.bitwise_xor(b),
        "left_shift" => a.left_shift(b),
        "right_shift" => a.right_shift(b),
        "arctan2" => a.arctan2(b),
        "logaddexp" => a.logaddexp(b),
        other => Err(bad(format!("unknown binary op `{other}`"))),
    }
}

fn reduce(name: &str, a: &Array, axes: Option<&[i32]>, kd: bool) -> Result<Array> {
    match name {
        "sum" => a.sum(axes, kd),
        "mean" => a.mean(axes, kd),
        "max" => a.max(axes, kd),
        "min" => a.min(axes, kd),
        "prod" => a.prod(axes, kd),
        "all" => a.all(axes, kd),
        "any" => a.any(axes, kd),
        "logsumexp" => a.logsumexp(axes, kd),
        other => Err(bad(format!("unknown reduction `{other}`"))),
    }
}

/// The activations by name, as in the goldens' `ACTS` table.
pub fn activation(name: &str, x: &[Array]) -> Result<Array> {
    let arg = |i: usize| {
        x.get(i)
            .ok_or_else(|| bad(format!("{name}: missing input {i}")))
    };
    match name {
        "silu" => act::silu(arg(0)?),
        "relu" => act::relu(arg(0)?),
        "relu2" => act::relu2(arg(0)?),
        "relu6" => act::relu6(arg(0)?),
        "leaky_relu" => act::leaky_relu(arg(0)?, 0.01),
        "elu" => act::elu(arg(0)?, 1.0),
        "gelu" => act::gelu(arg(0)?),
        "gelu_approx" => act::gelu_approx(arg(0)?),
        "gelu_fast_approx" => act::gelu_fast_approx(arg(0)?),
        "softplus" => act::softplus(arg(0)?),
        "softsign" => act::softsign(arg(0)?),
        "log_sigmoid" => act::log_sigmoid(arg(0)?),
        "mish" => act::mish(arg(0)?),
        "hardswish" => act::hardswish(arg(0)?),
        "sigmoid" => arg(0)?.sigmoid(),
        "tanh" => arg(0)?.tanh(),
        "log_softmax" => act::log_softmax(arg(0)?, -1),
        "swiglu" => act::swiglu(arg(0)?, arg(1)?),
        "swiglu_oai" => act::swiglu_oai(arg(0)?, arg(1)?, 1.702, 7.0),
        other => Err(bad(format!("unknown activation `{other}`"))),
    }
}

/// `sum(silu(x @ w)) * 0.25`, the loss of the `value_and_grad` goldens.
fn loss(a: &[Array]) -> Result<Vec<Array>> {
    let h = a[0].matmul(&a[1])?;
    Ok(vec![h
        .multiply(&h.sigmoid()?)?
        .sum(None, false)?
        .multiply(0.25)?])
}

/// `[exp(x) * y + sin(x), sum(|x - y|, -1)]`, the function of the compile goldens.
fn g(a: &[Array]) -> Result<Vec<Array>> {
    let (x, y) = (&a[0], &a[1]);
    Ok(vec![
        x.exp()?.multiply(y)?.add(&x.sin()?)?,
        x.subtract(y)?.abs()?.sum(Some(&[-1]), false)?,
    ])
}

fn f32s(v: f64) -> Result<Array> {
    Array::scalar(v as f32)
}

fn quantized_parts(mode: QuantMode, x: &[Array], at: usize) -> (Option<&Array>, usize) {
    if mode == QuantMode::Affine {
        (x.get(at), at + 1)
    } else {
        (None, at)
    }
}

/// Runs one case; returns its outputs in the order Python stored them.
pub fn run(op: &str, p: &P<'_>, x: &[Array]) -> Result<Vec<Array>> {
    let one = |r: Result<Array>| r.map(|a| vec![a]);
    match op {
        "unary" => {
            let a = if p.is_null("pre_add") {
                x[0].clone()
            } else {
                x[0].add(p.i32("pre_add")?)?
            };
            one(unary(p.str("fn")?, &a))
        }
        "binary" => one(binary(p.str("fn")?, &x[0], &x[1])),
        "binary_scalar" => {
            let (f, v, int) = (p.str("fn")?, p.f64("scalar")?, p.bool("int")?);
            if p.bool("left")? {
                let s = if int {
                    Scalar::Int(v as i64)
                } else {
                    Scalar::Float(v)
                };
                one(binary(f, &Array::weak_scalar(s, x[0].dtype())?, &x[0]))
            } else if int {
                one(binary(f, &x[0], v as i64))
            } else {
                one(binary(f, &x[0], v))
            }
        }
        "where" => one(ops::where_(&x[0], &x[1], &x[2])),
        "clip" => {
            let lo = Array::weak_scalar(Scalar::Float(p.f64("min")?), x[0].dtype())?;
            let hi = Array::weak_scalar(Scalar::Float(p.f64("max")?), x[0].dtype())?;
            one(x[0].clip(Some(&lo), Some(&hi)))
        }
        "round" => one(x[0].round(p.i32("decimals")?)),
        "astype" => one(x[0].astype(p.dtype("dtype")?)),
        "view" => one(x[0].view(p.dtype("dtype")?)),
        "matmul" => one(x[0].matmul(&x[1])),
        "addmm" => one(ops::addmm(
            &x[0],
            &x[1],
            &x[2],
            p.f64("alpha")? as f32,
            p.f64("beta")? as f32,
        )),
        "reduce" => one(reduce(
            p.str("fn")?,
            &x[0],
            p.opt_ints("axes")?.as_deref(),
            p.bool("keepdims")?,
        )),
        "var" | "std" => {
            let (axes, kd, ddof) = (p.opt_ints("axes")?, p.bool("keepdims")?, p.i32("ddof")?);
            if op == "var" {
                one(x[0].var(axes.as_deref(), kd, ddof))
            } else {
                one(x[0].std(axes.as_deref(), kd, ddof))
            }
        }
        "softmax" => one(x[0].softmax(p.opt_ints("axes")?.as_deref(), p.bool("precise")?)),
        "argmax" => one(x[0].argmax(p.opt_i32("axis")?, p.bool("keepdims")?)),
        "argmin" => one(x[0].argmin(p.opt_i32("axis")?, p.bool("keepdims")?)),
        "sort" => one(x[0].sort(p.opt_i32("axis")?)),
        "argsort" => one(x[0].argsort(p.opt_i32("axis")?)),
        "partition" => one(x[0].partition(p.i32("kth")?, p.opt_i32("axis")?)),
        "argpartition" => one(x[0].argpartition(p.i32("kth")?, p.opt_i32("axis")?)),
        "topk" => one(x[0].topk(p.i32("k")?, p.opt_i32("axis")?)),
        "scan" => {
            let (axis, rev, inc) = (p.i32("axis")?, p.bool("reverse")?, p.bool("inclusive")?);
            one(match p.str("fn")? {
                "cumsum" => x[0].cumsum(axis, rev, inc),
                "cumprod" => x[0].cumprod(axis, rev, inc),
                "cummax" => x[0].cummax(axis, rev, inc),
                "cummin" => x[0].cummin(axis, rev, inc),
                "logcumsumexp" => x[0].logcumsumexp(axis, rev, inc),
                other => Err(bad(format!("unknown scan `{other}`"))),
            })
        }
        "reshape" => one(x[0].reshape(&p.ints("shape")?)),
        "transpose" => one(x[0].transpose(p.opt_ints("axes")?.as_deref())),
        "swapaxes" => one(x[0].swapaxes(p.i32("a1")?, p.i32("a2")?)),
        "moveaxis" => one(x[0].moveaxis(p.i32("src")?, p.i32("dst")?)),
        "expand_dims" => one(x[0].expand_dims(&p.ints("axes")?)),
        "squeeze" => one(x[0].squeeze(p.opt_ints("axes")?.as_deref())),
        "flatten" => one(x[0].flatten(p.i32("start")?, p.i32("end")?)),
        "unflatten" => one(x[0].unflatten(p.i32("axis")?, &p.ints("shape")?)),
        "concatenate" => one(ops::concatenate(
            &x.iter().collect::<Vec<_>>(),
            p.i32("axis")?,
        )),
        "stack" => one(ops::stack(&x.iter().collect::<Vec<_>>(), p.i32("axis")?)),
        "split_sections" => x[0].split_sections(p.i32("n")?, p.i32("axis")?),
        "split_at" => x[0].split_at(&p.ints("indices")?, p.i32("axis")?),
        "pad" => {
            let value = if p.is_null("value") {
                None
            } else {
                Some(Array::weak_scalar(
                    Scalar::Float(p.f64("value")?),
                    x[0].dtype(),
                )?)
            };
            let (axes, lo, hi) = (p.ints("axes")?, p.ints("low")?, p.ints("high")?);
            one(x[0].pad(&axes, &lo, &hi, value.as_ref(), p.str("mode")?))
        }
        "repeat" => one(x[0].repeat(p.i32("repeats")?, p.opt_i32("axis")?)),
        "tile" => one(x[0].tile(&p.ints("reps")?)),
        "broadcast_to" => one(x[0].broadcast_to(&p.ints("shape")?)),
        "flip" => one(x[0].flip(p.opt_ints("axes")?.as_deref())),
        "roll" => one(x[0].roll(p.i32("shift")?, p.opt_i32("axis")?)),
        "slice" => one(x[0].slice(
            &p.ints("start")?,
            &p.ints("stop")?,
            Some(&p.ints("strides")?),
        )),
        "slice_update" => {
            let (b, e, s) = (p.ints("start")?, p.ints("stop")?, p.ints("strides")?);
            one(x[0].slice_update(&x[1], &b, &e, Some(&s)))
        }
        "slice_dynamic" => one(x[0].slice_dynamic(&x[1], &p.ints("axes")?, &p.ints("size")?)),
        "slice_update_dynamic" => one(x[0].slice_update_dynamic(&x[1], &x[2], &p.ints("axes")?)),
        "take" => one(x[0].take(&x[1], p.opt_i32("axis")?)),
        "take_along_axis" => one(x[0].take_along_axis(&x[1], p.i32("axis")?)),
        "put_along_axis" => one(x[0].put_along_axis(&x[1], &x[2], p.i32("axis")?)),
        "scatter" => {
            let kind = match p.str("kind")? {
                "set" => ops::ScatterKind::Set,
                "add" => ops::ScatterKind::Add,
                "prod" => ops::ScatterKind::Prod,
                "max" => ops::ScatterKind::Max,
                "min" => ops::ScatterKind::Min,
                other => return Err(bad(format!("unknown scatter kind `{other}`"))),
            };
            let upd = x[2].reshape(&p.ints("updates_shape")?)?;
            one(x[0].scatter(kind, &[&x[1]], &upd, &p.ints("axes")?))
        }
        "gather" => {
            let idx: Vec<&Array> = x[1..].iter().collect();
            let r = x[0].gather(&idx, &p.ints("axes")?, &p.ints("slice_sizes")?)?;
            one(r.reshape(&p.ints("out_shape")?))
        }
        "masked_scatter" => one(x[0].masked_scatter(&x[1], &x[2])),
        "tril" => one(x[0].tril(p.i32("k")?)),
        "triu" => one(x[0].triu(p.i32("k")?)),
        "arange" => one(ops::arange(
            p.f64("start")?,
            p.f64("stop")?,
            p.f64("step")?,
            p.dtype("dtype")?,
        )),
        "zeros" => one(ops::zeros(&p.ints("shape")?, p.dtype("dtype")?)),
        "ones" => one(ops::ones(&p.ints("shape")?, p.dtype("dtype")?)),
        "full" => {
            let dt = p.dtype("dtype")?;
            let v = if x.is_empty() {
                Array::scalar_f64(p.f64("value")?, dt)?
            } else {
                x[0].clone()
            };
            one(ops::full(&p.ints("shape")?, &v, dt))
        }
        "eye" => one(ops::eye(
            p.i32("n")?,
            Some(p.i32("m")?),
            p.i32("k")?,
            p.dtype("dtype")?,
        )),
        "tri" => one(ops::tri(
            p.i32("n")?,
            Some(p.i32("m")?),
            p.i32("k")?,
            p.dtype("dtype")?,
        )),
        "linspace" => one(ops::linspace(
            p.f64("start")?,
            p.f64("stop")?,
            p.i32("num")?,
            p.dtype("dtype")?,
        )),
        "activation" => {
            let name = p.str("fn")?.to_string();
            let plain = activation(&name, x)?;
            let compiled =
                Closure::new(move |a: &[Array]| Ok(vec![activation(&name, a)?]))?.compile(true)?;
            let c = compiled.call(&x.iter().collect::<Vec<_>>())?;
            Ok(vec![
                c.into_iter()
                    .next()
                    .ok_or_else(|| bad("compiled closure returned nothing".into()))?,
                plain,
            ])
        }
        _ => run_more(op, p, x),
    }
}

fn run_more(op: &str, p: &P<'_>, x: &[Array]) -> Result<Vec<Array>> {
    let one = |r: Result<Array>| r.map(|a| vec![a]);
    match op {
        "rms_norm" => one(fast::rms_norm(&x[0], x.get(1), p.f64("eps")? as f32)),
        "layer_norm" => one(fast::layer_norm(
            &x[0],
            x.get(1),
            x.get(2),
            p.f64("eps")? as f32,
        )),
        "rope" => {
            let base = if p.is_null("base") {
                None
            } else {
                Some(p.f64("base")? as f32)
            };
            let (offset, freqs) = match p.get("offset")? {
                Value::String(_) => (RopeOffset::Array(&x[1]), None),
                _ => (
                    RopeOffset::Int(p.i32("offset")?),
                    if base.is_none() { x.get(1) } else { None },
                ),
            };
            let (dims, trad, scale) = (
                p.i32("dims")?,
                p.bool("traditional")?,
                p.f64("scale")? as f32,
            );
            one(fast::rope(&x[0], dims, trad, base, scale, offset, freqs))
        }
        "sdpa" => {
            let mask = match p.str("mask")? {
                "none" => SdpaMask::None,
                "causal" => SdpaMask::Causal,
                _ => SdpaMask::Array(&x[3]),
            };
            let sinks = if p.bool("sinks")? { x.last() } else { None };
            one(fast::scaled_dot_product_attention(
                &x[0],
                &x[1],
                &x[2],
                p.f64("scale")? as f32,
                mask,
                sinks,
            ))
        }
        "quantize" => {
            let q = quant::quantize(
                &x[0],
                p.opt_i32("group_size")?,
                p.opt_i32("bits")?,
                p.mode()?,
            )?;
            Ok([Some(q.weight), Some(q.scales), q.biases]
                .into_iter()
                .flatten()
                .collect())
        }
        "dequantize" => {
            let mode = p.mode()?;
            let (b, _) = quantized_parts(mode, x, 2);
            let dt = if p.is_null("dtype") {
                None
            } else {
                Some(p.dtype("dtype")?)
            };
            one(quant::dequantize(
                &x[0],
                &x[1],
                b,
                p.opt_i32("group_size")?,
                p.opt_i32("bits")?,
                mode,
                dt,
            ))
        }
        "quantized_matmul" => {
            let mode = p.mode()?;
            let (b, _) = quantized_parts(mode, x, 3);
            let (t, gs, bits) = (
                p.bool("transpose")?,
                p.opt_i32("group_size")?,
                p.opt_i32("bits")?,
            );
            one(quant::quantized_matmul(
                &x[0], &x[1], &x[2], b, t, gs, bits, mode,
            ))
        }
        "gather_qmm" => {
            let mode = p.mode()?;
            let (b, mut at) = quantized_parts(mode, x, 3);
            let lhs = if p.bool("lhs")? {
                at += 1;
                x.get(at - 1)
            } else {
                None
            };
            let rhs = if p.bool("rhs")? { x.get(at) } else { None };
            let (t, gs, bits) = (
                p.bool("transpose")?,
                p.opt_i32("group_size")?,
                p.opt_i32("bits")?,
            );
            one(quant::gather_qmm(
                &x[0],
                &x[1],
                &x[2],
                b,
                lhs,
                rhs,
                t,
                gs,
                bits,
                mode,
                p.bool("sorted")?,
            ))
        }
        "gather_mm" => {
            let mut at = 2;
            let lhs = if p.bool("lhs")? {
                at += 1;
                x.get(at - 1)
            } else {
                None
            };
            let rhs = if p.bool("rhs")? { x.get(at) } else { None };
            one(quant::gather_mm(&x[0], &x[1], lhs, rhs, p.bool("sorted")?))
        }
        "to_fp8" => one(quant::to_fp8(&x[0])),
        "from_fp8" => one(quant::from_fp8(&x[0], p.dtype("dtype")?)),
        "random" => run_random(p, x),
        "random_sequence" => {
            let seed = p.get("seed")?.as_u64().ok_or_else(|| bad("seed".into()))?;
            random::seed(seed)?;
            let a = random::normal(&[3], Dtype::Float32, None, None, None)?;
            let b = random::uniform(&f32s(0.0)?, &f32s(1.0)?, &[2, 2], Dtype::Float32, None)?;
            let c = random::randint(
                &Array::scalar(0i32)?,
                &Array::scalar(100i32)?,
                &[4],
                Dtype::Int32,
                None,
            )?;
            let l = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[1, 4])?;
            let d = random::categorical(&l, -1, None, None)?;
            // Keys are split off the global key when a draw is built, not when it runs.
            random::seed(seed)?;
            let e = random::normal(&[3], Dtype::Float32, None, None, None)?;
            Ok(vec![a, b, c, d, e])
        }
        "random_sampler" => {
            // mlx-lm's `categorical_sampling`, compiled, with the key passed in explicitly.
            let seed = p.get("seed")?.as_u64().ok_or_else(|| bad("seed".into()))?;
            let inv_temp = 1.0 / p.f64("temp")?;
            let f = Closure::new(move |a: &[Array]| {
                Ok(vec![random::categorical(
                    &a[0].multiply(inv_temp)?,
                    -1,
                    None,
                    Some(&a[1]),
                )?])
            })?
            .compile(false)?;
            random::seed(seed)?;
            let first = f.call(&[&x[0], &random::next_key()?])?;
            let second = f.call(&[&x[0], &random::next_key()?])?;
            Ok(first.into_iter().chain(second).collect())
        }
        "linalg" => run_linalg(p, x),
        "value_and_grad" => {
            let (v, g) = value_and_grad(loss, &[&x[0], &x[1]], &p.ints("argnums")?)?;
            Ok(v.into_iter().chain(g).collect())
        }
        "vjp" => {
            let f = |a: &[Array]| Ok(vec![a[0].sin()?.multiply(&a[0])?, a[0].exp()?]);
            let (o, g) = vjp(f, &[&x[0]], &[&x[1], &x[2]])?;
            Ok(o.into_iter().chain(g).collect())
        }
        "jvp" => {
            let f = |a: &[Array]| Ok(vec![a[0].multiply(&a[1])?.add(&a[0].tanh()?)?]);
            let (o, t) = jvp(f, &[&x[0], &x[1]], &[&x[2], &x[3]])?;
            Ok(o.into_iter().chain(t).collect())
        }
        "compile" => {
            let c = Closure::new(g)?.compile(p.bool("shapeless")?)?;
            let mut out = c.call(&[&x[0], &x[1]])?;
            if x.len() == 4 {
                out.extend(c.call(&[&x[2], &x[3]])?);
            }
            Ok(out)
        }
        "plain" => g(x),
        other => Err(bad(format!("unknown op `{other}`"))),
    }
}

fn run_random(p: &P<'_>, x: &[Array]) -> Result<Vec<Array>> {
    let one = |r: Result<Array>| r.map(|a| vec![a]);
    let key = x.last();
    match p.str("fn")? {
        "key" => one(random::key(
            p.get("seed")?.as_u64().ok_or_else(|| bad("seed".into()))?,
        )),
        "split" => one(random::split(&x[0], p.i32("num")?)),
        "normal" => {
            let loc = if p.is_null("loc") {
                None
            } else {
                Some(f32s(p.f64("loc")?)?)
            };
            let scale = if p.is_null("scale") {
                None
            } else {
                Some(f32s(p.f64("scale")?)?)
            };
            one(random::normal(
                &p.ints("shape")?,
                p.dtype("dtype")?,
                loc.as_ref(),
                scale.as_ref(),
                key,
            ))
        }
        "uniform" => {
            let (lo, hi) = (f32s(p.f64("low")?)?, f32s(p.f64("high")?)?);
            one(random::uniform(
                &lo,
                &hi,
                &p.ints("shape")?,
                p.dtype("dtype")?,
                key,
            ))
        }
        "randint" => {
            let (lo, hi) = (
                Array::scalar(p.i32("low")?)?,
                Array::scalar(p.i32("high")?)?,
            );
            one(random::randint(
                &lo,
                &hi,
                &p.ints("shape")?,
                p.dtype("dtype")?,
                key,
            ))
        }
        "gumbel" => one(random::gumbel(&p.ints("shape")?, p.dtype("dtype")?, key)),
        "categorical" => one(random::categorical(
            &x[0],
            p.i32("axis")?,
            p.opt_i32("num_samples")?,
            key,
        )),
        "bernoulli" => {
            let prob = match p.get("p")? {
                Value::String(_) => x[0].clone(),
                _ => f32s(p.f64("p")?)?,
            };
            one(random::bernoulli(&prob, &p.ints("shape")?, key))
        }
        "truncated_normal" => {
            let (lo, hi) = (f32s(p.f64("low")?)?, f32s(p.f64("high")?)?);
            one(random::truncated_normal(
                &lo,
                &hi,
                &p.ints("shape")?,
                p.dtype("dtype")?,
                key,
            ))
        }
        "permutation" => one(random::permutation_n(p.i32("n")?, key)),
        "permutation_array" => one(random::permutation(&x[0], p.i32("axis")?, key)),
        other => Err(bad(format!("unknown random fn `{other}`"))),
    }
}

fn run_linalg(p: &P<'_>, x: &[Array]) -> Result<Vec<Array>> {
    let one = |r: Result<Array>| r.map(|a| vec![a]);
    match p.str("fn")? {
        "cholesky" => one(linalg::cholesky(&x[0], p.bool("upper")?)),
        "inv" => one(linalg::inv(&x[0])),
        "solve" => one(linalg::solve(&x[0], &x[1])),
        "qr" => linalg::qr(&x[0]).map(|(q, r)| vec![q, r]),
        "svd" => linalg::svd(&x[0], p.bool("compute_uv")?),
        "norm" => {
            let name;
            let ord = match p.get("ord")? {
                Value::Null => NormOrd::Default,
                Value::String(s) if s == "inf" => NormOrd::Num(f64::INFINITY),
                Value::String(s) => {
                    name = s.clone();
                    NormOrd::Name(&name)
                }
                _ => NormOrd::Num(p.f64("ord")?),
            };
            one(linalg::norm(
                &x[0],
                ord,
                p.opt_ints("axes")?.as_deref(),
                p.bool("keepdims")?,
            ))
        }
        other => Err(bad(format!("unknown linalg fn `{other}`"))),
    }
}

//! `mlx_lm.gptq`: GPTQ quantization (Frantar et al., 2022) as mlx-lm 0.32 does it.
//!
//! Each dense `Linear` and `SwitchLinear` layer collects the Hessian `H = sum x^T x` of its
//! inputs over calibration batches (mlx-lm's `Catcher`, here [`mlx_nn::tap`]). Its weight,
//! in float32, is then quantized group by group: a group's scales and biases are
//! `mx.quantize`'s for the group as it stands, and each column's rounding error, divided
//! by the diagonal of the upper Cholesky factor of `H^-1` (after damping `H`'s diagonal by
//! 1% of its mean), is spread over the columns not yet quantized. The layers GPTQ does not
//! cover (embeddings) are quantized plainly at the fallback bits and group size, recorded
//! per layer in the config's `quantization` section as mlx-lm does.
//!
//! Same operations in the same order as mlx-lm, so the same calibration rows give the same
//! weights bit for bit (`tests/gptq.rs` against `goldens/gptq`, written by
//! `xtask/py/gptq_oracle.py`).
use crate::error::{QuantError, Result};
use crate::model::{bits_per_weight, layer_specs, set_quantization, LoadedModel};
use mlx_array::device::{with_stream, Device};
use mlx_array::quant::{quantize, QuantMode};
use mlx_array::{linalg, ops, transforms, Array, Dtype};
use mlx_nn::{
    LinearLayer, Param, QuantSpec, Quantizable, QuantizedLinear, QuantizedSwitchLinear,
    SwitchLinearLayer,
};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// GPTQ's settings (`mlx_lm.gptq`'s flags and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptqOptions {
    /// Bits of the GPTQ layers (2, 4 or 8; `--bits`).
    pub bits: i32,
    /// Group size of the GPTQ layers (`--group-size`).
    pub group_size: i32,
    /// Bits of the other quantizable layers (`--fallback-bits`).
    pub fallback_bits: i32,
    /// Group size of the other quantizable layers (`--fallback-group-size`).
    pub fallback_group_size: i32,
    /// Calibration rows a forward pass (mlx-lm: 8, not a flag).
    pub batch_size: usize,
    /// Each batch's `x^T x` as a float32 product (ours, `--hessian-float32`); mlx-lm
    /// multiplies in the activations' dtype, which for bfloat16 rounds every entry of the
    /// Hessian to 8 bits of mantissa.
    pub hessian_float32: bool,
}

impl Default for GptqOptions {
    fn default() -> Self {
        GptqOptions {
            bits: 4,
            group_size: 64,
            fallback_bits: 6,
            fallback_group_size: 64,
            batch_size: 8,
            hessian_float32: false,
        }
    }
}

impl GptqOptions {
    /// Checks the settings (mlx-lm asserts 2, 4 or 8 bits in its packing).
    pub fn validate(&self) -> Result<()> {
        if ![2, 4, 8].contains(&self.bits) {
            return Err(QuantError::Options(format!(
                "GPTQ packs 2, 4 or 8 bits (--bits), not {}",
                self.bits
            )));
        }
        if self.group_size <= 0 || self.fallback_group_size <= 0 {
            return Err(QuantError::Options(format!(
                "group sizes must be positive (--group-size {}, --fallback-group-size {})",
                self.group_size, self.fallback_group_size
            )));
        }
        if self.batch_size == 0 {
            return Err(QuantError::Options(
                "the batch size must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Where [`gptq_quantize`] is: `(phase, done, total)` with phase `"Computing Hessians"`
/// or `"Quantizing"`.
pub type Progress<'a> = dyn FnMut(&str, usize, usize) + 'a;

/// A layer GPTQ quantizes: its path, its weight's [`Param::id`] and the Hessian so far.
struct Target {
    path: String,
    id: u64,
    hessian: Option<Array>,
}

/// Quantizes `model` with GPTQ on `data` (`[rows, length]` token ids), records the
/// `quantization` section (and its `quantization_config` mirror) in its config and
/// returns the bits per weight.
pub fn gptq_quantize(
    model: &mut LoadedModel,
    data: &Array,
    opts: &GptqOptions,
    progress: &mut Progress<'_>,
) -> Result<f64> {
    opts.validate()?;
    if let Some((path, _)) = layer_specs(model.module_mut()?)?
        .into_iter()
        .find(|(_, s)| s.is_some())
    {
        return Err(QuantError::Unsupported(format!(
            "the model is already quantized (layer `{path}`): GPTQ needs a dense model \
             (dequantize it first with mlx-convert -d)"
        )));
    }
    let mut targets = gptq_layers(model, opts.group_size)?;
    if targets.is_empty() {
        return Err(QuantError::Unsupported(
            "the model has no dense Linear or SwitchLinear layer for GPTQ".into(),
        ));
    }
    collect_hessians(model, data, opts, &mut targets, progress)?;

    let mut hessians: HashMap<String, Array> = HashMap::new();
    for t in targets.iter_mut() {
        match t.hessian.take() {
            Some(h) => {
                hessians.insert(t.path.clone(), h);
            }
            None => {
                return Err(QuantError::Unsupported(format!(
                    "layer `{}` received no input during calibration, so GPTQ has no \
                     Hessian for it",
                    t.path
                )))
            }
        }
    }
    let total = targets.len();
    let mut done = 0;
    let spec = QuantSpec::new(Some(opts.group_size), Some(opts.bits), QuantMode::Affine);
    model
        .module_mut()?
        .visit_quantizable_mut("", &mut |path, layer| {
            let Some(h) = hessians.remove(path) else {
                return Ok(());
            };
            quantize_layer(layer, &h, spec).map_err(|e| mlx_nn::Error::Quantization {
                path: path.to_string(),
                message: e.to_string(),
            })?;
            done += 1;
            progress("Quantizing", done, total);
            Ok(())
        })?;

    // The layers GPTQ does not cover, at the fallback setting, one config entry each.
    let mut section = Map::new();
    section.insert("bits".into(), opts.bits.into());
    section.insert("group_size".into(), opts.group_size.into());
    let fallback = QuantSpec::new(
        Some(opts.fallback_group_size),
        Some(opts.fallback_bits),
        QuantMode::Affine,
    );
    let mut entries = Vec::new();
    mlx_nn::quantize_module(model.module_mut()?, &mut |path, layer| {
        if layer.quant_spec().is_some() {
            return Ok(None);
        }
        entries.push(path.to_string());
        Ok(Some(fallback))
    })?;
    for path in entries {
        let mut m = Map::new();
        m.insert("bits".into(), opts.fallback_bits.into());
        m.insert("group_size".into(), opts.fallback_group_size.into());
        section.insert(path, Value::Object(m));
    }
    set_quantization(model, section);
    bits_per_weight(model.module_mut()?)
}

/// GPTQ on one dense `Linear` or `SwitchLinear` layer with its Hessian `h`: the layer
/// becomes its quantized form, scales and biases (and the output bias) in the weight's
/// dtype (mlx-lm's `set_dtype(orig_type)`).
fn quantize_layer(layer: &mut dyn Quantizable, h: &Array, spec: QuantSpec) -> Result<()> {
    let hinv = inverse_hessian(h)?;
    if let Some(l) = layer.as_linear_layer_mut() {
        let LinearLayer::Dense(d) = l else {
            return Ok(());
        };
        let p = quantized_parts(&d.weight, d.bias.as_ref(), &hinv, spec)?;
        *l = LinearLayer::Quantized(QuantizedLinear {
            weight: p.weight,
            scales: p.scales,
            biases: Some(p.biases),
            bias: p.bias,
            spec,
        });
    } else if let Some(s) = layer.as_switch_layer_mut() {
        let SwitchLinearLayer::Dense(d) = s else {
            return Ok(());
        };
        let p = quantized_parts(&d.weight, d.bias.as_ref(), &hinv, spec)?;
        *s = SwitchLinearLayer::Quantized(QuantizedSwitchLinear {
            weight: p.weight,
            scales: p.scales,
            biases: Some(p.biases),
            bias: p.bias,
            spec,
        });
    }
    Ok(())
}

/// A quantized layer's parameters, evaluated.
struct Parts {
    weight: Param,
    scales: Param,
    biases: Param,
    bias: Option<Param>,
}

/// GPTQ's packed weight of a dense `weight` and its scales, biases and output bias in the
/// weight's dtype.
fn quantized_parts(
    weight: &Param,
    bias: Option<&Param>,
    hinv: &Array,
    spec: QuantSpec,
) -> Result<Parts> {
    let (packed, scales, biases) = quantize_columns(weight.value(), hinv, spec)?;
    let dtype = weight.dtype();
    let p = Parts {
        weight: Param::frozen(packed),
        scales: Param::frozen(scales.astype(dtype)?),
        biases: Param::frozen(biases.astype(dtype)?),
        bias: cast_param(bias, dtype)?,
    };
    let mut all = vec![p.weight.value(), p.scales.value(), p.biases.value()];
    all.extend(p.bias.as_ref().map(|b| b.value()));
    transforms::eval(&all)?;
    Ok(p)
}

/// The dense `Linear` and `SwitchLinear` layers (mlx-lm's `gptq_types`), in traversal
/// order; an input size the group size does not divide is an error naming the layer.
fn gptq_layers(model: &mut LoadedModel, group_size: i32) -> Result<Vec<Target>> {
    let mut out = Vec::new();
    model
        .module_mut()?
        .visit_quantizable_mut("", &mut |path, layer| {
            let weight = if let Some(l) = layer.as_linear_layer_mut() {
                match l {
                    LinearLayer::Dense(d) => Some(d.weight.clone()),
                    _ => None,
                }
            } else if let Some(s) = layer.as_switch_layer_mut() {
                match s {
                    SwitchLinearLayer::Dense(d) => Some(d.weight.clone()),
                    _ => None,
                }
            } else {
                None
            };
            if let Some(w) = weight {
                let in_dims = w.shape().last().copied().unwrap_or(0);
                if in_dims % group_size != 0 {
                    return Err(mlx_nn::Error::Quantization {
                        path: path.to_string(),
                        message: format!(
                            "input dimension {in_dims} is not a multiple of the group size \
                         {group_size}"
                        ),
                    });
                }
                out.push(Target {
                    path: path.to_string(),
                    id: w.id(),
                    hessian: None,
                });
            }
            Ok(())
        })?;
    Ok(out)
}

/// `H += x^T x` for every GPTQ layer over the calibration rows, `batch_size` at a time,
/// `x` flattened to `[rows, input_dims]` as each layer received it (in call order).
fn collect_hessians(
    model: &LoadedModel,
    data: &Array,
    opts: &GptqOptions,
    targets: &mut [Target],
    progress: &mut Progress<'_>,
) -> Result<()> {
    if data.ndim() != 2 {
        return Err(QuantError::Options(format!(
            "calibration data must be [rows, length] token ids, got shape {:?}",
            data.shape()
        )));
    }
    let index: HashMap<u64, usize> = targets.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
    let rows = data.dim(0)?;
    let batch_size = opts.batch_size;
    let bs = batch_size as i32;
    let batches = (rows as usize).div_ceil(batch_size);
    for (b, start) in (0..rows).step_by(batch_size).enumerate() {
        let batch = data.slice_axis(0, start, (start + bs).min(rows))?;
        let (out, seen) = mlx_nn::tap::record_inputs(|| model.model.forward(&batch, &mut []));
        drop(out?);
        for (id, x) in seen {
            let Some(&i) = index.get(&id) else { continue };
            let mut xf = x.flatten(0, -2)?;
            if opts.hessian_float32 {
                xf = xf.astype(Dtype::Float32)?;
            }
            let prod = xf.transpose(None)?.matmul(&xf)?;
            let t = &mut targets[i];
            t.hessian = Some(match t.hessian.take() {
                Some(h) => h.add(&prod)?,
                None => Array::scalar(0f32)?.add(&prod)?,
            });
        }
        let hs: Vec<&Array> = targets.iter().filter_map(|t| t.hessian.as_ref()).collect();
        transforms::eval(&hs)?;
        progress("Computing Hessians", b + 1, batches);
    }
    Ok(())
}

/// mlx-lm's `compute_inverse_hessian`, on the CPU: `H`'s diagonal plus 1% of its mean,
/// then the upper Cholesky factor of its inverse.
fn inverse_hessian(h: &Array) -> Result<Array> {
    let cpu = Device::cpu().default_stream()?;
    with_stream(cpu, || -> Result<Array> {
        let n = h.dim(0)?;
        let damp = h.diagonal(0, 0, 1)?.mean(None, false)?.multiply(1e-2)?;
        // H[diag, diag] += damp: the diagonal's sums, the rest as it was.
        let eye = ops::eye(n, None, 0, Dtype::Bool)?;
        let h = ops::where_(&eye, &h.add(&damp)?, h)?;
        let l = linalg::cholesky(&h, false)?;
        let inv = linalg::cholesky_inv(&l, false)?;
        let hinv = linalg::cholesky(&inv, true)?;
        transforms::eval(&[&hinv])?;
        Ok(hinv)
    })
}

/// Columns `start..stop` of the last axis of `w`.
fn columns(w: &Array, start: i32, stop: i32) -> Result<Array> {
    Ok(w.slice_axis(w.ndim() as i32 - 1, start, stop)?)
}

/// `w` with columns `start..start + update's width` of its last axis replaced.
fn set_columns(w: &Array, update: &Array, start: i32) -> Result<Array> {
    let shape = w.shape();
    let last = shape.len() - 1;
    let mut begin = vec![0; shape.len()];
    begin[last] = start;
    let mut end = shape.clone();
    end[last] = start + update.shape()[last];
    Ok(w.slice_update(update, &begin, &end, None)?)
}

/// `(w - q) / d` with `q` the affine quantization of `w` by `scales` / `biases`
/// (mlx-lm's compiled `gptq_error`, the same operations).
fn gptq_error(w: &Array, d: &Array, scales: &Array, biases: &Array, bits: i32) -> Result<Array> {
    let q = levels(w, scales, biases, bits)?;
    let q = scales.multiply(&q)?.add(biases)?;
    Ok(w.subtract(&q)?.divide(d)?)
}

/// `clip(round((w - biases) / scales), 0, 2^bits - 1)`: the quantization levels of `w`
/// (scales and biases broadcast against it), in `w`'s dtype.
fn levels(w: &Array, scales: &Array, biases: &Array, bits: i32) -> Result<Array> {
    let n_bins = ((1i64 << bits) - 1) as f64;
    let (lo, hi) = (
        Array::scalar_f64(0.0, w.dtype())?,
        Array::scalar_f64(n_bins, w.dtype())?,
    );
    Ok(w.subtract(biases)?
        .divide(scales)?
        .round(0)?
        .clip(Some(&lo), Some(&hi))?)
}

/// GPTQ's column loop over a dense weight (`[out, in]` or `[experts, out, in]`): the
/// packed weight and the float32 scales and biases.
fn quantize_columns(
    weight: &Array,
    hinv: &Array,
    spec: QuantSpec,
) -> Result<(Array, Array, Array)> {
    let (gs, bits) = (spec.group_size, spec.bits);
    let mut w = weight.astype(Dtype::Float32)?;
    let in_dims = w.shape().last().copied().unwrap_or(0);
    let mut all_scales = Vec::new();
    let mut all_biases = Vec::new();
    let mut i = 0;
    while i < in_dims {
        let j = i + gs;
        // The group's columns change only among themselves until the group is done, so
        // they are updated as a block of their own and written back once: the same
        // values as mlx-lm's updates of W in place, without a copy of W each column.
        let mut wl = columns(&w, i, j)?;
        let mut err = ops::zeros_like(&wl)?;
        let q = quantize(&wl, Some(gs), Some(bits), QuantMode::Affine)?;
        let scales = q.scales;
        let biases = q.biases.ok_or_else(|| {
            QuantError::Unsupported("affine quantization returned no biases".into())
        })?;
        for k in i..j {
            let c = k - i;
            let wk = columns(&wl, c, c + 1)?;
            let d = hinv.slice(&[k, k], &[k + 1, k + 1], None)?.reshape(&[])?;
            let e = gptq_error(&wk, &d, &scales, &biases, bits)?;
            let row = hinv.slice(&[k, k], &[k + 1, j], None)?;
            let update = columns(&wl, c, gs)?.subtract(&e.matmul(&row)?)?;
            wl = set_columns(&wl, &update, c)?;
            err = set_columns(&err, &e, c)?;
            transforms::eval(&[&err, &wl])?;
        }
        w = set_columns(&w, &wl, i)?;
        if j < in_dims {
            let block = hinv.slice(&[i, j], &[j, in_dims], None)?;
            let update = columns(&w, j, in_dims)?.subtract(&err.matmul(&block)?)?;
            w = set_columns(&w, &update, j)?;
        }
        transforms::eval(&[&w])?;
        all_scales.push(scales);
        all_biases.push(biases);
        i = j;
    }
    let scales = ops::concatenate(&all_scales.iter().collect::<Vec<_>>(), -1)?;
    let biases = ops::concatenate(&all_biases.iter().collect::<Vec<_>>(), -1)?;
    let packed = pack(&w, bits, &scales, &biases)?;
    Ok((packed, scales, biases))
}

/// mlx-lm's GPTQ `quantize`: each group's `clip(round((w - b) / s), 0, 2^bits - 1)` as
/// uint32, `32 / bits` of them a word, the first in the low bits.
fn pack(w: &Array, bits: i32, scales: &Array, biases: &Array) -> Result<Array> {
    let per_word = 32 / bits;
    let groups = scales.shape().last().copied().unwrap_or(0);
    let w = w.unflatten(-1, &[groups, -1])?;
    let q = levels(
        &w,
        &scales.expand_dims(&[-1])?,
        &biases.expand_dims(&[-1])?,
        bits,
    )?
    .astype(Dtype::Uint32)?;
    let shifts: Vec<u32> = (0..per_word).map(|i| 1u32 << (i * bits)).collect();
    let shifts = Array::from_slice(&shifts, &[per_word])?;
    let q = q.unflatten(-1, &[-1, per_word])?;
    let words = q.multiply(&shifts)?.sum(Some(&[-1]), false)?;
    Ok(words.flatten(-2, -1)?)
}

fn cast_param(p: Option<&Param>, dtype: Dtype) -> Result<Option<Param>> {
    p.map(|b| -> Result<Param> {
        let v = b.value();
        Ok(if v.dtype().is_floating() && v.dtype() != dtype {
            Param::new(v.astype(dtype)?)
        } else {
            b.clone()
        })
    })
    .transpose()
}

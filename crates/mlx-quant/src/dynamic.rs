//! `mlx_lm.dynamic_quant`: allocate bits per layer from its sensitivity.
//!
//! A layer's sensitivity is how much the KL divergence between the model and a copy whose
//! quantizable weights are quantized at the low setting would change if that layer moved
//! to the high setting, estimated to first order: the gradient of the KL divergence with
//! respect to the low-quantized weight, dotted with `low_q - high_q`, per million weights.
//! A binary search then finds the sensitivity threshold above which layers get the high
//! setting so that the model's bits per weight meet the target.
//!
//! mlx-lm's calibration text is a file it downloads; this crate takes token ids, and the
//! `mlx-dynamic-quant` binary encodes a built-in text ([`CALIBRATION_TEXT`]) or a `--data`
//! file, so the sensitivities (and thus the allocation) differ from mlx-lm's.
use crate::error::{QuantError, Result};
use crate::model::{layer_specs, total_parameters, LoadedModel};
use crate::predicate::LayerChoice;
use mlx_array::quant::{dequantize, quantize, QuantMode};
use mlx_array::{Array, Dtype};
use mlx_models::LanguageModel;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// A small built-in calibration text (prose, dialogue, code, lists and numbers), used when
/// no `--data` file is given.
pub const CALIBRATION_TEXT: &str = include_str!("calibration.txt");

/// The low and high quantization settings (`--low-bits`, `--low-group-size`,
/// `--high-bits`, `--high-group-size`; mlx-lm's defaults 4/64 and 5/64).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BitChoices {
    /// Bits of the default (low) setting.
    pub low_bits: i32,
    /// Group size of the low setting.
    pub low_group_size: i32,
    /// Bits of the sensitive layers.
    pub high_bits: i32,
    /// Group size of the sensitive layers.
    pub high_group_size: i32,
}

impl Default for BitChoices {
    fn default() -> Self {
        BitChoices {
            low_bits: 4,
            low_group_size: 64,
            high_bits: 5,
            high_group_size: 64,
        }
    }
}

/// mlx-lm's `load_data`: the tokens cut into rows of `sequence_length` (the remainder
/// dropped), rows shuffled with `mx.random.permutation` after `mx.random.seed(seed)` and
/// `init_draws` keys taken from the global sequence: the keys mlx-lm's `load` draws for
/// the model's initial weights between its seed and `load_data` (`mlx_lm.gptq` and
/// `mlx_lm.awq` seed before loading: [`mlx_models::model::mlx_lm_init_key_draws`] of
/// the model; `mlx_lm.dynamic_quant` seeds after: 0).
pub fn calibration_data(
    tokens: &[u32],
    sequence_length: usize,
    seed: u64,
    init_draws: usize,
) -> Result<Array> {
    if sequence_length < 2 {
        return Err(QuantError::Options(
            "the sequence length must be at least 2".into(),
        ));
    }
    let rows = tokens.len() / sequence_length;
    if rows == 0 {
        return Err(QuantError::Options(format!(
            "the calibration text has {} tokens, fewer than one sequence of {sequence_length}: \
             give a longer --data file or a shorter --sequence-length",
            tokens.len()
        )));
    }
    let ids: Vec<i32> = tokens[..rows * sequence_length]
        .iter()
        .map(|&t| t as i32)
        .collect();
    let data = Array::from_slice(&ids, &[rows as i32, sequence_length as i32])?;
    mlx_array::random::seed(seed)?;
    for _ in 0..init_draws {
        mlx_array::random::next_key()?;
    }
    let order = mlx_array::random::permutation_n(rows as i32, None)?;
    Ok(data.take(&order, Some(0))?)
}

/// `mx.dequantize(*mx.quantize(w, group_size, bits))` (affine): the weight as its
/// quantization reads it back.
pub(crate) fn qdq(w: &Array, bits: i32, group_size: i32) -> Result<Array> {
    let q = quantize(w, Some(group_size), Some(bits), QuantMode::Affine)?;
    Ok(dequantize(
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        Some(group_size),
        Some(bits),
        QuantMode::Affine,
        None,
    )?)
}

/// `x - logsumexp(x, -1)`.
fn log_softmax(x: &Array) -> Result<Array> {
    Ok(x.subtract(&x.logsumexp(Some(&[-1]), true)?)?)
}

/// mlx-lm's `kl_div_loss(logits_q, logits_p).mean()` (the CPU formula).
fn kl_loss(logits_q: &Array, logits_p: &Array) -> Result<Array> {
    let (q, p) = (log_softmax(logits_q)?, log_softmax(logits_p)?);
    let kl = p
        .exp()?
        .multiply(&p.subtract(&q)?)?
        .sum(Some(&[-1]), false)?;
    Ok(kl.mean(None, false)?)
}

/// Rows `start..start + n` of `data`.
fn rows(data: &Array, start: i32, n: i32) -> Result<Array> {
    let total = data.dim(0)?;
    Ok(data.slice_axis(0, start, (start + n).min(total))?)
}

/// The dense quantizable layers (path, dense weight) the sensitivities are measured on.
fn dense_layers(model: &mut LoadedModel) -> Result<Vec<(String, Array)>> {
    let specs = layer_specs(model.module_mut()?)?;
    let params: BTreeMap<String, Array> = model.module()?.parameters().into_iter().collect();
    let layers: Vec<(String, Array)> = specs
        .into_iter()
        .filter(|(_, s)| s.is_none())
        .filter_map(|(p, _)| params.get(&format!("{p}.weight")).map(|w| (p, w.clone())))
        .collect();
    if layers.is_empty() {
        return Err(QuantError::Unsupported(
            "the model has no dense layer to quantize (is it already quantized? convert it \
             with -d first)"
                .into(),
        ));
    }
    Ok(layers)
}

/// mlx-lm's `estimate_sensitivities`: `(layer path, sensitivity)` for every dense
/// quantizable layer. `data` is `[rows, length]` token ids, taken `batch_size` rows at a
/// time; gradients are accumulated in `accumulation_dtype`.
pub fn estimate_sensitivities(
    model: &mut LoadedModel,
    data: &Array,
    bits: BitChoices,
    batch_size: usize,
    accumulation_dtype: Dtype,
    mut on_batch: impl FnMut(usize, usize),
) -> Result<Vec<(String, f64)>> {
    let layers = dense_layers(model)?;
    let names: Vec<String> = layers.iter().map(|(p, _)| format!("{p}.weight")).collect();
    let low: Vec<Array> = layers
        .iter()
        .map(|(_, w)| qdq(w, bits.low_bits, bits.low_group_size))
        .collect::<Result<_>>()?;
    mlx_array::eval(&low.iter().collect::<Vec<_>>())?;
    let mut accum: Vec<Array> = layers
        .iter()
        .map(|(_, w)| mlx_array::ops::zeros(&w.shape(), accumulation_dtype))
        .collect::<mlx_array::Result<_>>()?;
    let n_rows = data.dim(0)?;
    let bs = batch_size.max(1) as i32;
    let n_batches = (n_rows + bs - 1) / bs;
    let originals: BTreeMap<String, Array> = names
        .iter()
        .cloned()
        .zip(layers.iter().map(|(_, w)| w.clone()))
        .collect();
    let cell = RefCell::new(&mut model.model);
    for (i, start) in (0..n_rows).step_by(bs as usize).enumerate() {
        let batch = rows(data, start, bs)?;
        let targets = {
            let mut m = cell.borrow_mut();
            set_weights(&mut m, originals.clone())?;
            let t = m.forward(&batch, &mut [])?;
            t.eval()?;
            t
        };
        let loss = |w: &[Array]| -> mlx_array::Result<Vec<Array>> {
            let mut m = cell.borrow_mut();
            let map: BTreeMap<String, Array> =
                names.iter().cloned().zip(w.iter().cloned()).collect();
            set_weights(&mut m, map)
                .map_err(|e| mlx_array::Error::InvalidArgument(e.to_string()))?;
            let logits = m.forward(&batch, &mut [])?;
            let l = kl_loss(&logits, &targets)
                .map_err(|e| mlx_array::Error::InvalidArgument(e.to_string()))?;
            Ok(vec![l])
        };
        let inputs: Vec<&Array> = low.iter().collect();
        let argnums: Vec<i32> = (0..inputs.len() as i32).collect();
        let (_, grads) = mlx_array::transforms::value_and_grad(loss, &inputs, &argnums)?;
        accum = accum
            .iter()
            .zip(&grads)
            .map(|(a, g)| a.add(g))
            .collect::<mlx_array::Result<_>>()?;
        drop(grads);
        mlx_array::eval(&accum.iter().collect::<Vec<_>>())?;
        on_batch(i + 1, n_batches as usize);
    }
    set_weights(&mut cell.borrow_mut(), originals)?;
    let mut out = Vec::with_capacity(layers.len());
    for (((path, w), lq), g) in layers.iter().zip(&low).zip(&accum) {
        let g = g.divide(n_batches as f64)?;
        let hq = qdq(w, bits.high_bits, bits.high_group_size)?;
        let align = g.multiply(&lq.subtract(&hq)?)?.sum(None, false)?;
        let s = align.divide(w.size() as f64 / 1e6)?;
        let v = s.astype(Dtype::Float32)?.item::<f32>()?;
        out.push((path.clone(), v as f64));
    }
    Ok(out)
}

fn set_weights(model: &mut Box<dyn LanguageModel>, w: BTreeMap<String, Array>) -> Result<()> {
    let ty = model.model_type().to_string();
    let module = model.as_module_mut().ok_or_else(|| {
        QuantError::Unsupported(format!("model type `{ty}` does not expose its parameters"))
    })?;
    module.update(w)?;
    Ok(())
}

/// Bits per weight of `model` if every dense quantizable layer were quantized as
/// `choose(path)` says (`Some((bits, group_size))`, `None`: dense), counted like
/// mlx-lm's `compute_bits_per_weight` on the quantized copy (affine: packed weights plus
/// scales and biases in the weight's dtype). Layers the group size does not divide stay
/// dense.
pub fn planned_bits_per_weight(
    model: &mut LoadedModel,
    choose: &dyn Fn(&str) -> Option<(i32, i32)>,
) -> Result<f64> {
    let specs = layer_specs(model.module_mut()?)?;
    let params = model.module()?.parameters();
    let dense: BTreeMap<&str, ()> = specs
        .iter()
        .filter(|(_, s)| s.is_none())
        .map(|(p, _)| (p.as_str(), ()))
        .collect();
    let mut bytes = 0u64;
    for (name, a) in &params {
        let (layer, leaf) = name.rsplit_once('.').unwrap_or(("", name));
        let n = a.size() as u64;
        let planned = (leaf == "weight" && dense.contains_key(layer))
            .then(|| choose(layer))
            .flatten()
            .filter(|(_, g)| *g > 0 && a.shape().last().is_some_and(|d| d % g == 0));
        bytes += match planned {
            Some((b, g)) => n * b as u64 / 8 + 2 * (n / g as u64) * a.dtype().size() as u64,
            None => a.nbytes() as u64,
        };
    }
    let total = total_parameters(&params, &specs);
    Ok(if total == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / total as f64
    })
}

/// mlx-lm's `estimate_threshold`: the binary search (to a thousandth of the sensitivity
/// range) for the threshold whose allocation meets `target_bpw`.
pub fn estimate_threshold(
    model: &mut LoadedModel,
    sensitivities: &BTreeMap<String, f64>,
    target_bpw: f64,
    bits: BitChoices,
) -> Result<f64> {
    if sensitivities.is_empty() {
        return Err(QuantError::Options("no sensitivities".into()));
    }
    let vals: Vec<f64> = sensitivities.values().copied().collect();
    let mut lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let mut hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tolerance = 1e-3 * (hi - lo);
    while hi - lo > tolerance {
        let mid = (hi + lo) / 2.0;
        let choose = |p: &str| {
            Some(match sensitivities.get(p) {
                Some(s) if *s > mid => (bits.high_bits, bits.high_group_size),
                _ => (bits.low_bits, bits.low_group_size),
            })
        };
        if planned_bits_per_weight(model, &choose)? > target_bpw {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((hi + lo) / 2.0)
}

/// The final predicate: the high setting above the threshold, the default (low) below.
pub fn threshold_predicate(
    sensitivities: BTreeMap<String, f64>,
    threshold: f64,
    bits: BitChoices,
) -> impl FnMut(&str) -> Result<LayerChoice> {
    move |path| {
        Ok(match sensitivities.get(path) {
            Some(s) if *s > threshold => {
                let mut m = serde_json::Map::new();
                m.insert("bits".into(), bits.high_bits.into());
                m.insert("group_size".into(), bits.high_group_size.into());
                LayerChoice::Params(m)
            }
            Some(_) => LayerChoice::Default,
            None => {
                return Err(QuantError::Options(format!(
                    "no sensitivity for layer `{path}` (a sensitivities file for another model?)"
                )))
            }
        })
    }
}

/// mlx-lm's `eval_ppl`: perplexity of next-token prediction over `data`, `batch_size`
/// rows at a time.
pub fn perplexity(model: &dyn LanguageModel, data: &Array, batch_size: usize) -> Result<f64> {
    let (n_rows, len) = (data.dim(0)?, data.dim(1)?);
    let bs = batch_size.max(1) as i32;
    let (mut loss, mut ntoks) = (0f64, 0u64);
    for start in (0..n_rows).step_by(bs as usize) {
        let batch = rows(data, start, bs)?;
        let inputs = batch.slice_axis(1, 0, len - 1)?;
        let targets = batch.slice_axis(1, 1, len)?;
        let logits = model.forward(&inputs, &mut [])?.astype(Dtype::Float32)?;
        let score = logits
            .take_along_axis(&targets.expand_dims(&[-1])?, -1)?
            .squeeze(Some(&[-1]))?;
        let losses = logits.logsumexp(Some(&[-1]), false)?.subtract(&score)?;
        loss += losses.sum(None, false)?.item::<f32>()? as f64;
        ntoks += losses.size() as u64;
    }
    if ntoks == 0 {
        return Err(QuantError::Options(
            "no tokens to measure perplexity on".into(),
        ));
    }
    Ok((loss / ntoks as f64).exp())
}

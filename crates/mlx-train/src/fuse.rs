//! `mlx_lm.fuse`: adapters folded into the base model's weights.
//!
//! For each adapted layer (the `<layer>` of `<layer>.lora_a` / `<layer>.lora_b`), with
//! its weight `W` dequantized first when the layer is quantized (`mx.dequantize`, in the
//! scales' dtype), the ops and their order are mlx-lm's:
//!
//! - linear (`LoRALinear.fuse`; `W` is `[out, in]`, `A` `[in, r]`, `B` `[r, out]`):
//!   `W + ((scale * B.T) @ A.T).astype(W.dtype)`;
//! - embedding (`LoRAEmbedding.fuse`; `W` `[num, dims]`, `A` `[num, r]`, `B` `[r, dims]`):
//!   `W + ((scale * A) @ B).astype(W.dtype)`;
//! - expert stack (`LoRASwitchLinear.fuse`; `W` `[E, out, in]`, `A` `[E, r, in]`, `B`
//!   `[E, out, r]`): `W + ((scale * B) @ A.reshape(E, -1, in)).astype(W.dtype)`;
//! - DoRA (`DoRALinear.fuse`, `DoRAEmbedding.fuse`): the LoRA sum, then each row scaled
//!   by `m / norm(row)` (`mx.linalg.norm(W, axis=1)`, which is `sqrt(sum(square(W)))`).
//!
//! The result is quantized again with the layer's own group size, bits and mode unless
//! the model is being dequantized (then every layer is dequantized first, which gives
//! the same dense weights mlx-lm fuses into). A full fine-tune's weights replace the
//! model's of the same names and shapes.
use crate::adapters::{Adapters, FineTuneType};
use crate::error::{Result, TrainError};
use mlx_array::{quant, Array};
use mlx_nn::{Module, QuantSpec};
use mlx_quant::LoadedModel;
use std::collections::BTreeMap;

/// What [`fuse_adapters`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseReport {
    /// Layers whose weights changed (adapted layers, or fully trained weights).
    pub layers: Vec<String>,
}

/// A quantizable layer of the model: its dense weight shape and quantization.
struct Layer {
    dense: Vec<i32>,
    spec: Option<QuantSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Linear,
    Embedding,
    Switch { experts: i32, input_dims: i32 },
}

fn layers(module: &mut dyn Module) -> Result<BTreeMap<String, Layer>> {
    let mut out = BTreeMap::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        out.insert(
            path.to_string(),
            Layer {
                dense: layer.dense_weight_shape(),
                spec: layer.quant_spec(),
            },
        );
        Ok(())
    })?;
    Ok(out)
}

/// Folds `adapters` into `model` (see the module docs). With `dequantize`, every quantized
/// layer is dequantized first and the `quantization` sections leave the config, as
/// `mlx_lm.fuse --dequantize` does.
pub fn fuse_adapters(
    model: &mut LoadedModel,
    adapters: &Adapters,
    dequantize: bool,
) -> Result<FuseReport> {
    if dequantize {
        mlx_quant::model::dequantize_model(model)?;
    }
    let module = model.module_mut()?;
    match adapters.config.fine_tune_type {
        FineTuneType::Full => fuse_full(module, adapters),
        t => fuse_low_rank(module, adapters, t == FineTuneType::Dora),
    }
}

pub(crate) fn fuse_full(module: &mut dyn Module, adapters: &Adapters) -> Result<FuseReport> {
    let shapes = module.parameter_shapes();
    let dtypes: BTreeMap<String, mlx_array::Dtype> = module
        .parameters()
        .into_iter()
        .map(|(k, a)| (k, a.dtype()))
        .collect();
    let mut errors = Vec::new();
    for (name, w) in &adapters.weights {
        // A float weight may come back in another float dtype (as mlx-lm loads it); a
        // packed (integer) one must stay what the layer unpacks.
        let packed = dtypes.get(name).filter(|d| !d.is_floating());
        match shapes.get(name) {
            None => errors.push(format!("  {name}: not a parameter of the model")),
            Some(_) if packed.is_some_and(|d| *d != w.dtype()) => errors.push(format!(
                "  {name}: {} in the adapters, {} (packed) in the model",
                w.dtype().name(),
                packed.map(|d| d.name()).unwrap_or_default()
            )),
            Some(s) if *s != w.shape() => errors.push(format!(
                "  {name}: shape {:?} in the adapters, {s:?} in the model",
                w.shape()
            )),
            Some(_) => {}
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(errors.join("\n")));
    }
    module.update(adapters.weights.clone())?;
    Ok(FuseReport {
        layers: adapters.weights.keys().cloned().collect(),
    })
}

/// The adapted layers and their `(lora_a, lora_b, m)`.
pub(crate) type Parts<'a> = BTreeMap<String, [Option<&'a Array>; 3]>;

pub(crate) fn group(adapters: &Adapters, dora: bool) -> Result<Parts<'_>> {
    let mut parts: Parts = BTreeMap::new();
    let mut errors = Vec::new();
    for (name, w) in &adapters.weights {
        let (layer, leaf) = name.rsplit_once('.').unwrap_or(("", name.as_str()));
        let slot = match leaf {
            "lora_a" => 0,
            "lora_b" => 1,
            "m" if dora => 2,
            _ => {
                errors.push(format!(
                    "  {name}: not an adapter parameter (lora_a, lora_b{})",
                    if dora { ", m" } else { "" }
                ));
                continue;
            }
        };
        parts.entry(layer.to_string()).or_default()[slot] = Some(w);
    }
    for (layer, p) in &parts {
        let wanted: &[(usize, &str)] = if dora {
            &[(0, "lora_a"), (1, "lora_b"), (2, "m")]
        } else {
            &[(0, "lora_a"), (1, "lora_b")]
        };
        for &(i, leaf) in wanted {
            if p[i].is_none() {
                errors.push(format!("  {layer}.{leaf}: missing"));
            }
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(errors.join("\n")));
    }
    Ok(parts)
}

/// Which layer type fits the pair's shapes (a square weight with both fits is taken for
/// an embedding only when its name says so).
fn kind(path: &str, dense: &[i32], a: &[i32], b: &[i32]) -> Option<Kind> {
    match (dense, a, b) {
        (&[e, out, inp], &[ea, _, ia], &[eb, ob, _])
            if ea == e && eb == e && ia == inp && ob == out =>
        {
            Some(Kind::Switch {
                experts: e,
                input_dims: inp,
            })
        }
        (&[d0, d1], &[a0, ra], &[rb, b1]) if ra == rb => {
            let linear = fits_linear(dense, a, b);
            let embedding = a0 == d0 && b1 == d1;
            let leaf = path.rsplit('.').next().unwrap_or(path);
            let named = leaf.contains("embed") || leaf == "wte" || leaf == "tok_embeddings";
            match (linear, embedding) {
                (true, true) => Some(if named { Kind::Embedding } else { Kind::Linear }),
                (true, false) => Some(Kind::Linear),
                (false, true) => Some(Kind::Embedding),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether `lora_a` / `lora_b` shapes fit a linear layer's `[out, in]` weight:
/// `[in, r]` and `[r, out]`.
pub(crate) fn fits_linear(dense: &[i32], a: &[i32], b: &[i32]) -> bool {
    matches!((dense, a, b), (&[out, inp], &[a0, ra], &[rb, b1]) if a0 == inp && b1 == out && ra == rb)
}

/// Whether DoRA's magnitude fits the weight: one value per row (`[out]` of a linear
/// layer, `[num]` of an embedding).
pub(crate) fn fits_magnitude(dense: &[i32], m: &Array) -> bool {
    dense.len() == 2 && m.shape() == [dense[0]]
}

fn param(params: &BTreeMap<String, Array>, name: &str) -> Result<Array> {
    params
        .get(name)
        .cloned()
        .ok_or_else(|| TrainError::Unsupported(format!("the model has no parameter {name}")))
}

fn fuse_low_rank(module: &mut dyn Module, adapters: &Adapters, dora: bool) -> Result<FuseReport> {
    let scale = adapters.lora_scale()?;
    let parts = group(adapters, dora)?;
    let layers = layers(module)?;
    let params: BTreeMap<String, Array> = module.parameters().into_iter().collect();
    let mut errors = Vec::new();
    let mut plan = Vec::new();
    for (path, p) in &parts {
        let (Some(a), Some(b)) = (p[0], p[1]) else {
            continue;
        };
        let Some(layer) = layers.get(path) else {
            errors.push(format!(
                "  {path}: not a linear, embedding or expert layer of the model"
            ));
            continue;
        };
        match kind(path, &layer.dense, &a.shape(), &b.shape()) {
            Some(Kind::Linear | Kind::Embedding)
                if p[2].is_some_and(|m| !fits_magnitude(&layer.dense, m)) =>
            {
                errors.push(format!(
                    "  {path}: m {:?} does not fit its weight {:?} (one value per row)",
                    p[2].map(|m| m.shape()).unwrap_or_default(),
                    layer.dense
                ))
            }
            Some(k) => plan.push((path, k, a, b, p[2], layer)),
            None => errors.push(format!(
                "  {path}: lora_a {:?} and lora_b {:?} do not fit its weight {:?}",
                a.shape(),
                b.shape(),
                layer.dense
            )),
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(errors.join("\n")));
    }
    let mut updates = BTreeMap::new();
    let mut fused = Vec::new();
    for (path, kind, a, b, m, layer) in plan {
        if dora && matches!(kind, Kind::Switch { .. }) {
            return Err(TrainError::Unsupported(format!(
                "{path}: DoRA adapters on expert layers are not supported (nor by mlx-lm)"
            )));
        }
        if dora && kind == Kind::Embedding && layer.spec.is_some() {
            return Err(TrainError::Unsupported(format!(
                "{path}: DoRA adapters on a quantized embedding are not supported (mlx-lm fuses \
                 them into the packed weight); fuse with --dequantize"
            )));
        }
        let weight = param(&params, &format!("{path}.weight"))?;
        let w = match layer.spec {
            Some(spec) => {
                let biases = params.get(&format!("{path}.biases"));
                quant::dequantize(
                    &weight,
                    &param(&params, &format!("{path}.scales"))?,
                    biases,
                    Some(spec.group_size),
                    Some(spec.bits),
                    spec.mode,
                    None,
                )?
            }
            None => weight,
        };
        let delta = match kind {
            Kind::Linear => b
                .transpose(None)?
                .multiply(scale)?
                .matmul(&a.transpose(None)?)?,
            Kind::Embedding => a.multiply(scale)?.matmul(b)?,
            Kind::Switch {
                experts,
                input_dims,
            } => b
                .multiply(scale)?
                .matmul(&a.reshape(&[experts, -1, input_dims])?)?,
        };
        let mut w = w.add(&delta.astype(w.dtype())?)?;
        if let Some(m) = m {
            let norm = w.square()?.sum(Some(&[1]), false)?.sqrt()?;
            let norm_scale = m.divide(&norm)?;
            w = norm_scale.expand_dims(&[1])?.multiply(&w)?;
        }
        match layer.spec {
            Some(spec) => {
                let q = quant::quantize(&w, Some(spec.group_size), Some(spec.bits), spec.mode)?;
                updates.insert(format!("{path}.weight"), q.weight);
                updates.insert(format!("{path}.scales"), q.scales);
                if let Some(bi) = q.biases {
                    updates.insert(format!("{path}.biases"), bi);
                }
            }
            None => {
                updates.insert(format!("{path}.weight"), w);
            }
        }
        fused.push(path.clone());
    }
    module.update(updates)?;
    tracing::info!(layers = fused.len(), "fused adapters");
    Ok(FuseReport { layers: fused })
}

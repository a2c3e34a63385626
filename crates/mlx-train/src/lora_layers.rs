//! Making a model trainable as `mlx_lm.lora` does: mlx-lm's `linear_to_lora_layers`
//! (LoRA / DoRA adapters on the chosen layers of the last `num_layers` decoder layers,
//! with the same random initial `lora_a`) and the full fine-tune's unfreezing.
//!
//! The random keys are drawn in mlx-lm's order: the decoder layers from first to last,
//! and inside each, the modules in the order of mlx.nn's `named_modules` (a depth-first
//! walk that takes the children last to first, so the adapted layers come in the reverse
//! of their declaration order). Each converted layer takes two keys: the placeholder
//! `nn.Linear` its constructor makes (its weight is dropped), then `lora_a`.
use crate::adapters::FineTuneType;
use crate::error::{Result, TrainError};
use mlx_array::{linalg, ops, random, Array, Dtype};
use mlx_nn::Module;
use std::collections::BTreeSet;

/// A quantizable module: its path, (decoder layer, path inside it), its kind.
type Site = (String, Option<(usize, String)>, Kind);

/// What mlx-lm's `to_lora` makes of a quantizable module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `nn.Linear` / `nn.QuantizedLinear`: LoRA or DoRA.
    Linear,
    /// `SwitchLinear` / `nn.Embedding` (and their quantized forms): LoRA only.
    SwitchOrEmbedding,
    /// Anything else (MLA's `MultiLinear`, ...): not among the layers mlx-lm adapts by
    /// default, and refused when named in `keys` ("Can't convert layer of type ...").
    Other,
}

/// The kind of a quantizable module.
pub(crate) fn kind_of(layer: &mut dyn mlx_nn::Quantizable) -> Kind {
    if layer.as_linear_layer_mut().is_some() {
        Kind::Linear
    } else if layer.as_switch_layer_mut().is_some() || layer.as_embedding_layer_mut().is_some() {
        Kind::SwitchOrEmbedding
    } else {
        Kind::Other
    }
}

/// mlx-lm's `lora_parameters` for training.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    /// `rank`.
    pub rank: i32,
    /// `scale`.
    pub scale: f64,
    /// `dropout` of the adapters' input in training.
    pub dropout: f64,
    /// `keys`: the module paths inside a decoder layer to adapt (all linear, embedding
    /// and expert layers when `None`).
    pub keys: Option<Vec<String>>,
}

/// Splits a module path into (decoder layer index, path inside the layer).
pub(crate) fn split_layer_path(path: &str) -> Option<(usize, String)> {
    let segs: Vec<&str> = path.split('.').collect();
    let at = segs
        .windows(2)
        .position(|w| matches!(w[0], "layers" | "h" | "blocks") && w[1].parse::<usize>().is_ok())?;
    let n = segs[at + 1].parse::<usize>().ok()?;
    Some((n, segs[at + 2..].join(".")))
}

/// The first decoder layer trained for `num_layers` (Python's `layers[-max(n, 0):]`:
/// `-0` is the whole list).
fn first_layer(layers: usize, num_layers: i64) -> usize {
    match num_layers.max(0) as usize {
        0 => 0,
        n => layers.saturating_sub(n),
    }
}

/// The number of decoder layers of `module` (one more than the largest layer index).
pub fn count_layers(module: &mut dyn Module) -> Result<usize> {
    let mut layers = 0;
    module.visit_quantizable_mut("", &mut |path, _| {
        if let Some((n, _)) = split_layer_path(path) {
            layers = layers.max(n + 1);
        }
        Ok(())
    })?;
    Ok(layers)
}

/// Freezes the model and makes the chosen layers trainable, as mlx-lm's `train_model`:
/// `full` unfreezes the last `num_layers` decoder layers; `lora` / `dora` put adapters
/// on them (`spec`), drawing their initial `lora_a` from MLX's global key sequence
/// (seed it first). Returns the adapted (or unfrozen) module paths.
pub fn make_trainable(
    module: &mut dyn Module,
    kind: FineTuneType,
    num_layers: i64,
    spec: Option<&LoraSpec>,
) -> Result<Vec<String>> {
    let layers = count_layers(module)?;
    if num_layers > layers as i64 {
        return Err(TrainError::Invalid(format!(
            "Requested to train {num_layers} layers but the model only has {layers} layers."
        )));
    }
    let first = first_layer(layers, num_layers);
    module.freeze();
    if kind == FineTuneType::Full {
        let n = module.set_frozen_where(false, &|name| {
            split_layer_path(name).is_some_and(|(i, _)| i >= first)
        });
        if n == 0 {
            return Err(TrainError::Invalid(
                "a full fine-tune of these layers trains no parameter".into(),
            ));
        }
        return Ok((first..layers).map(|i| format!("layers.{i}")).collect());
    }
    let spec = spec.ok_or_else(|| {
        TrainError::Invalid("LoRA config is missing required key 'scale'.".into())
    })?;
    if !(0.0..1.0).contains(&spec.dropout) {
        return Err(TrainError::Invalid(format!(
            "The dropout probability {} is not in [0, 1)",
            spec.dropout
        )));
    }
    if spec.rank < 1 {
        return Err(TrainError::Invalid(format!(
            "lora_parameters.rank {} is not a positive integer",
            spec.rank
        )));
    }
    let dora = kind == FineTuneType::Dora;
    // Every quantizable module: (path, layer index and inner path, is a linear layer).
    let mut all: Vec<Site> = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        all.push((path.to_string(), split_layer_path(path), kind_of(layer)));
        Ok(())
    })?;
    let keys: BTreeSet<String> = match &spec.keys {
        Some(k) => k.iter().cloned().collect(),
        None => all
            .iter()
            .filter(|(_, _, kind)| *kind != Kind::Other)
            .filter_map(|(_, l, _)| l.as_ref().map(|(_, k)| k.clone()))
            .collect(),
    };
    // The draw order: layers ascending, modules of a layer last to first.
    let mut targets: Vec<&Site> = Vec::new();
    for i in first..layers {
        let mut in_layer: Vec<_> = all
            .iter()
            .filter(|(_, l, _)| l.as_ref().is_some_and(|(n, k)| *n == i && keys.contains(k)))
            .collect();
        in_layer.reverse();
        targets.extend(in_layer);
    }
    // mlx-lm's second pass: modules of the whole model whose full path is a key (e.g.
    // `lm_head`), in `model.named_modules()` order (last to first).
    let whole: Vec<&Site> = all
        .iter()
        .rev()
        .filter(|(p, _, _)| keys.contains(p))
        .collect();
    if let Some((p, _, _)) = whole.iter().find(|w| targets.iter().any(|t| t.0 == w.0)) {
        return Err(TrainError::Invalid(format!(
            "lora_parameters.keys adapts `{p}` twice (by its path in a layer and by its \
             full path)"
        )));
    }
    targets.extend(whole);
    if let Some((p, _, _)) = targets.iter().find(|(_, _, k)| *k == Kind::Other) {
        return Err(TrainError::Invalid(format!(
            "Can't convert `{p}` to LoRA: it is not a linear, expert (SwitchLinear) or \
             embedding layer (set lora_parameters.keys to other layers)"
        )));
    }
    if let Some((p, _, _)) = targets
        .iter()
        .find(|(_, _, k)| dora && *k == Kind::SwitchOrEmbedding)
    {
        return Err(TrainError::Unsupported(format!(
            "`{p}` is an embedding or expert (SwitchLinear) layer: DoRA on those is not \
             supported by this build (set lora_parameters.keys to other layers)"
        )));
    }
    // Draw the keys in mlx-lm's order, then attach.
    let mut inits: std::collections::HashMap<String, Array> = Default::default();
    // Dense weight shapes: `[out, in]`, or `[experts, out, in]` for a switch layer.
    let mut dims: std::collections::HashMap<String, Vec<i32>> = Default::default();
    let mut embeddings: BTreeSet<String> = BTreeSet::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        dims.insert(path.to_string(), layer.dense_weight_shape());
        if layer.as_embedding_layer_mut().is_some() {
            embeddings.insert(path.to_string());
        }
        Ok(())
    })?;
    for (path, _, _) in &targets {
        let shape = &dims[path.as_str()];
        // An embedding's `lora_a` is `[num_embeddings, rank]`, drawn with bound
        // `1 / sqrt(num_embeddings)` (mlx-lm's `LoRAEmbedding`).
        let input = if embeddings.contains(path.as_str()) {
            shape[0]
        } else {
            shape[shape.len() - 1]
        };
        let _placeholder = random::next_key()?;
        let key = random::next_key()?;
        let s = 1.0 / (input as f64).sqrt();
        let lo = Array::from_slice(&[-s as f32], &[])?;
        let hi = Array::from_slice(&[s as f32], &[])?;
        let a_shape = match shape.len() {
            3 => vec![shape[0], spec.rank, input],
            _ => vec![input, spec.rank],
        };
        let a = random::uniform(&lo, &hi, &a_shape, Dtype::Float32, Some(&key))?;
        inits.insert(path.clone(), a);
    }
    let mut done = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        let Some(a) = inits.remove(path) else {
            return Ok(());
        };
        let shape = dims[path].clone();
        if let Some(switch) = layer.as_switch_layer_mut() {
            let b = ops::zeros(&[shape[0], shape[1], spec.rank], Dtype::Float32)?;
            switch.add_adapter(a, b, spec.scale);
            switch.set_adapter_dropout(spec.dropout);
            done.push(path.to_string());
            return Ok(());
        }
        if let Some(embedding) = layer.as_embedding_layer_mut() {
            let b = ops::zeros(&[spec.rank, shape[1]], Dtype::Float32)?;
            embedding.add_adapter(a, b, spec.scale);
            embedding.set_adapter_dropout(spec.dropout);
            done.push(path.to_string());
            return Ok(());
        }
        let out = shape[0];
        let Some(linear) = layer.as_linear_layer_mut() else {
            return Ok(());
        };
        let b = ops::zeros(&[spec.rank, out], Dtype::Float32)?;
        let m = if dora {
            let (w, _) = linear.dense_weight_and_bias()?;
            Some(linalg::norm(
                &w.astype(Dtype::Float32)?,
                linalg::NormOrd::Default,
                Some(&[1]),
                false,
            )?)
        } else {
            None
        };
        linear.add_adapter(a, b, m, spec.scale);
        linear.set_adapter_dropout(spec.dropout);
        done.push(path.to_string());
        Ok(())
    })?;
    let adapted: BTreeSet<&str> = done.iter().map(String::as_str).collect();
    module.set_frozen_where(false, &|name| {
        name.rsplit_once('.').is_some_and(|(layer, leaf)| {
            matches!(leaf, "lora_a" | "lora_b" | "m") && adapted.contains(layer)
        })
    });
    Ok(done)
}

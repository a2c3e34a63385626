//! Adapters applied at inference, unfused (mlx-lm's `load(..., adapter_path=...)`):
//! each adapted linear layer becomes an [`mlx_nn::lora::LoraLinear`] computing mlx-lm's
//! `LoRALinear` / `DoRALinear`, an adapted embedding an [`mlx_nn::lora::LoraEmbedding`]
//! (`LoRAEmbedding`); a full fine-tune's weights replace the model's.
use crate::adapters::{Adapters, FineTuneType};
use crate::error::{Result, TrainError};
use crate::fuse::{fits_linear, fits_magnitude, fuse_full, group};
use crate::lora_layers::{kind_of, Kind};
use mlx_nn::Module;
use std::collections::BTreeSet;

/// Applies `adapters` to `module` (loaded unfused: fused projection copies would not see
/// the adapters). Returns the adapted layers (or replaced weights). LoRA on an embedding
/// is mlx-lm's `LoRAEmbedding`; adapters on expert stacks and DoRA on embeddings are
/// refused: fuse those with [`crate::fuse_adapters`].
pub fn apply_adapters(module: &mut dyn Module, adapters: &Adapters) -> Result<Vec<String>> {
    let dora = match adapters.config.fine_tune_type {
        FineTuneType::Full => return Ok(fuse_full(module, adapters)?.layers),
        t => t == FineTuneType::Dora,
    };
    let scale = adapters.lora_scale()?;
    let parts = group(adapters, dora)?;
    let mut errors = Vec::new();
    let mut done = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        let Some(p) = parts.get(path) else {
            return Ok(());
        };
        let (Some(a), Some(b)) = (p[0], p[1]) else {
            return Ok(());
        };
        let dense = layer.dense_weight_shape();
        if let Some(embedding) = layer.as_embedding_layer_mut() {
            let (sa, sb) = (a.shape(), b.shape());
            // `lora_a` `[num_embeddings, rank]`, `lora_b` `[rank, dims]`.
            let fits = matches!((&dense[..], &sa[..], &sb[..]),
                (&[num, dims], &[a0, ra], &[rb, b1]) if a0 == num && b1 == dims && ra == rb);
            if p[2].is_some() {
                errors.push(format!(
                    "  {path}: DoRA adapters on an embedding are not applied at inference yet; \
                     fuse them into the model with mlx-fuse"
                ));
            } else if !fits {
                errors.push(format!(
                    "  {path}: lora_a {sa:?}, lora_b {sb:?} do not fit its table {dense:?}"
                ));
            } else {
                embedding.add_adapter(a.clone(), b.clone(), scale);
                done.push(path.to_string());
            }
            return Ok(());
        }
        let Some(linear) = layer.as_linear_layer_mut() else {
            errors.push(format!(
                "  {path}: adapters on expert layers are not applied at inference yet; \
                 fuse them into the model with mlx-fuse"
            ));
            return Ok(());
        };
        let (sa, sb) = (a.shape(), b.shape());
        let m_fits = p[2].is_none_or(|m| fits_magnitude(&dense, m));
        if !fits_linear(&dense, &sa, &sb) || !m_fits {
            errors.push(format!(
                "  {path}: lora_a {sa:?}, lora_b {sb:?}{} do not fit its weight {dense:?}",
                p[2].map(|m| format!(", m {:?}", m.shape()))
                    .unwrap_or_default()
            ));
            return Ok(());
        }
        linear.add_adapter(a.clone(), b.clone(), p[2].cloned(), scale);
        done.push(path.to_string());
        Ok(())
    })?;
    let found: BTreeSet<&str> = done.iter().map(String::as_str).collect();
    for path in parts.keys() {
        if !found.contains(path.as_str())
            && !errors.iter().any(|e| e.starts_with(&format!("  {path}:")))
        {
            errors.push(format!("  {path}: not a linear layer of the model"));
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(errors.join("\n")));
    }
    tracing::info!(layers = done.len(), "adapters applied");
    Ok(done)
}

/// How many random keys mlx-lm's `linear_to_lora_layers` takes from MLX's global key
/// sequence for these adapters: two per layer it converts (the placeholder layer's
/// initial weight and `lora_a`'s), the layers being the linear, embedding and expert
/// layers (with `lora_parameters.keys`: those keys) of the last `num_layers` decoder
/// layers. A full fine-tune takes none. A command that seeds before loading takes as
/// many, so its sampler draws the keys mlx-lm's does.
pub fn lora_init_key_draws(module: &mut dyn Module, adapters: &Adapters) -> Result<usize> {
    let Some(lora) = adapters.config.lora.as_ref() else {
        return Ok(0);
    };
    if adapters.config.fine_tune_type == FineTuneType::Full {
        return Ok(0);
    }
    // (decoder layer index, path inside it) of every quantizable layer.
    let mut inside: Vec<(usize, String)> = Vec::new();
    let mut all: Vec<String> = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        // Only the layers mlx-lm's `to_lora` converts (not MLA's `MultiLinear`, ...).
        if kind_of(layer) == Kind::Other {
            return Ok(());
        }
        all.push(path.to_string());
        let segs: Vec<&str> = path.split('.').collect();
        let at = segs.windows(2).position(|w| {
            matches!(w[0], "layers" | "h" | "blocks") && w[1].parse::<usize>().is_ok()
        });
        if let Some(i) = at {
            if let Ok(n) = segs[i + 1].parse::<usize>() {
                inside.push((n, segs[i + 2..].join(".")));
            }
        }
        Ok(())
    })?;
    let layers = inside.iter().map(|(n, _)| n + 1).max().unwrap_or(0);
    let keys: BTreeSet<String> = match &lora.keys {
        Some(k) => k.iter().cloned().collect(),
        None => inside.iter().map(|(_, k)| k.clone()).collect(),
    };
    let num = adapters.config.num_layers.unwrap_or(0);
    // Python's `layers[-max(num, 0):]`: `-0` is the whole list.
    let first = match num.max(0) as usize {
        0 => 0,
        n => layers.saturating_sub(n),
    };
    // mlx-lm's second pass converts the modules of the whole model whose full path is a
    // key (`lm_head`, `model.embed_tokens`).
    let whole = all.iter().filter(|p| keys.contains(p.as_str())).count();
    Ok(2 * (inside
        .iter()
        .filter(|(n, k)| *n >= first && keys.contains(k))
        .count()
        + whole))
}

/// Keeps LoRA `adapters` resident on `module` under `id` (not 0), next to the others
/// already there, without touching the base weights: each adapted linear layer (dense
/// or quantized) becomes an [`mlx_nn::lora::ResidentLoraLinear`] that adds adapter
/// `id`'s update to the batch rows that select it (`mlx_nn::lora::with_row_adapters`).
/// A row alone with the adapter gets mlx-lm's `LoRALinear` values.
///
/// Only LoRA on linear layers can share a base: DoRA rescales the weight itself, a full
/// fine-tune replaces it, and adapters on embeddings or expert stacks are not kept
/// resident; those are refused ([`TrainError::Unsupported`]) and load as a model of
/// their own ([`apply_adapters`]). Nothing is changed unless every adapted layer fits
/// ([`TrainError::Mismatch`] names each that does not). Returns the adapted layers.
pub fn apply_resident_adapters(
    module: &mut dyn Module,
    adapters: &Adapters,
    id: u32,
) -> Result<Vec<String>> {
    if adapters.config.fine_tune_type != FineTuneType::Lora {
        return Err(TrainError::Unsupported(format!(
            "{}: {} adapters cannot share the base model with others (only LoRA can); \
             they load as a model of their own",
            adapters.dir.display(),
            adapters.config.fine_tune_type.name()
        )));
    }
    let scale = adapters.lora_scale()?;
    let parts = group(adapters, false)?;
    // First pass: every adapted layer is a linear layer the pair fits.
    let mut errors = Vec::new();
    let mut unsupported = Vec::new();
    let mut found = BTreeSet::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        let Some(p) = parts.get(path) else {
            return Ok(());
        };
        let (Some(a), Some(b)) = (p[0], p[1]) else {
            return Ok(());
        };
        found.insert(path.to_string());
        let dense = layer.dense_weight_shape();
        match layer.as_linear_layer_mut() {
            Some(mlx_nn::LinearLayer::Lora(_)) => unsupported.push(format!(
                "  {path}: the model was loaded with adapters of its own"
            )),
            Some(_) if fits_linear(&dense, &a.shape(), &b.shape()) => {}
            Some(_) => errors.push(format!(
                "  {path}: lora_a {:?}, lora_b {:?} do not fit its weight {dense:?}",
                a.shape(),
                b.shape()
            )),
            None => unsupported.push(format!(
                "  {path}: adapters on embeddings or expert layers are not kept resident"
            )),
        }
        Ok(())
    })?;
    for path in parts.keys() {
        if !found.contains(path) {
            errors.push(format!("  {path}: not a linear layer of the model"));
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(errors.join("\n")));
    }
    if !unsupported.is_empty() {
        return Err(TrainError::Unsupported(format!(
            "{}: these adapters cannot share the base model; they load as a model of \
             their own:\n{}",
            adapters.dir.display(),
            unsupported.join("\n")
        )));
    }
    let mut done = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        let Some([Some(a), Some(b), _]) = parts.get(path) else {
            return Ok(());
        };
        if let Some(linear) = layer.as_linear_layer_mut() {
            linear.add_resident_adapter(id, (*a).clone(), (*b).clone(), scale)?;
            done.push(path.to_string());
        }
        Ok(())
    })?;
    tracing::info!(id, layers = done.len(), "resident adapters added");
    Ok(done)
}

/// Drops the resident adapters `id` from every layer of `module` (see
/// [`apply_resident_adapters`]); the layers they leave run as before. Returns how many
/// layers held them.
pub fn remove_resident_adapters(module: &mut dyn Module, id: u32) -> Result<usize> {
    let mut n = 0;
    module.visit_quantizable_mut("", &mut |_, layer| {
        if let Some(linear) = layer.as_linear_layer_mut() {
            if linear.remove_resident_adapter(id)? {
                n += 1;
            }
        }
        Ok(())
    })?;
    Ok(n)
}

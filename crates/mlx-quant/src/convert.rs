//! `mlx_lm.convert`: a Hugging Face checkpoint (local, or in the HF cache) or a GGUF file
//! in, an MLX model directory out, optionally cast, quantized (uniformly or with a mixed
//! recipe) or dequantized.
//!
//! The output is written into a hidden staging directory beside `mlx_path` and renamed
//! into place at the end, so a failed conversion leaves nothing that loads.
use crate::error::{io_err, QuantError, Result};
use crate::model::{
    cast_model, conversion_dtype, dequantize_model, layer_specs, load, quantize_model,
    total_parameters, LoadedModel, QuantArgs,
};
use crate::predicate::{model_predicate, LayerChoice, MixedPredicate, Recipe};
use crate::save::{
    copy_side_files, save_config, save_weights, write_model_card, SavedWeights, MAX_SHARD_BYTES,
};
use mlx_array::quant::QuantMode;
use mlx_array::Dtype;
use std::path::{Path, PathBuf};

/// The options of `mlx_lm.convert` (same names and defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertOptions {
    /// `--hf-path`: a model directory, a `.gguf` file, or an `org/name` in the HF cache.
    pub hf_path: String,
    /// `--mlx-path` (default `mlx_model`); must not exist.
    pub mlx_path: PathBuf,
    /// `-q`.
    pub quantize: bool,
    /// `--q-group-size` (default: the mode's).
    pub q_group_size: Option<i32>,
    /// `--q-bits` (default: the mode's).
    pub q_bits: Option<i32>,
    /// `--q-mode` (default affine).
    pub q_mode: QuantMode,
    /// `--quant-predicate`.
    pub quant_predicate: Option<Recipe>,
    /// `--dtype` (float16, bfloat16 or float32; default: config's `torch_dtype`).
    pub dtype: Option<Dtype>,
    /// `-d`.
    pub dequantize: bool,
    /// Largest shard in bytes (mlx-lm: 5 GiB).
    pub max_shard_bytes: u64,
    /// Print mlx-lm's `[INFO]` lines and a progress bar over the tensors written.
    pub verbose: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            hf_path: String::new(),
            mlx_path: PathBuf::from("mlx_model"),
            quantize: false,
            q_group_size: None,
            q_bits: None,
            q_mode: QuantMode::Affine,
            quant_predicate: None,
            dtype: None,
            dequantize: false,
            max_shard_bytes: MAX_SHARD_BYTES,
            verbose: false,
        }
    }
}

/// What [`convert`] did.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    /// The written directory (`mlx_path`).
    pub out_dir: PathBuf,
    /// The directory the model was read from (an import directory for GGUF, removed since).
    pub source_dir: PathBuf,
    /// The dtype the floating parameters were cast to, if any.
    pub dtype: Option<Dtype>,
    /// Bits per weight after quantization (`None` without `-q`).
    pub bits_per_weight: Option<f64>,
    /// The shards written.
    pub weights: SavedWeights,
    /// Side files copied from the source (tokenizer, generation config, `*.py`).
    pub copied: Vec<String>,
}

/// A directory removed on drop unless [`Scratch::keep`] was called.
pub(crate) struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    /// A fresh name beside `target`: `.<name>.<tag>-<pid>-<n>` in its parent.
    pub(crate) fn beside(target: &Path, tag: &str) -> Result<Scratch> {
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!(".{name}.{tag}-{}-{nanos}", std::process::id()));
        Ok(Scratch { path, keep: false })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the directory to `dest` (which must not exist) and keeps it.
    pub(crate) fn persist(mut self, dest: &Path) -> Result<()> {
        if dest.exists() {
            return Err(QuantError::OutputExists {
                path: dest.to_path_buf(),
            });
        }
        std::fs::rename(&self.path, dest).map_err(io_err(dest))?;
        self.keep = true;
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep && self.path.exists() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A resolved model source.
pub struct Source {
    /// The model directory to load.
    pub dir: PathBuf,
    /// The Hugging Face repo id when the source came from the HF cache.
    pub hf_repo: Option<String>,
    _import: Option<Scratch>,
}

fn pickle_only(dir: &Path) -> Result<Option<String>> {
    let mut safetensors = false;
    let mut pickles = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io_err(dir))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            safetensors = true;
        } else if [".bin", ".pt", ".pth", ".ckpt"]
            .iter()
            .any(|ext| name.ends_with(ext))
            && name != "training_args.bin"
        {
            pickles.push(name);
        }
    }
    pickles.sort();
    Ok((!safetensors && !pickles.is_empty()).then(|| pickles.join(", ")))
}

/// Resolves `--hf-path`: a `.gguf` file is imported (by mlx-gguf) into a scratch directory
/// beside `out` that lives as long as the returned [`Source`]; a directory is used as is;
/// anything else is looked up in the Hugging Face cache (mlx-hub). Directories holding
/// only PyTorch pickle weights are refused.
pub fn resolve_source(spec: &str, out: &Path) -> Result<Source> {
    let path = Path::new(spec);
    if path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        let scratch = Scratch::beside(out, "gguf-import")?;
        tracing::info!(gguf = %path.display(), "importing GGUF");
        mlx_gguf::import_gguf(path, scratch.path(), &mlx_gguf::ImportOptions::default())?;
        return Ok(Source {
            dir: scratch.path().to_path_buf(),
            hf_repo: None,
            _import: Some(scratch),
        });
    }
    let local = path.exists();
    let dir = mlx_hub::Locations::from_env()?.resolve(Some(spec))?;
    if let Some(files) = pickle_only(&dir)? {
        return Err(QuantError::PickleWeights { dir, files });
    }
    Ok(Source {
        dir,
        hf_repo: (!local).then(|| spec.to_string()),
        _import: None,
    })
}

fn check_options(opts: &ConvertOptions) -> Result<()> {
    if opts.quantize && opts.dequantize {
        return Err(QuantError::Options(
            "choose either quantize or dequantize, not both".into(),
        ));
    }
    if opts.quant_predicate.is_some() && opts.q_mode != QuantMode::Affine {
        return Err(QuantError::Options(
            "quant predicates only support 'affine' quantization".into(),
        ));
    }
    if let Some(d) = opts.dtype {
        if !crate::model::CONVERSION_DTYPES.contains(&d) {
            return Err(QuantError::Options(format!(
                "--dtype {} is not one of float16, bfloat16, float32",
                d.name()
            )));
        }
    }
    for (flag, v) in [
        ("--q-group-size", opts.q_group_size),
        ("--q-bits", opts.q_bits),
    ] {
        if v.is_some_and(|v| v < 0) {
            return Err(QuantError::Options(format!("{flag} must be positive")));
        }
    }
    Ok(())
}

/// A per-layer choice function (layer path -> choice).
pub type BoxedPredicate = Box<dyn FnMut(&str) -> Result<LayerChoice>>;

/// The predicate `mlx_lm.convert` quantizes with: the recipe's, else the model's own,
/// else every layer with the defaults.
pub fn convert_predicate(
    model: &mut LoadedModel,
    recipe: Option<Recipe>,
    group_size: Option<i32>,
) -> Result<BoxedPredicate> {
    let model_type = model.model.model_type().to_string();
    if let Some(recipe) = recipe {
        let num_layers = model.model.num_layers();
        let paths: Vec<String> = layer_specs(model.module_mut()?)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let mixed = MixedPredicate::new(recipe, &paths, num_layers, group_size)?;
        return Ok(Box::new(move |path| mixed.choose(path)));
    }
    Ok(Box::new(move |path| {
        Ok(model_predicate(&model_type, path).unwrap_or(LayerChoice::Default))
    }))
}

/// Saves `model` into `staging` like mlx-lm's `save`: weights (the model is consumed so
/// every converted tensor can be freed once written), config, side files, model card.
pub(crate) fn save_model_dir(
    staging: &Path,
    mut model: LoadedModel,
    source: &Source,
    max_shard_bytes: u64,
    progress: bool,
) -> Result<(SavedWeights, Vec<String>)> {
    let specs = layer_specs(model.module_mut()?)?;
    let params = model.module()?.parameters();
    let total = total_parameters(&params, &specs);
    let config = std::mem::take(&mut model.config);
    drop(model);
    let saved = save_weights(staging, params, total, max_shard_bytes, progress)?;
    save_config(&config, &staging.join("config.json"))?;
    let copied = copy_side_files(&source.dir, staging)?;
    if !copied.iter().any(|f| f.starts_with("tokenizer")) {
        tracing::warn!(
            source = %source.dir.display(),
            "no tokenizer files in the source: the converted model has no tokenizer"
        );
    }
    write_model_card(staging, &source.dir, source.hf_repo.as_deref())?;
    Ok((saved, copied))
}

/// Writes `model` to `out` (which must not exist) through a staging directory renamed
/// into place at the end: weights, config, side files of `source`, model card. Returns
/// the shards written and the side files copied.
pub fn save_converted(
    out: &Path,
    model: LoadedModel,
    source: &Source,
    max_shard_bytes: u64,
    verbose: bool,
) -> Result<(SavedWeights, Vec<String>)> {
    if out.exists() {
        return Err(QuantError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    let staging = Scratch::beside(out, "partial")?;
    let saved = save_model_dir(staging.path(), model, source, max_shard_bytes, verbose)?;
    staging.persist(out)?;
    Ok(saved)
}

/// Writes `model` to `out` like mlx-lm's `save`, which writes into an existing directory:
/// everything is written to a staging directory first; then, if `out` exists, its weight
/// shards and index (which the new ones replace) are removed and the staged files moved
/// in, other files of `out` staying. Returns the shards written and the side files copied.
pub fn save_model_over(
    out: &Path,
    model: LoadedModel,
    source: &Source,
    max_shard_bytes: u64,
    verbose: bool,
) -> Result<(SavedWeights, Vec<String>)> {
    if !out.exists() {
        return save_converted(out, model, source, max_shard_bytes, verbose);
    }
    if !out.is_dir() {
        return Err(QuantError::Options(format!(
            "cannot save to {}: it exists and is not a directory",
            out.display()
        )));
    }
    let staging = Scratch::beside(out, "partial")?;
    let saved = save_model_dir(staging.path(), model, source, max_shard_bytes, verbose)?;
    for e in std::fs::read_dir(out).map_err(io_err(out))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let shard = name.starts_with("model")
            && (name.ends_with(".safetensors") || name == "model.safetensors.index.json");
        if shard {
            tracing::info!(file = %e.path().display(), "replacing the old weights");
            std::fs::remove_file(e.path()).map_err(io_err(e.path()))?;
        }
    }
    for e in std::fs::read_dir(staging.path())
        .map_err(io_err(staging.path()))?
        .flatten()
    {
        let dest = out.join(e.file_name());
        std::fs::rename(e.path(), &dest).map_err(io_err(&dest))?;
    }
    Ok(saved)
}

/// Runs the conversion (see the module docs).
pub fn convert(opts: &ConvertOptions) -> Result<ConvertReport> {
    check_options(opts)?;
    if opts.mlx_path.exists() {
        return Err(QuantError::OutputExists {
            path: opts.mlx_path.clone(),
        });
    }
    let source = resolve_source(&opts.hf_path, &opts.mlx_path)?;
    let info = |msg: String| {
        if opts.verbose {
            // mlx-lm prints these to stdout; a closed stdout must not stop (or panic) a
            // conversion, so write errors are ignored.
            use std::io::Write;
            let _ = writeln!(std::io::stdout().lock(), "[INFO] {msg}");
        }
    };
    info("Loading".into());
    let mut model = load(&source.dir, true)?;
    let mut predicate = if opts.quant_predicate.is_some() {
        Some(convert_predicate(
            &mut model,
            opts.quant_predicate,
            opts.q_group_size,
        )?)
    } else {
        None
    };
    let dtype = conversion_dtype(opts.dtype, &model.config);
    if let Some(d) = dtype {
        info(format!("Using dtype: {}", d.name()));
        cast_model(&mut model, d)?;
    }
    let mut bpw = None;
    if opts.quantize {
        let args = QuantArgs {
            group_size: opts.q_group_size,
            bits: opts.q_bits,
            mode: opts.q_mode,
        };
        let mut pred = match predicate.take() {
            Some(p) => p,
            None => convert_predicate(&mut model, None, opts.q_group_size)?,
        };
        info("Quantizing".into());
        let b = quantize_model(&mut model, args, &mut *pred)?;
        info(format!("Quantized model with {b:.3} bits per weight."));
        bpw = Some(b);
    }
    if opts.dequantize {
        info("Dequantizing".into());
        dequantize_model(&mut model)?;
    }
    let (weights, copied) = save_converted(
        &opts.mlx_path,
        model,
        &source,
        opts.max_shard_bytes,
        opts.verbose,
    )?;
    Ok(ConvertReport {
        out_dir: opts.mlx_path.clone(),
        source_dir: source.dir.clone(),
        dtype,
        bits_per_weight: bpw,
        weights,
        copied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mlxq-scratch-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn staging_directory_is_removed_unless_persisted() {
        let d = tmp("drop");
        let target = d.join("model");
        {
            let s = Scratch::beside(&target, "partial").unwrap();
            std::fs::create_dir_all(s.path()).unwrap();
            std::fs::write(s.path().join("model.safetensors"), b"half").unwrap();
            assert!(s.path().starts_with(&d));
        }
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let s = Scratch::beside(&target, "partial").unwrap();
        std::fs::create_dir_all(s.path()).unwrap();
        s.persist(&target).unwrap();
        assert!(target.is_dir());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn persisting_onto_an_existing_path_fails_and_cleans_up() {
        let d = tmp("exists");
        let target = d.join("model");
        std::fs::create_dir_all(&target).unwrap();
        let s = Scratch::beside(&target, "partial").unwrap();
        std::fs::create_dir_all(s.path()).unwrap();
        let err = s.persist(&target).unwrap_err();
        assert!(matches!(err, QuantError::OutputExists { .. }));
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

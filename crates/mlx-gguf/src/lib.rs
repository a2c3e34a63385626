//! Import llama.cpp GGUF files into MLX model directories, and export MLX Llama models
//! to GGUF ([`export`], `mlx_lm fuse --export-gguf`).
//!
//! [`import_gguf`] reads a `.gguf` and writes a directory in mlx-community's layout that
//! mlx-lm and this workspace's loader both read. Tensors: F32/F16/BF16 stay plain; Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K become MLX affine-quantized weights (group size 32,
//! 4, 5 or 8 bits) holding the same values; Q2_K, Q3_K and Q6_K (16-wide groups) are
//! dequantized to float16. Files of F32/F16/Q4_0/Q4_1/Q8_0 only are read with MLX's own
//! loader (`mlx_array::io::load_gguf`); others with this crate's decoder ([`native`]),
//! because MLX 0.32 dequantizes Q4_K wrongly and cannot read the rest.
//!
//! - `model.safetensors` (or shards) with Hugging Face tensor names, Q/K rows restored to
//!   the Hugging Face order for llama, and `model.safetensors.index.json`;
//! - `config.json` with a `quantization` section (per-module overrides where modules differ);
//! - `tokenizer.json`, `tokenizer_config.json` (with the chat template),
//!   `special_tokens_map.json` and `generation_config.json`.
//!
//! The directory is written under a temporary name and renamed into place, so a reader never
//! sees a half-written model.
#![warn(missing_docs)]

pub mod arch;
pub mod config;
pub mod convert;
mod error;
pub mod export;
pub mod header;
pub mod hf_vocab;
pub mod native;
pub mod tokenizer;
mod write;

pub use convert::{ConvertedTensor, QuantSpec};
pub use error::{GgufError, Result};
pub use header::{GgmlType, GgufHeader, MetaValue, TensorInfo};

use arch::Arch;
use config::{build_config, ConfigInputs, Hparams};
use error::mlx_err;
use mlx_array::Dtype;
use std::path::{Path, PathBuf};

/// Options of [`import_gguf`].
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Cast unquantized float tensors and the quantization scales/biases to this dtype.
    /// Default `None`: keep what MLX loaded (float32 norms and F32 tensors, float16 F16
    /// tensors and scales/biases), so nothing is rounded and the model computes in float32
    /// like llama.cpp. (MLX's CPU kernels are much slower in float16: on CPU keep `None`
    /// or pick float32.)
    pub dtype: Option<Dtype>,
    /// Accept tensor types that MLX can only dequantize to float16 (Q2_K, Q4_K, Q6_K, BF16).
    /// Default true.
    pub allow_dequantize: bool,
    /// Replace `out_dir` if it exists. Default false.
    pub overwrite: bool,
    /// Largest safetensors shard in bytes. Default 5 GiB, like mlx-lm.
    pub max_shard_bytes: u64,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dtype: None,
            allow_dequantize: true,
            overwrite: false,
            max_shard_bytes: 5 << 30,
        }
    }
}

/// What [`import_gguf`] did.
#[derive(Debug, Clone)]
pub struct ImportReport {
    /// The written model directory.
    pub out_dir: PathBuf,
    /// `general.architecture`.
    pub arch: String,
    /// `model_type` written to config.json.
    pub model_type: String,
    /// The default quantization (`None`: no tensor is quantized).
    pub quantization: Option<QuantSpec>,
    /// Every converted tensor.
    pub tensors: Vec<ConvertedTensor>,
    /// GGUF tensors that have no Hugging Face counterpart (e.g. `rope_freqs.weight`).
    pub dropped: Vec<String>,
    /// `tokenizer.ggml.model`.
    pub tokenizer_model: String,
    /// `tokenizer.ggml.pre`.
    pub pre_tokenizer: String,
    /// Files written, relative to `out_dir`.
    pub files: Vec<String>,
}

/// Converts `gguf` into an MLX model directory at `out_dir`.
pub fn import_gguf(gguf: &Path, out_dir: &Path, opts: &ImportOptions) -> Result<ImportReport> {
    if out_dir.exists() && !opts.overwrite {
        return Err(GgufError::OutputExists {
            path: out_dir.to_path_buf(),
        });
    }
    let header = GgufHeader::read(gguf)?;
    let arch = Arch::from_gguf(header.architecture()?)?;
    let hp = Hparams::read(&header, &arch)?;
    convert::check_types(&header, opts.allow_dequantize)?;
    let tok = tokenizer::build(&header, hp.context_length)?;
    tracing::info!(
        path = %gguf.display(),
        arch = arch.gguf_name,
        tensors = header.tensors.len(),
        "importing GGUF"
    );

    // MLX's loader where it reads every tensor exactly, this crate's decoder otherwise.
    let mut arrays = if header
        .tensors
        .iter()
        .all(|t| t.ggml_type.mlx_loads_exactly())
    {
        mlx_array::io::load_gguf(gguf)
            .map_err(mlx_err(format!("loading {}", gguf.display())))?
            .0
    } else {
        tracing::info!("decoding tensors in Rust (types MLX's loader does not read exactly)");
        native::load_tensors(&header)?
    };
    let mut rope = config::rope_scaling(&header, &arch)?;
    if let Some(freqs) = arrays.remove("rope_freqs.weight") {
        let v = freqs
            .astype(Dtype::Float32)
            .and_then(|f| f.to_vec::<f32>())
            .map_err(mlx_err("reading rope_freqs.weight"))?;
        let v: Vec<f64> = v.into_iter().map(f64::from).collect();
        if rope.is_none() {
            rope = Some(config::llama3_scaling_from_factors(
                &v,
                hp.head_dim,
                hp.rope_theta,
            )?);
        }
    }
    let converted = convert::convert(
        &header,
        arrays,
        &arch,
        (hp.num_heads, hp.num_kv_heads),
        opts.dtype,
    )?;
    let quant = convert::quantization_section(&converted.modules);
    let torch_dtype = converted
        .arrays
        .iter()
        .find(|(k, a)| k.ends_with("norm.weight") && a.dtype().is_floating())
        .map(|(_, a)| a.dtype().name().to_string());
    let cfg = build_config(
        &header,
        &ConfigInputs {
            arch: &arch,
            hp: &hp,
            facts: &converted.facts,
            rope_scaling: rope,
            quantization: quant.as_ref().map(|(_, v)| v.clone()),
            torch_dtype,
            bos: tok.bos_token_id,
            eos: tok.eos_token_id,
            pad: tok.pad_token_id,
            tokenizer_vocab: tok.vocab_size,
        },
    )?;
    let files = write::write_model_dir(out_dir, &converted.arrays, &cfg, &tok, opts)?;
    tracing::info!(out = %out_dir.display(), tensors = converted.tensors.len(), "GGUF imported");
    Ok(ImportReport {
        out_dir: out_dir.to_path_buf(),
        arch: arch.gguf_name.to_string(),
        model_type: arch.model_type.to_string(),
        quantization: quant.map(|(q, _)| q),
        tensors: converted.tensors,
        dropped: converted.dropped,
        tokenizer_model: tok.model,
        pre_tokenizer: tok.pre,
        files,
    })
}

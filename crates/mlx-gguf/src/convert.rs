//! Tensor conversion: rename, undo llama.cpp's Q/K row permutation, cast, and record
//! each module's quantization.
use crate::arch::{map_module, split_leaf, Arch, Role};
use crate::config::TensorFacts;
use crate::error::{mlx_err, GgufError, Result};
use crate::header::GgufHeader;
use crate::native::{form, Form};
use mlx_array::{Array, Dtype};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// How one weight module (a Linear or Embedding) is stored in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QuantSpec {
    /// Elements per group.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
}

/// One converted GGUF tensor, for the import report.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertedTensor {
    /// The GGUF name.
    pub gguf_name: String,
    /// The Hugging Face name of its weight or bias.
    pub hf_name: String,
    /// The GGML type it was stored as.
    pub ggml_type: String,
    /// Its quantization in the output (`None`: a plain array).
    pub quantization: Option<QuantSpec>,
    /// It was dequantized to float16 (Q2_K, Q3_K, Q6_K).
    pub dequantized: bool,
}

/// The converted tensors and what they say about the model.
pub struct Converted {
    /// Output arrays by Hugging Face name.
    pub arrays: BTreeMap<String, Array>,
    /// Report rows.
    pub tensors: Vec<ConvertedTensor>,
    /// GGUF tensors dropped (no Hugging Face counterpart), with the reason.
    pub dropped: Vec<String>,
    /// Quantization of each weight module (2-D `weight`s only).
    pub modules: BTreeMap<String, Option<QuantSpec>>,
    /// Facts for config.json.
    pub facts: TensorFacts,
}

/// Checks that every tensor type can be decoded, before any data is read.
pub fn check_types(header: &GgufHeader, allow_dequantize: bool) -> Result<()> {
    for t in &header.tensors {
        match form(t.ggml_type) {
            None => {
                return Err(GgufError::UnsupportedTensorType {
                    tensor: t.name.clone(),
                    type_name: t.ggml_type.name(),
                })
            }
            Some(Form::Dequantized) if !allow_dequantize => {
                return Err(GgufError::DequantizeRefused {
                    tensor: t.name.clone(),
                    type_name: t.ggml_type.name(),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// Inverts llama.cpp's `permute`: rows grouped `(heads, head_dim/2, 2)` go back to
/// `(heads, 2, head_dim/2)`, the Hugging Face half-split RoPE layout. Works on any array
/// whose first axis is the output rows (weights, quantization scales and biases, biases).
pub fn unpermute_rows(a: &Array, heads: u64, name: &str) -> Result<Array> {
    let shape = a.shape();
    let rows = shape.first().copied().unwrap_or(0) as u64;
    if heads == 0 || rows % (2 * heads) != 0 {
        return Err(GgufError::BadTensor {
            tensor: name.into(),
            problem: format!("{rows} rows cannot be split into {heads} heads of an even size"),
        });
    }
    let half = (rows / heads / 2) as i32;
    let mut split = vec![heads as i32, half, 2];
    split.extend_from_slice(&shape[1..]);
    a.reshape(&split)
        .and_then(|x| x.swapaxes(1, 2))
        .and_then(|x| x.reshape(&shape))
        .map_err(mlx_err(format!("un-permuting the rows of `{name}`")))
}

/// Converts every tensor. `arrays` is what `mlx_array::io::load_gguf` returned (consumed);
/// `dtype` casts float arrays (weights, biases and quantization scales/biases).
pub fn convert(
    header: &GgufHeader,
    mut arrays: BTreeMap<String, Array>,
    arch: &Arch,
    heads: (u64, u64),
    dtype: Option<Dtype>,
) -> Result<Converted> {
    let mut out = Converted {
        arrays: BTreeMap::new(),
        tensors: Vec::new(),
        dropped: Vec::new(),
        modules: BTreeMap::new(),
        facts: TensorFacts::default(),
    };
    let mut take = |key: &str, tensor: &str| {
        arrays.remove(key).ok_or_else(|| GgufError::BadTensor {
            tensor: tensor.into(),
            problem: format!("MLX did not return the array `{key}`"),
        })
    };
    for t in &header.tensors {
        let unknown = || GgufError::UnknownTensor {
            tensor: t.name.clone(),
            arch: arch.gguf_name.into(),
        };
        let (module, leaf) = split_leaf(&t.name).ok_or_else(unknown)?;
        let mapped = map_module(module, arch).map_err(|e| match e {
            GgufError::UnknownTensor { .. } => unknown(),
            other => other,
        })?;
        let Some((hf_module, role)) = mapped else {
            out.dropped.push(t.name.clone());
            continue;
        };
        let support = form(t.ggml_type);
        let mut parts: Vec<(String, Array)> = match support {
            Some(Form::Affine { .. }) => {
                if leaf != "weight" {
                    return Err(GgufError::BadTensor {
                        tensor: t.name.clone(),
                        problem: format!("a quantized {leaf} is not supported"),
                    });
                }
                vec![
                    (
                        format!("{hf_module}.weight"),
                        take(&format!("{module}.weight"), &t.name)?,
                    ),
                    (
                        format!("{hf_module}.scales"),
                        take(&format!("{module}.scales"), &t.name)?,
                    ),
                    (
                        format!("{hf_module}.biases"),
                        take(&format!("{module}.biases"), &t.name)?,
                    ),
                ]
            }
            _ => vec![(format!("{hf_module}.{leaf}"), take(&t.name, &t.name)?)],
        };
        if arch.permuted_qk && role != Role::Other {
            let h = if role == Role::Query {
                heads.0
            } else {
                heads.1
            };
            for (_, a) in parts.iter_mut() {
                *a = unpermute_rows(a, h, &t.name)?;
            }
        }
        if let Some(d) = dtype {
            for (name, a) in parts.iter_mut() {
                if a.dtype().is_floating() && a.dtype() != d {
                    *a = a
                        .astype(d)
                        .map_err(mlx_err(format!("casting `{name}` to {d}")))?;
                }
            }
        }
        let quantization = match support {
            Some(Form::Affine { bits, group_size }) => Some(QuantSpec { group_size, bits }),
            _ => None,
        };
        if leaf == "weight" && t.dims.len() == 2 {
            out.modules.insert(hf_module.clone(), quantization);
        }
        match (module.rsplit('.').next().unwrap_or(module), leaf) {
            ("output", _) => out.facts.has_lm_head = true,
            ("token_embd", "weight") => out.facts.embedding_rows = t.dims.get(1).copied(),
            ("attn_q" | "attn_k" | "attn_v" | "attn_output", "bias") => {
                out.facts.attention_bias = true
            }
            ("ffn_gate" | "ffn_up" | "ffn_down", "bias") => out.facts.mlp_bias = true,
            _ => {}
        }
        out.tensors.push(ConvertedTensor {
            gguf_name: t.name.clone(),
            hf_name: format!("{hf_module}.{leaf}"),
            ggml_type: t.ggml_type.name(),
            quantization,
            dequantized: support == Some(Form::Dequantized),
        });
        out.arrays.extend(parts);
    }
    Ok(out)
}

/// The `quantization` section: the most common spec as the default, and per-module
/// entries (`false` for unquantized weights) where a module differs. `None` when nothing
/// is quantized.
pub fn quantization_section(
    modules: &BTreeMap<String, Option<QuantSpec>>,
) -> Option<(QuantSpec, Value)> {
    let mut counts: BTreeMap<QuantSpec, usize> = BTreeMap::new();
    for spec in modules.values().flatten() {
        *counts.entry(*spec).or_default() += 1;
    }
    let default = counts
        .iter()
        .max_by_key(|(spec, n)| (**n, std::cmp::Reverse(**spec)))
        .map(|(s, _)| *s)?;
    let mut q = Map::new();
    q.insert("group_size".into(), json!(default.group_size));
    q.insert("bits".into(), json!(default.bits));
    q.insert("mode".into(), json!("affine"));
    for (module, spec) in modules {
        match spec {
            Some(s) if *s == default => {}
            Some(s) => {
                q.insert(
                    module.clone(),
                    json!({"group_size": s.group_size, "bits": s.bits, "mode": "affine"}),
                );
            }
            None => {
                q.insert(module.clone(), json!(false));
            }
        }
    }
    Some((default, Value::Object(q)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, written independently for the test.
    fn permute(rows: &[f32], heads: usize, cols: usize) -> Vec<f32> {
        let n = rows.len() / cols;
        let d = n / heads;
        let mut out = vec![0.0; rows.len()];
        for h in 0..heads {
            for two in 0..2 {
                for j in 0..d / 2 {
                    let src = h * d + two * (d / 2) + j;
                    let dst = h * d + j * 2 + two;
                    out[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&rows[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        let (heads, d, cols) = (3usize, 8usize, 5usize);
        let hf: Vec<f32> = (0..heads * d * cols).map(|i| i as f32).collect();
        let gguf = permute(&hf, heads, cols);
        assert_ne!(gguf, hf);
        let a = Array::from_slice(&gguf, &[(heads * d) as i32, cols as i32]).unwrap();
        let back = unpermute_rows(&a, heads as u64, "t").unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), hf);
        // 1-D (biases).
        let b =
            Array::from_slice(&permute(&hf[..heads * d], heads, 1), &[(heads * d) as i32]).unwrap();
        assert_eq!(
            unpermute_rows(&b, heads as u64, "b")
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            hf[..heads * d]
        );
    }

    #[test]
    fn unpermute_rejects_rows_not_divisible_by_heads() {
        let a = Array::from_slice(&[0f32; 10], &[10]).unwrap();
        let e = unpermute_rows(&a, 3, "blk.0.attn_q.weight")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blk.0.attn_q.weight") && e.contains("10 rows"),
            "{e}"
        );
    }

    #[test]
    fn quantization_section_marks_differing_modules() {
        let q4 = QuantSpec {
            group_size: 32,
            bits: 4,
        };
        let q8 = QuantSpec {
            group_size: 32,
            bits: 8,
        };
        let mut m = BTreeMap::new();
        m.insert("model.layers.0.self_attn.q_proj".to_string(), Some(q4));
        m.insert("model.layers.0.self_attn.k_proj".to_string(), Some(q4));
        m.insert("model.embed_tokens".to_string(), Some(q8));
        m.insert("lm_head".to_string(), None);
        let (default, v) = quantization_section(&m).unwrap();
        assert_eq!(default, q4);
        assert_eq!(v["bits"], json!(4));
        assert_eq!(v["group_size"], json!(32));
        assert_eq!(
            v["model.embed_tokens"],
            json!({"group_size": 32, "bits": 8, "mode": "affine"})
        );
        assert_eq!(v["lm_head"], json!(false));
        assert!(v.get("model.layers.0.self_attn.q_proj").is_none());
        m.clear();
        m.insert("lm_head".to_string(), None);
        assert!(quantization_section(&m).is_none());
    }
}

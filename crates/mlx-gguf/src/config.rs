//! Building `config.json` from the GGUF metadata.
use crate::arch::Arch;
use crate::error::{GgufError, Result};
use crate::header::GgufHeader;
use serde_json::{json, Map, Value};

/// Model hyper-parameters read from `<arch>.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    /// `embedding_length`.
    pub hidden_size: u64,
    /// `block_count`.
    pub num_layers: u64,
    /// `feed_forward_length`.
    pub intermediate_size: u64,
    /// `attention.head_count`.
    pub num_heads: u64,
    /// `attention.head_count_kv` (defaults to `num_heads`).
    pub num_kv_heads: u64,
    /// `attention.key_length`, else `hidden_size / num_heads`.
    pub head_dim: u64,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: f64,
    /// `rope.freq_base` (or the architecture's default).
    pub rope_theta: f64,
    /// `context_length`.
    pub context_length: Option<u64>,
}

impl Hparams {
    /// Reads the hyper-parameters of `arch`.
    pub fn read(h: &GgufHeader, arch: &Arch) -> Result<Hparams> {
        let k = |s: &str| format!("{}.{s}", arch.gguf_name);
        let hidden_size = h.u64(&k("embedding_length"))?;
        let num_heads = h.u64(&k("attention.head_count"))?;
        if num_heads == 0 {
            return Err(GgufError::BadMetadata {
                key: k("attention.head_count"),
                problem: "is zero".into(),
            });
        }
        let num_kv_heads = h
            .opt_u64(&k("attention.head_count_kv"))?
            .unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(GgufError::BadMetadata {
                key: k("attention.head_count_kv"),
                problem: format!("{num_kv_heads} does not divide the {num_heads} attention heads"),
            });
        }
        let head_dim = match h.opt_u64(&k("attention.key_length"))? {
            Some(d) => d,
            None => hidden_size / num_heads,
        };
        if let Some(rope_dim) = h.opt_u64(&k("rope.dimension_count"))? {
            if rope_dim != head_dim {
                return Err(GgufError::BadMetadata {
                    key: k("rope.dimension_count"),
                    problem: format!("partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported"),
                });
            }
        }
        let eps_key = k("attention.layer_norm_rms_epsilon");
        let rms_norm_eps = h
            .opt_f64(&eps_key)?
            .ok_or(GgufError::MissingMetadata { key: eps_key })?;
        Ok(Hparams {
            hidden_size,
            num_layers: h.u64(&k("block_count"))?,
            intermediate_size: h.u64(&k("feed_forward_length"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps,
            rope_theta: h
                .opt_f64(&k("rope.freq_base"))?
                .unwrap_or(arch.default_rope_theta),
            context_length: h.opt_u64(&k("context_length"))?,
        })
    }
}

/// The `rope_scaling` entry from `<arch>.rope.scaling.*` (or `None` for plain RoPE).
pub fn rope_scaling(h: &GgufHeader, arch: &Arch) -> Result<Option<Value>> {
    let k = |s: &str| format!("{}.{s}", arch.gguf_name);
    let factor = h.opt_f64(&k("rope.scaling.factor"))?;
    let kind = h.opt_str(&k("rope.scaling.type"))?;
    let linear_legacy = h.opt_f64(&k("rope.scale_linear"))?;
    let linear = |f: f64| Ok(Some(json!({"factor": f, "rope_type": "linear"})));
    match kind {
        Some("none") => Ok(None),
        None => match linear_legacy {
            Some(f) if f != 1.0 => linear(f),
            _ => Ok(None),
        },
        Some("linear") => linear(factor.ok_or(GgufError::MissingMetadata {
            key: k("rope.scaling.factor"),
        })?),
        Some("yarn") => {
            let f = factor.ok_or(GgufError::MissingMetadata {
                key: k("rope.scaling.factor"),
            })?;
            let mut m = Map::new();
            m.insert("factor".into(), json!(f));
            m.insert("rope_type".into(), json!("yarn"));
            if let Some(orig) = h.opt_u64(&k("rope.scaling.original_context_length"))? {
                m.insert("original_max_position_embeddings".into(), json!(orig));
            }
            Ok(Some(Value::Object(m)))
        }
        Some(other) => Err(GgufError::BadMetadata {
            key: k("rope.scaling.type"),
            problem: format!(
                "RoPE scaling `{other}` is not supported (supported: none, linear, yarn)"
            ),
        }),
    }
}

/// The llama3 RoPE frequency factors for the given parameters (what llama.cpp stores in
/// `rope_freqs.weight`).
pub fn llama3_rope_factors(
    dims: u64,
    theta: f64,
    factor: f64,
    low: f64,
    high: f64,
    original: f64,
) -> Vec<f64> {
    let low_wavelen = original / low;
    let high_wavelen = original / high;
    (0..dims / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// Recognizes a `rope_freqs` tensor as Llama 3's scaling with the published parameters
/// (low 1, high 4, original context 8192) and returns the `rope_scaling` entry.
pub fn llama3_scaling_from_factors(freqs: &[f64], head_dim: u64, theta: f64) -> Result<Value> {
    let factor = freqs.iter().copied().fold(f64::NAN, f64::max);
    let unsupported = || GgufError::BadTensor {
        tensor: "rope_freqs.weight".into(),
        problem:
            "RoPE frequency factors that are not Llama 3's (factor, low 1, high 4, original 8192) \
                  are not supported"
                .into(),
    };
    if !(factor.is_finite() && factor >= 1.0) || freqs.len() as u64 != head_dim / 2 {
        return Err(unsupported());
    }
    let (low, high, original) = (1.0, 4.0, 8192.0);
    let expected = llama3_rope_factors(head_dim, theta, factor, low, high, original);
    let close = expected
        .iter()
        .zip(freqs)
        .all(|(e, f)| (e - f).abs() <= 1e-4 * e.abs().max(1.0));
    if !close {
        return Err(unsupported());
    }
    Ok(json!({
        "factor": factor,
        "high_freq_factor": high,
        "low_freq_factor": low,
        "original_max_position_embeddings": original as u64,
        "rope_type": "llama3",
    }))
}

/// What the tensors say about the model, for config.json.
#[derive(Debug, Clone, Default)]
pub struct TensorFacts {
    /// An `output` (lm_head) tensor exists.
    pub has_lm_head: bool,
    /// Attention projections carry biases.
    pub attention_bias: bool,
    /// MLP projections carry biases.
    pub mlp_bias: bool,
    /// Rows of the embedding matrix.
    pub embedding_rows: Option<u64>,
}

/// Inputs of [`build_config`] besides the metadata.
pub struct ConfigInputs<'a> {
    /// The architecture.
    pub arch: &'a Arch,
    /// The hyper-parameters.
    pub hp: &'a Hparams,
    /// Facts from the tensors.
    pub facts: &'a TensorFacts,
    /// `rope_scaling`, if any.
    pub rope_scaling: Option<Value>,
    /// The quantization section, if any tensor is quantized.
    pub quantization: Option<Value>,
    /// `torch_dtype` (the dtype of the unquantized float weights).
    pub torch_dtype: Option<String>,
    /// BOS/EOS/PAD ids.
    pub bos: Option<u64>,
    /// EOS id.
    pub eos: Option<u64>,
    /// PAD id.
    pub pad: Option<u64>,
    /// Vocabulary size of the tokenizer.
    pub tokenizer_vocab: usize,
}

/// Builds config.json (keys sorted, as mlx-lm's `save_config` writes them).
pub fn build_config(h: &GgufHeader, i: &ConfigInputs<'_>) -> Result<Value> {
    let hp = i.hp;
    let vocab_key = format!("{}.vocab_size", i.arch.gguf_name);
    let vocab_size = match h.opt_u64(&vocab_key)? {
        Some(v) => v,
        None => i.facts.embedding_rows.unwrap_or(i.tokenizer_vocab as u64),
    };
    let mut c = Map::new();
    c.insert("architectures".into(), json!([i.arch.hf_class]));
    c.insert("attention_bias".into(), json!(i.facts.attention_bias));
    if let Some(b) = i.bos {
        c.insert("bos_token_id".into(), json!(b));
    }
    if let Some(e) = i.eos {
        c.insert("eos_token_id".into(), json!(e));
    }
    if i.arch.needs_head_dim || hp.head_dim * hp.num_heads != hp.hidden_size {
        c.insert("head_dim".into(), json!(hp.head_dim));
    }
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("hidden_size".into(), json!(hp.hidden_size));
    c.insert("intermediate_size".into(), json!(hp.intermediate_size));
    if let Some(n) = hp.context_length {
        c.insert("max_position_embeddings".into(), json!(n));
    }
    c.insert("mlp_bias".into(), json!(i.facts.mlp_bias));
    c.insert("model_type".into(), json!(i.arch.model_type));
    c.insert("num_attention_heads".into(), json!(hp.num_heads));
    c.insert("num_hidden_layers".into(), json!(hp.num_layers));
    c.insert("num_key_value_heads".into(), json!(hp.num_kv_heads));
    if let Some(p) = i.pad {
        c.insert("pad_token_id".into(), json!(p));
    }
    if let Some(q) = &i.quantization {
        c.insert("quantization".into(), q.clone());
        c.insert("quantization_config".into(), q.clone());
    }
    c.insert("rms_norm_eps".into(), json!(hp.rms_norm_eps));
    c.insert(
        "rope_scaling".into(),
        i.rope_scaling.clone().unwrap_or(Value::Null),
    );
    c.insert("rope_theta".into(), json!(hp.rope_theta));
    c.insert("tie_word_embeddings".into(), json!(!i.facts.has_lm_head));
    if let Some(d) = &i.torch_dtype {
        c.insert("torch_dtype".into(), json!(d));
    }
    c.insert("vocab_size".into(), json!(vocab_size));
    Ok(Value::Object(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_factors_are_recognized_and_others_refused() {
        // Llama 3.1 8B: head_dim 128, theta 500000, factor 8.
        let f = llama3_rope_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(f[0], 1.0);
        assert_eq!(*f.last().unwrap(), 8.0);
        let v = llama3_scaling_from_factors(&f, 128, 500000.0).unwrap();
        assert_eq!(v["factor"], json!(8.0));
        assert_eq!(v["rope_type"], json!("llama3"));
        let mut g = f.clone();
        g[40] *= 1.5;
        assert!(llama3_scaling_from_factors(&g, 128, 500000.0).is_err());
    }
}

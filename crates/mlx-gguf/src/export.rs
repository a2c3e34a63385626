//! GGUF export: an MLX Llama / Mistral / Mixtral model to one `.gguf` file, as
//! `mlx_lm.gguf.convert_to_gguf` writes it (`mlx_lm fuse --export-gguf`).
//!
//! The tensors are the model's parameters under llama.cpp names, Q and K rows permuted to
//! llama.cpp's rotary layout, bfloat16 cast to float16 and norms to float32 (everything
//! else keeps its dtype); the metadata is llama.cpp's `llama.*` hyperparameters and the
//! vocabulary of the directory's `tokenizer.json` ([`HfVocab`]). Both go to MLX's
//! `save_gguf` in mlx-lm's dict order, so the file is byte for byte mlx-lm's.
use crate::error::{mlx_err, GgufError, Result};
use crate::hf_vocab::HfVocab;
use mlx_array::io::GgufValue;
use mlx_array::{Array, Dtype};
use serde_json::{Map, Value};
use std::path::Path;

/// The `model_type`s `mlx_lm fuse --export-gguf` exports.
pub const EXPORT_MODEL_TYPES: [&str; 3] = ["llama", "mixtral", "mistral"];

fn err(msg: impl Into<String>) -> GgufError {
    GgufError::Export(msg.into())
}

/// What `mlx_lm fuse` checks before it converts: the model type is one
/// [`EXPORT_MODEL_TYPES`] names, and the model is not quantized.
pub fn check_exportable(config: &Map<String, Value>) -> Result<()> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !EXPORT_MODEL_TYPES.contains(&model_type) {
        return Err(err(format!(
            "Model type {model_type} not supported for GGUF conversion (supported: {})",
            EXPORT_MODEL_TYPES.join(", ")
        )));
    }
    if config.get("quantization").is_some_and(truthy) {
        return Err(err(
            "Conversion of quantized models is not yet supported (fuse with --dequantize)",
        ));
    }
    Ok(())
}

/// Python truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// llama.cpp's rotary row order: rows `(heads, 2, half, ...)` become `(heads, half, 2, ...)`
/// (`permute_weights`; `n_head_kv`, when given and different, replaces `n_head`).
pub fn permute_weights(w: &Array, n_head: i64, n_head_kv: Option<i64>) -> Result<Array> {
    let heads = match n_head_kv {
        Some(kv) if kv != n_head => kv,
        _ => n_head,
    };
    let shape = w.shape();
    let rows = i64::from(
        *shape
            .first()
            .ok_or_else(|| err("cannot permute a scalar"))?,
    );
    if heads <= 0 {
        return Err(err(format!("cannot permute rows into {heads} heads")));
    }
    let half = rows.div_euclid(heads).div_euclid(2);
    let dims = [heads, 2, half]
        .iter()
        .map(|&d| i32::try_from(d).map_err(|_| err(format!("{d} does not fit a dimension"))))
        .collect::<Result<Vec<i32>>>()?;
    let mut split = dims;
    split.extend_from_slice(&shape[1..]);
    w.reshape(&split)
        .and_then(|r| r.swapaxes(1, 2))
        .and_then(|r| r.reshape(&shape))
        .map_err(mlx_err(format!(
            "permuting a {shape:?} weight into {heads} heads"
        )))
}

/// A regex-free `re.sub(r"block_sparse_moe\.experts\.(\d+)\.{w}\.weight", r"{to}.\1.weight")`.
fn replace_expert(name: &str, w: &str, to: &str) -> String {
    const PRE: &str = "block_sparse_moe.experts.";
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find(PRE) {
        let after = &rest[i + PRE.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let tail = format!(".{w}.weight");
        if digits > 0 && after[digits..].starts_with(&tail) {
            out.push_str(&rest[..i]);
            out.push_str(&format!("{to}.{}.weight", &after[..digits]));
            rest = &after[digits + tail.len()..];
        } else {
            out.push_str(&rest[..i + PRE.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Hugging Face parameter names to llama.cpp's (`translate_weight_names`: the same
/// replacements in the same order).
pub fn translate_weight_name(name: &str) -> String {
    let mut n = name.replace("model.layers.", "blk.");
    n = n.replace("block_sparse_moe.gate", "ffn_gate_inp");
    n = replace_expert(&n, "w1", "ffn_gate");
    n = replace_expert(&n, "w2", "ffn_down");
    n = replace_expert(&n, "w3", "ffn_up");
    for (from, to) in [
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.down_proj", "ffn_down"),
        ("mlp.up_proj", "ffn_up"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("model.embed_tokens", "token_embd"),
        ("model.norm", "output_norm"),
        ("lm_head", "output"),
    ] {
        n = n.replace(from, to);
    }
    n
}

/// `mx.array(v, dtype=uint32)` of a config number.
fn u32_array(key: &str, v: &Value) -> Result<Array> {
    let a = if let Some(i) = v.as_i64() {
        Array::scalar_i64(i, Dtype::Uint32)
    } else if let Some(f) = v.as_f64() {
        Array::scalar_f64(f, Dtype::Uint32)
    } else {
        return Err(err(format!("config.json: `{key}` is {v}, not a number")));
    };
    a.map_err(mlx_err(format!("building GGUF metadata from `{key}`")))
}

/// `mx.array(v)` of a config number: int32 for an integer, float32 for a float.
fn natural_array(key: &str, v: &Value) -> Result<Array> {
    let a = if let Some(i) = v.as_i64() {
        Array::scalar_i64(i, Dtype::Int32)
    } else if let Some(f) = v.as_f64() {
        Array::scalar_f64(f, Dtype::Float32)
    } else if let Some(b) = v.as_bool() {
        Array::scalar(b)
    } else {
        return Err(err(format!("config.json: `{key}` is {v}, not a number")));
    };
    a.map_err(mlx_err(format!("building GGUF metadata from `{key}`")))
}

fn f32_array(key: &str, v: &Value) -> Result<Array> {
    let f = v
        .as_f64()
        .ok_or_else(|| err(format!("config.json: `{key}` is {v}, not a number")))?;
    Array::scalar_f64(f, Dtype::Float32)
        .map_err(mlx_err(format!("building GGUF metadata from `{key}`")))
}

/// A config value that is present and not null.
fn get<'a>(config: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    config.get(key).filter(|v| !v.is_null())
}

fn required<'a>(config: &'a Map<String, Value>, key: &str) -> Result<&'a Value> {
    get(config, key).ok_or_else(|| err(format!("config.json has no `{key}`")))
}

fn int(config: &Map<String, Value>, key: &str) -> Result<i64> {
    let v = required(config, key)?;
    v.as_i64()
        .ok_or_else(|| err(format!("config.json: `{key}` is {v}, not an integer")))
}

/// The metadata mlx-lm writes (`prepare_metadata`), in its dict order.
pub fn prepare_metadata(
    config: &Map<String, Value>,
    vocab: &HfVocab,
) -> Result<Vec<(String, GgufValue)>> {
    let mut md: Vec<(String, Option<GgufValue>)> = Vec::new();
    let arr = |a: Array| Some(GgufValue::Array(a));
    let opt_u32 = |key: &str| -> Result<Option<GgufValue>> {
        get(config, key)
            .map(|v| u32_array(key, v))
            .transpose()
            .map(|a| a.map(GgufValue::Array))
    };
    md.push(("general.name".into(), None));
    md.push((
        "llama.context_length".into(),
        opt_u32("max_position_embeddings")?,
    ));
    md.push(("llama.embedding_length".into(), opt_u32("hidden_size")?));
    md.push(("llama.block_count".into(), opt_u32("num_hidden_layers")?));
    md.push((
        "llama.feed_forward_length".into(),
        opt_u32("intermediate_size")?,
    ));
    let heads = get(config, "num_attention_heads");
    let rope_dims = match (get(config, "hidden_size"), heads) {
        (Some(_), Some(_)) => {
            let (h, n) = (
                int(config, "hidden_size")?,
                int(config, "num_attention_heads")?,
            );
            if n == 0 {
                return Err(err("config.json: `num_attention_heads` is 0"));
            }
            arr(u32_array("hidden_size", &Value::from(h.div_euclid(n)))?)
        }
        _ => None,
    };
    md.push(("llama.rope.dimension_count".into(), rope_dims));
    md.push((
        "llama.attention.head_count".into(),
        opt_u32("num_attention_heads")?,
    ));
    let kv = match heads {
        Some(h) => {
            let v = config.get("num_key_value_heads").unwrap_or(h);
            arr(u32_array("num_key_value_heads", v)?)
        }
        None => None,
    };
    md.push(("llama.attention.head_count_kv".into(), kv));
    md.push(("llama.expert_count".into(), opt_u32("num_local_experts")?));
    md.push((
        "llama.expert_used_count".into(),
        opt_u32("num_experts_per_tok")?,
    ));
    let eps = get(config, "rms_norm_eps")
        .map(|v| natural_array("rms_norm_eps", v))
        .transpose()?;
    md.push((
        "llama.attention.layer_norm_rms_epsilon".into(),
        eps.map(GgufValue::Array),
    ));
    let theta = get(config, "rope_theta")
        .map(|v| f32_array("rope_theta", v))
        .transpose()?;
    md.push(("llama.rope.freq_base".into(), theta.map(GgufValue::Array)));

    if let Some(Value::Object(rs)) = get(config, "rope_scaling") {
        if let Some(typ) = rs.get("type").filter(|t| truthy(t)) {
            if typ.as_str() == Some("linear") {
                let factor = rs.get("factor").unwrap_or(&Value::Null);
                md.push((
                    "llama.rope.scaling.type".into(),
                    Some(GgufValue::String("linear".into())),
                ));
                md.push((
                    "llama.rope.scaling.factor".into(),
                    arr(natural_array("rope_scaling.factor", factor)?),
                ));
            }
        }
    }
    let one = |k: &str| u32_array(k, &Value::from(1u32));
    md.push(("general.file_type".into(), arr(one("general.file_type")?)));
    md.push((
        "general.quantization_version".into(),
        arr(one("general.quantization_version")?),
    ));
    let name = match config.get("_name_or_path") {
        None => "llama".to_string(),
        Some(Value::String(s)) => s.rsplit('/').next().unwrap_or_default().to_string(),
        Some(v) => {
            return Err(err(format!(
                "config.json: `_name_or_path` is {v}, not a string"
            )))
        }
    };
    md[0].1 = Some(GgufValue::String(name));
    md.push((
        "general.architecture".into(),
        Some(GgufValue::String("llama".into())),
    ));
    md.push((
        "general.alignment".into(),
        arr(u32_array("general.alignment", &Value::from(32u32))?),
    ));

    md.push((
        "tokenizer.ggml.model".into(),
        Some(GgufValue::String("llama".into())),
    ));
    let texts: Vec<String> = vocab.tokens.iter().map(|t| t.0.clone()).collect();
    let scores: Vec<f32> = vocab.tokens.iter().map(|t| t.1).collect();
    let types: Vec<u32> = vocab.tokens.iter().map(|t| t.2 as u32).collect();
    md.push((
        "tokenizer.ggml.tokens".into(),
        Some(GgufValue::Strings(texts)),
    ));
    let vec_md = |what: &str, a: mlx_array::Result<Array>| -> Result<Option<GgufValue>> {
        Ok(Some(GgufValue::Array(
            a.map_err(mlx_err(what.to_string()))?,
        )))
    };
    md.push((
        "tokenizer.ggml.scores".into(),
        vec_md("building the token scores", Array::from_vec(scores))?,
    ));
    md.push((
        "tokenizer.ggml.token_type".into(),
        vec_md("building the token types", Array::from_vec(types))?,
    ));
    for (key, id) in [
        ("tokenizer.ggml.bos_token_id", vocab.bos_token_id),
        ("tokenizer.ggml.eos_token_id", vocab.eos_token_id),
        ("tokenizer.ggml.unknown_token_id", vocab.unk_token_id),
    ] {
        if let Some(id) = id {
            md.push((key.into(), arr(u32_array(key, &Value::from(id))?)));
        }
    }
    Ok(md
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect())
}

/// Writes `weights` (the model's parameters in its module order, as `tree_flatten`
/// lists them) and the tokenizer of `model_dir` to `out` (`convert_to_gguf`; MLX adds
/// `.gguf` to a path without it). Call [`check_exportable`] first, as mlx-lm does.
pub fn export_gguf(
    model_dir: &Path,
    weights: Vec<(String, Array)>,
    config: &Map<String, Value>,
    out: &Path,
) -> Result<()> {
    let mut renamed = Vec::with_capacity(weights.len());
    for (k, v) in weights {
        let v = if k.contains("self_attn.q_proj.weight") {
            let n = int(config, "num_attention_heads")?;
            permute_weights(&v, n, Some(n))?
        } else if k.contains("self_attn.k_proj.weight") {
            let n = int(config, "num_attention_heads")?;
            let kv = int(config, "num_key_value_heads")?;
            permute_weights(&v, n, Some(kv))?
        } else {
            v
        };
        renamed.push((translate_weight_name(&k), v));
    }
    if !model_dir.join("tokenizer.json").is_file() {
        return Err(err(format!(
            "Tokenizer json not found in {}",
            model_dir.display()
        )));
    }
    let vocab = HfVocab::load(model_dir)?;
    let metadata = prepare_metadata(config, &vocab)?;
    let mut cast = Vec::with_capacity(renamed.len());
    for (k, v) in renamed {
        let v = if v.dtype() == Dtype::Bfloat16 {
            v.astype(Dtype::Float32)
                .and_then(|f| f.astype(Dtype::Float16))
        } else if k.contains("norm") {
            v.astype(Dtype::Float32)
        } else {
            Ok(v)
        }
        .map_err(mlx_err(format!("casting {k}")))?;
        cast.push((k, v));
    }
    mlx_array::io::save_gguf(
        out,
        cast.iter().map(|(k, v)| (k.as_str(), v)),
        metadata.iter().map(|(k, v)| (k.as_str(), v)),
    )
    .map_err(mlx_err(format!("writing {}", out.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_mlx_lm_translation() {
        for (hf, gguf) in [
            (
                "model.layers.3.self_attn.q_proj.weight",
                "blk.3.attn_q.weight",
            ),
            (
                "model.layers.0.mlp.down_proj.weight",
                "blk.0.ffn_down.weight",
            ),
            (
                "model.layers.1.input_layernorm.weight",
                "blk.1.attn_norm.weight",
            ),
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
            (
                "model.layers.2.block_sparse_moe.gate.weight",
                "blk.2.ffn_gate_inp.weight",
            ),
            (
                "model.layers.2.block_sparse_moe.experts.11.w1.weight",
                "blk.2.ffn_gate.11.weight",
            ),
            (
                "model.layers.2.block_sparse_moe.experts.0.w2.weight",
                "blk.2.ffn_down.0.weight",
            ),
            // mlx-lm's stacked experts keep their SwitchGLU name, `mlp.gate_proj` replaced.
            (
                "model.layers.0.block_sparse_moe.switch_mlp.gate_proj.weight",
                "blk.0.block_sparse_moe.switch_ffn_gate.weight",
            ),
        ] {
            assert_eq!(translate_weight_name(hf), gguf, "{hf}");
        }
    }

    #[test]
    fn permutation_interleaves_the_two_rotary_halves_per_head() {
        // 2 heads of 4 rows: [a0 a1 b0 b1] -> [a0 b0 a1 b1] per head.
        let w = Array::from_slice(&[0f32, 1., 2., 3., 4., 5., 6., 7.], &[8, 1]).unwrap();
        let p = permute_weights(&w, 2, None).unwrap();
        assert_eq!(
            p.to_vec::<f32>().unwrap(),
            vec![0., 2., 1., 3., 4., 6., 5., 7.]
        );
        // n_head_kv replaces n_head when it differs: one head of 8 rows.
        let p = permute_weights(&w, 2, Some(1)).unwrap();
        assert_eq!(
            p.to_vec::<f32>().unwrap(),
            vec![0., 4., 1., 5., 2., 6., 3., 7.]
        );
    }

    #[test]
    fn only_llama_mistral_mixtral_unquantized_are_exportable() {
        let cfg = |v: Value| v.as_object().unwrap().clone();
        assert!(check_exportable(&cfg(serde_json::json!({"model_type": "mistral"}))).is_ok());
        let e = check_exportable(&cfg(serde_json::json!({"model_type": "qwen2"})))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Model type qwen2 not supported"), "{e}");
        let e = check_exportable(&cfg(
            serde_json::json!({"model_type": "llama", "quantization": {"bits": 4}}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("quantized models"), "{e}");
    }
}

//! Memory the server must not run out of: MLX's limit (`--memory-limit-mb`), what a
//! model's sequences take per token (from its config.json: layers, KV heads, head size,
//! dtype, `--kv-bits`) for the engine's admission check, and the headroom `/health`
//! reports.
use mlx_engine::batch::MemoryAdmission;
use serde_json::{json, Value as Json};

/// The memory limit in force: the one set with `--memory-limit-mb`, else MLX's
/// default (derived from the device's memory); `None` when MLX reports none.
pub fn limit(configured: Option<u64>) -> Option<u64> {
    configured.or_else(|| {
        mlx_array::memory::memory_limit()
            .ok()
            .map(|l| l as u64)
            .filter(|&l| l > 0 && l < u64::MAX / 4)
    })
}

/// The admission costs of a model of `config` (its config.json; a multimodal
/// model's `text_config` is used) under `limit` bytes; `None` when the config lacks
/// the sizes.
pub fn admission(
    config: &Json,
    limit: u64,
    kv_bits: Option<i32>,
    kv_group_size: i32,
) -> Option<MemoryAdmission> {
    let c = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    let get = |k: &str| c.get(k).and_then(Json::as_u64);
    let layers = get("num_hidden_layers").or_else(|| get("n_layer"))?;
    let hidden = get("hidden_size").or_else(|| get("d_model"))?;
    let heads = get("num_attention_heads").or_else(|| get("n_head"))?.max(1);
    let kv_heads = get("num_key_value_heads").unwrap_or(heads);
    let head_dim = get("head_dim").unwrap_or(hidden / heads);
    let inter = get("intermediate_size").unwrap_or(4 * hidden);
    let vocab = get("vocab_size").unwrap_or(0);
    let dtype = match c
        .get("torch_dtype")
        .or_else(|| config.get("torch_dtype"))
        .and_then(Json::as_str)
    {
        Some("float32") => 4,
        _ => 2,
    };
    // Quantized KV: bits per element plus a scale and a bias per group.
    let kv_elem = match kv_bits {
        Some(b) => (b as f64 / 8.0) + 2.0 * dtype as f64 / kv_group_size.max(1) as f64,
        None => dtype as f64,
    };
    // Unquantized until --quantized-kv-start: count the larger of the two.
    let kv_elem = kv_elem.max(dtype as f64);
    Some(MemoryAdmission {
        limit_bytes: limit,
        kv_bytes_per_token: (2.0 * layers as f64 * kv_heads as f64 * head_dim as f64 * kv_elem)
            as u64,
        activation_bytes_per_token: dtype * (4 * hidden + 3 * inter),
        score_bytes_per_pair: 4 * heads,
        logits_bytes_per_row: 4 * vocab,
    })
}

/// `/health`'s memory report: MLX's active and cached bytes, the limit and the
/// headroom under it.
pub fn report(configured: Option<u64>) -> Json {
    let active = mlx_array::memory::active_memory() as u64;
    let cache = mlx_array::memory::cache_memory() as u64;
    let limit = limit(configured);
    json!({
        "active_bytes": active,
        "cache_bytes": cache,
        "limit_bytes": limit,
        "headroom_bytes": limit.map(|l| l.saturating_sub(active)),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn costs_follow_the_architecture() {
        let cfg = serde_json::json!({
            "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
            "num_key_value_heads": 1, "intermediate_size": 128, "vocab_size": 1000,
            "torch_dtype": "float32",
        });
        let m = super::admission(&cfg, 1 << 30, None, 64).unwrap();
        // Keys and values, 2 layers, 1 KV head of 32, float32.
        assert_eq!(m.kv_bytes_per_token, 2 * 2 * 32 * 4);
        assert_eq!(m.logits_bytes_per_row, 4000);
        assert!(super::admission(&serde_json::json!({}), 1, None, 64).is_none());
    }
}

//! Peak memory stays bounded: shards are computed and written one at a time, so a
//! conversion never holds the whole converted model (let alone two copies).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_array::{random, Array, Dtype};
use std::collections::BTreeMap;

/// A random llama checkpoint (float32) of about 19 MB in `dir`.
fn write_checkpoint(dir: &std::path::Path) -> u64 {
    let (h, inter, layers, vocab) = (256, 1024, 4, 1024);
    let mut w: BTreeMap<String, Array> = BTreeMap::new();
    random::seed(7).unwrap();
    let mut add = |name: String, shape: &[i32]| {
        let a = random::normal(shape, Dtype::Float32, None, None, None).unwrap();
        a.eval().unwrap();
        w.insert(name, a);
    };
    add("model.embed_tokens.weight".into(), &[vocab, h]);
    add("model.norm.weight".into(), &[h]);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            add(format!("{p}.self_attn.{n}.weight"), &[h, h]);
        }
        add(format!("{p}.mlp.gate_proj.weight"), &[inter, h]);
        add(format!("{p}.mlp.up_proj.weight"), &[inter, h]);
        add(format!("{p}.mlp.down_proj.weight"), &[h, inter]);
        add(format!("{p}.input_layernorm.weight"), &[h]);
        add(format!("{p}.post_attention_layernorm.weight"), &[h]);
    }
    std::fs::create_dir_all(dir).unwrap();
    let total: u64 = w.values().map(|a| a.nbytes() as u64).sum();
    mlx_array::io::save_safetensors(
        dir.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        [("format", "pt")],
    )
    .unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5, "vocab_size": vocab, "tie_word_embeddings": true,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    total
}

#[test]
fn sharded_conversion_peaks_well_below_the_model_size() {
    let tmp = temp_dir("memory");
    let src = tmp.join("src");
    let total = write_checkpoint(&src);
    mlx_array::memory::clear_cache();
    mlx_array::memory::reset_peak_memory();
    let out = tmp.join("out");
    let mut o = options(&src, &out, &["-q", "--q-bits", "8"]);
    o.max_shard_bytes = 1 << 20;
    let report = convert(&o);
    let peak = mlx_array::memory::peak_memory() as u64;
    let report = report.unwrap();
    assert!(report.weights.shards.len() > 3);
    // The input is 19 MB of float32; its largest tensor 1 MB. Holding the model once
    // would peak above 19 MB (twice: 24 MB with the 8-bit copy).
    assert!(
        peak < total / 3,
        "peak {peak} bytes for a {total}-byte model ({} shards)",
        report.weights.shards.len()
    );
    eprintln!("peak {peak} bytes converting a {total}-byte model");
    std::fs::remove_dir_all(&tmp).unwrap();
}

use mlx_quant::convert;

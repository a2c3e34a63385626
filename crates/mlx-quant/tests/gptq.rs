//! GPTQ against mlx-lm's `gptq_quantize` on the same calibration rows
//! (`goldens/gptq`, written by `xtask/py/gptq_oracle.py`): every tensor bit for bit and
//! the config's quantization section; and its refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_array::Array;
use mlx_quant::gptq::{gptq_quantize, GptqOptions};
use mlx_quant::{save_model_over, QuantError};
use std::collections::BTreeMap;

fn case_data(case: &serde_json::Value) -> Array {
    token_rows(&case["tokens"]).1
}

fn options(case: &serde_json::Value) -> GptqOptions {
    let int = |k: &str| case[k].as_i64().unwrap() as i32;
    GptqOptions {
        bits: int("bits"),
        group_size: int("group_size"),
        fallback_bits: int("fallback_bits"),
        fallback_group_size: int("fallback_group_size"),
        ..Default::default()
    }
}

/// Runs GPTQ on each golden case (`hessian_float32` as given) and returns, per case,
/// whether every tensor equals mlx-lm's (the quantization sections must).
fn against_goldens(hessian_float32: bool) -> BTreeMap<String, bool> {
    let goldens = root().join("goldens/gptq");
    let cases = json(&goldens.join("cases.json"));
    let cases = cases.as_object().unwrap();
    assert!(cases.len() >= 3);
    let tmp = temp_dir("gptq");
    let mut same = BTreeMap::new();
    for (name, case) in cases {
        let src = tmp.join(format!("src-{name}"));
        golden_source(case["source"].as_str().unwrap(), &src);
        let source = mlx_quant::resolve_source(src.to_str().unwrap(), &tmp.join(name)).unwrap();
        let mut model = mlx_quant::model::load(&source.dir, true).unwrap();
        let mut phases = Vec::new();
        let opts = GptqOptions {
            hessian_float32,
            ..options(case)
        };
        gptq_quantize(&mut model, &case_data(case), &opts, &mut |p, i, n| {
            phases.push((p.to_string(), i, n))
        })
        .unwrap();
        assert!(
            phases.iter().any(|(p, i, n)| p == "Quantizing" && i == n),
            "{name}"
        );
        let out = tmp.join(name);
        save_model_over(&out, model, &source, 5 << 30, false).unwrap();
        let want_dir = goldens.join(name);
        let (want, got) = (tensors(&want_dir), tensors(&out));
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            "{name}"
        );
        let mut equal = true;
        for (k, w) in &want {
            let g = &got[k];
            assert_eq!(
                (w.dtype(), w.shape()),
                (g.dtype(), g.shape()),
                "{name}: {k}"
            );
            if w.to_bytes().unwrap() != g.to_bytes().unwrap() {
                eprintln!("{name}: {k} differs from mlx-lm's");
                equal = false;
            }
        }
        let (wc, gc) = (
            json(&want_dir.join("config.json")),
            json(&out.join("config.json")),
        );
        for key in ["quantization", "quantization_config"] {
            assert_eq!(wc[key], gc[key], "{name}: {key}");
        }
        same.insert(name.clone(), equal);
    }
    std::fs::remove_dir_all(&tmp).unwrap();
    same
}

#[test]
fn gptq_matches_mlx_lm_gptq_goldens() {
    let same = against_goldens(false);
    assert!(same.values().all(|s| *s), "{same:?}");
}

#[test]
fn float32_hessians_change_only_half_precision_models() {
    // Float32 models multiply in float32 either way; the bfloat16 one's Hessians (and so
    // its weights) are no longer rounded to bfloat16.
    let same = against_goldens(true);
    assert!(same["llama-tied-q4-g32"], "{same:?}");
    assert!(same["mixtral-q2-g32"], "{same:?}");
    assert!(!same["llama-bf16-bias-q8-g32"], "{same:?}");
}

fn tiny(name: &str, tag: &str) -> (std::path::PathBuf, mlx_quant::LoadedModel) {
    let tmp = temp_dir(tag);
    let src = tmp.join("src");
    golden_source(name, &src);
    let model = mlx_quant::model::load(&src, true).unwrap();
    (tmp, model)
}

fn data() -> Array {
    let ids: Vec<i32> = (0..32).map(|i| (i * 7 + 3) % 128).collect();
    Array::from_slice(&ids, &[2, 16]).unwrap()
}

#[test]
fn gptq_refuses_what_it_cannot_quantize() {
    let (tmp, mut model) = tiny("llama-small-f32-tied", "gptq-bad");
    let quiet = &mut |_: &str, _: usize, _: usize| {};
    // 3 bits: mlx-lm's packing takes 2, 4 or 8.
    let three = GptqOptions {
        bits: 3,
        group_size: 32,
        ..Default::default()
    };
    let e = gptq_quantize(&mut model, &data(), &three, quiet).unwrap_err();
    assert!(
        matches!(e, QuantError::Options(_)) && e.to_string().contains("not 3"),
        "{e}"
    );
    // A group size that does not divide the 32-wide inputs names the layer.
    let g64 = GptqOptions {
        group_size: 64,
        ..Default::default()
    };
    let e = gptq_quantize(&mut model, &data(), &g64, quiet)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers.0") && e.contains("group size 64"),
        "{e}"
    );
    // Token ids must be [rows, length].
    let flat = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    let g32 = GptqOptions {
        group_size: 32,
        fallback_group_size: 32,
        ..Default::default()
    };
    let e = gptq_quantize(&mut model, &flat, &g32, quiet)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[rows, length]"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();

    // An already quantized model.
    let (tmp, mut model) = tiny("llama-small-q4-g32", "gptq-quantized");
    let e = gptq_quantize(&mut model, &data(), &g32, quiet)
        .unwrap_err()
        .to_string();
    assert!(e.contains("already quantized"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

//! Conversion and dynamic quantization against committed mlx-lm outputs
//! (`goldens/convert`, written by `xtask/py/convert_oracle.py goldens`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_array::Dtype;
use mlx_quant::dynamic::{
    calibration_data, estimate_sensitivities, estimate_threshold, perplexity, BitChoices,
};
use serde_json::Value;
use std::collections::BTreeMap;

#[test]
fn convert_matches_mlx_lm_convert_goldens() {
    let goldens = root().join("goldens/convert");
    let cases = json(&goldens.join("cases.json"));
    let cases = cases.as_object().unwrap();
    assert!(cases.len() >= 5);
    let tmp = temp_dir("goldens");
    for (name, case) in cases {
        let src = tmp.join(format!("src-{name}"));
        golden_source(case["source"].as_str().unwrap(), &src);
        let flags: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let out = tmp.join(name);
        mlx_quant::convert(&options(&src, &out, &flags)).unwrap();
        let want_dir = goldens.join(name);
        let (want, got) = (tensors(&want_dir), tensors(&out));
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (k, w) in &want {
            let g = &got[k];
            assert_eq!(
                (w.dtype(), w.shape()),
                (g.dtype(), g.shape()),
                "{name}: {k}"
            );
            assert!(
                w.to_bytes().unwrap() == g.to_bytes().unwrap(),
                "{name}: {k} values"
            );
        }
        for f in ["config.json", "model.safetensors.index.json"] {
            assert_eq!(json(&want_dir.join(f)), json(&out.join(f)), "{name}: {f}");
        }
        assert_eq!(
            std::fs::read_to_string(want_dir.join("README.md")).unwrap(),
            std::fs::read_to_string(out.join("README.md")).unwrap()
        );
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn dynamic_quant_pieces_match_mlx_lm_dynamic_quant() {
    let g = json(&root().join("goldens/convert/dynamic.json"));
    let (rows, data) = token_rows(&g["tokens"]);
    let len = rows[0].len();
    let flat: Vec<i32> = rows.concat();

    // load_data's shuffle: mx.random.seed(123); permutation(rows).
    let flat_u: Vec<u32> = flat.iter().map(|&t| t as u32).collect();
    let shuffled = calibration_data(&flat_u, len, 123, 0).unwrap();
    let perm: Vec<usize> = g["permutation_seed_123"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let want: Vec<i32> = perm.iter().flat_map(|&i| rows[i].clone()).collect();
    assert_eq!(shuffled.to_vec::<i32>().unwrap(), want);

    let bits = BitChoices {
        low_bits: g["low_bits"].as_i64().unwrap() as i32,
        low_group_size: g["low_group_size"].as_i64().unwrap() as i32,
        high_bits: g["high_bits"].as_i64().unwrap() as i32,
        high_group_size: g["high_group_size"].as_i64().unwrap() as i32,
    };
    let dir = root()
        .join("goldens/models")
        .join(g["model"].as_str().unwrap());
    let mut model = mlx_quant::model::load(&dir, false).unwrap();
    let batch = g["batch_size"].as_u64().unwrap() as usize;
    let sens =
        estimate_sensitivities(&mut model, &data, bits, batch, Dtype::Float32, |_, _| {}).unwrap();
    let want: Vec<(String, f64)> = g["sensitivities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(
        sens.iter().map(|s| &s.0).collect::<Vec<_>>(),
        want.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    let mut worst = 0f64;
    for ((k, a), (_, b)) in sens.iter().zip(&want) {
        assert!(close(*a, *b, 1e-9), "{k}: ours {a}, mlx-lm {b}");
        worst = worst.max((a - b).abs() / a.abs().max(b.abs()).max(1e-12));
    }
    eprintln!("sensitivities: largest relative difference to mlx-lm {worst:.2e}");

    // The threshold search on mlx-lm's own sensitivities is deterministic arithmetic.
    let sdict: BTreeMap<String, f64> = want.into_iter().collect();
    let target = g["target_bpw"].as_f64().unwrap();
    let t = estimate_threshold(&mut model, &sdict, target, bits).unwrap();
    assert!(
        close(t, g["threshold"].as_f64().unwrap(), 1e-12),
        "threshold {t}"
    );

    let ppl = perplexity(model.model.as_ref(), &data, batch).unwrap();
    let want_ppl = g["ppl"].as_f64().unwrap();
    assert!(
        close(ppl, want_ppl, 1e-5),
        "ppl ours {ppl}, mlx-lm {want_ppl}"
    );
    assert!(matches!(g["model"], Value::String(_)));
}

/// `mlx_lm.gptq` seeds MLX before `load`, which draws a key for each initial weight of
/// the model it builds (and each layer it quantizes), so its calibration rows are the
/// permutation drawn after those keys: mlx-lm's orders of 20 rows after
/// `mx.random.seed(123); load_model(dir, lazy=True)`, recorded with mlx-lm 0.32.2.
#[test]
fn calibration_rows_follow_mlx_lm_load_draws() {
    for (name, want) in [
        (
            "helium-small-f32",
            [
                0, 9, 3, 5, 16, 18, 13, 14, 2, 19, 10, 4, 11, 7, 8, 17, 12, 1, 15, 6,
            ],
        ),
        (
            "llama-small-q4-g32",
            [
                18, 5, 3, 0, 17, 4, 8, 14, 10, 16, 19, 15, 6, 13, 2, 1, 7, 11, 12, 9,
            ],
        ),
    ] {
        let dir = root().join("goldens/models").join(name);
        let draws = mlx_models::model::mlx_lm_init_key_draws(&dir).unwrap();
        // Row r holds the tokens 2r, 2r + 1: the first token of each shuffled row is
        // twice its index.
        let tokens: Vec<u32> = (0..40).collect();
        let rows = calibration_data(&tokens, 2, 123, draws).unwrap();
        let firsts: Vec<i32> = rows
            .to_vec::<i32>()
            .unwrap()
            .iter()
            .step_by(2)
            .map(|t| t / 2)
            .collect();
        assert_eq!(firsts, want, "{name}: {draws} draws");
    }
}

//! mlx-lm's per-layer quantization predicate.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::quant::{quantize, QuantMode};
use mlx_array::{ops, Array, Dtype};
use mlx_models::QuantizationConfig;
use mlx_nn::{LinearLayer, QuantSpec};
use serde_json::json;
use std::collections::BTreeMap;

fn config(q: serde_json::Value) -> QuantizationConfig {
    QuantizationConfig::from_config(&json!({ "quantization": q }))
        .unwrap()
        .unwrap()
}

fn packed(bits: i32, group: i32, mode: QuantMode) -> BTreeMap<String, Array> {
    let w = ops::ones(&[16, 64], Dtype::Float32).unwrap();
    let q = quantize(&w, Some(group), Some(bits), mode).unwrap();
    let mut m = BTreeMap::new();
    m.insert("l.weight".to_string(), q.weight);
    m.insert("l.scales".to_string(), q.scales);
    if let Some(b) = q.biases {
        m.insert("l.biases".to_string(), b);
    }
    m
}

#[test]
fn a_false_entry_keeps_the_layer_dense() {
    let q = config(json!({"group_size": 64, "bits": 4, "l": false}));
    let layer = LinearLayer::new(64, 16, false).unwrap();
    assert_eq!(
        q.spec_for("l", &layer, &packed(4, 64, QuantMode::Affine))
            .unwrap(),
        None
    );
}

#[test]
fn a_dict_entry_takes_the_mode_defaults_for_missing_values() {
    let q = config(json!({"group_size": 64, "bits": 4, "l": {"bits": 8}, "m": {"mode": "mxfp4"}}));
    let layer = LinearLayer::new(64, 16, false).unwrap();
    let none = BTreeMap::new();
    assert_eq!(
        q.spec_for("l", &layer, &none).unwrap(),
        Some(QuantSpec::new(Some(64), Some(8), QuantMode::Affine))
    );
    assert_eq!(
        q.spec_for("m", &layer, &none).unwrap(),
        Some(QuantSpec::new(Some(32), Some(4), QuantMode::Mxfp4))
    );
}

#[test]
fn without_scales_a_layer_stays_dense() {
    let q = config(json!({"group_size": 64, "bits": 4}));
    let layer = LinearLayer::new(64, 16, false).unwrap();
    assert_eq!(q.spec_for("l", &layer, &BTreeMap::new()).unwrap(), None);
}

#[test]
fn group_size_bits_and_mode_are_inferred_from_the_shapes() {
    let q = config(json!({"group_size": 64, "bits": 4}));
    let layer = LinearLayer::new(64, 16, false).unwrap();
    for (bits, group, mode) in [
        (4, 32, QuantMode::Affine),
        (8, 64, QuantMode::Affine),
        (3, 64, QuantMode::Affine),
        (4, 32, QuantMode::Mxfp4),
        (8, 32, QuantMode::Mxfp8),
        (4, 16, QuantMode::Nvfp4),
    ] {
        let got = q.spec_for("l", &layer, &packed(bits, group, mode)).unwrap();
        assert_eq!(
            got,
            Some(QuantSpec {
                group_size: group,
                bits,
                mode
            }),
            "{bits} bits, group {group}, {mode:?}"
        );
    }
}

#[test]
fn legacy_mxfp4_quantization_config_is_read() {
    let q =
        QuantizationConfig::from_config(&json!({"quantization_config": {"quant_method": "mxfp4"}}))
            .unwrap()
            .unwrap();
    assert_eq!(
        q.default,
        QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Mxfp4
        }
    );
}

#[test]
fn an_unquantized_config_has_no_quantization() {
    assert!(
        QuantizationConfig::from_config(&json!({"model_type": "llama"}))
            .unwrap()
            .is_none()
    );
}

//! Parameter trees: names, strict loading, freezing, quantizing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops, Array, Dtype};
use mlx_nn::{impl_module, quantize_module, Error, LinearLayer, Module, QuantSpec, RmsNorm};
use std::collections::BTreeMap;

struct Block {
    q_proj: LinearLayer,
    norm: RmsNorm,
}
impl_module!(Block { q_proj, norm });

struct Net {
    layers: Vec<Block>,
    head: Option<LinearLayer>,
}
impl_module!(Net { layers as "blocks", head });

fn net() -> Net {
    let block = || Block {
        q_proj: LinearLayer::new(64, 32, true).unwrap(),
        norm: RmsNorm::new(32, 1e-5).unwrap(),
    };
    Net {
        layers: vec![block(), block()],
        head: None,
    }
}

fn full_weights(n: &Net) -> BTreeMap<String, Array> {
    n.parameter_shapes()
        .into_iter()
        .map(|(k, s)| (k, ops::ones(&s, Dtype::Float32).unwrap()))
        .collect()
}

#[test]
fn parameter_names_are_dotted_checkpoint_paths() {
    let names: Vec<String> = net().parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "blocks.0.q_proj.weight",
            "blocks.0.q_proj.bias",
            "blocks.0.norm.weight",
            "blocks.1.q_proj.weight",
            "blocks.1.q_proj.bias",
            "blocks.1.norm.weight",
        ]
    );
}

#[test]
fn strict_load_names_the_missing_tensor() {
    let mut n = net();
    let mut w = full_weights(&n);
    w.remove("blocks.1.norm.weight");
    match n.load_weights(w, true) {
        Err(Error::MissingParameters(names)) => assert_eq!(names, ["blocks.1.norm.weight"]),
        other => panic!("expected a missing-parameter error, got {other:?}"),
    }
}

#[test]
fn strict_load_names_the_unexpected_tensor() {
    let mut n = net();
    let mut w = full_weights(&n);
    w.insert(
        "blocks.0.k_proj.weight".into(),
        ops::ones(&[2], Dtype::Float32).unwrap(),
    );
    let err = n.load_weights(w, true).unwrap_err();
    assert!(matches!(&err, Error::UnexpectedParameters(v) if v == &["blocks.0.k_proj.weight"]));
    assert!(err.to_string().contains("blocks.0.k_proj.weight"));
}

/// A checkpoint of a deeper model lists hundreds of extra tensors: the message names the
/// first dozen and counts the rest (the error still holds them all).
#[test]
fn strict_load_of_many_unexpected_tensors_names_a_few_and_counts_the_rest() {
    let mut n = net();
    let mut w = full_weights(&n);
    for i in 0..40 {
        w.insert(
            format!("blocks.{}.k_proj.weight", i + 5),
            ops::ones(&[2], Dtype::Float32).unwrap(),
        );
    }
    let err = n.load_weights(w, true).unwrap_err();
    assert!(matches!(&err, Error::UnexpectedParameters(v) if v.len() == 40));
    let message = err.to_string();
    assert!(
        message.starts_with("40 parameter(s) not in the model: "),
        "{message}"
    );
    assert!(message.ends_with(", and 28 more"), "{message}");
    assert_eq!(message.matches("k_proj.weight").count(), 12, "{message}");
}

#[test]
fn strict_load_names_the_wrongly_shaped_tensor() {
    let mut n = net();
    let mut w = full_weights(&n);
    w.insert(
        "blocks.1.q_proj.weight".into(),
        ops::ones(&[32, 63], Dtype::Float32).unwrap(),
    );
    match n.load_weights(w, true) {
        Err(Error::ShapeMismatch {
            name,
            expected,
            got,
        }) => {
            assert_eq!(name, "blocks.1.q_proj.weight");
            assert_eq!(expected, [32, 64]);
            assert_eq!(got, [32, 63]);
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn loaded_values_replace_the_placeholders() {
    let mut n = net();
    let w = full_weights(&n);
    n.load_weights(w, true).unwrap();
    let (_, b) = &n.parameters()[1];
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0; 32]);
}

#[test]
fn update_rejects_unknown_names() {
    let mut n = net();
    let mut w = BTreeMap::new();
    w.insert("nope".to_string(), ops::ones(&[1], Dtype::Float32).unwrap());
    assert!(matches!(n.update(w), Err(Error::UnexpectedParameters(v)) if v == ["nope"]));
}

#[test]
fn frozen_parameters_are_not_trainable() {
    let mut n = net();
    assert_eq!(n.trainable_parameters().len(), 6);
    n.freeze();
    assert!(n.trainable_parameters().is_empty());
    assert_eq!(n.set_frozen_where(false, &|name| name.ends_with("bias")), 2);
    let names: Vec<String> = n
        .trainable_parameters()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(names, ["blocks.0.q_proj.bias", "blocks.1.q_proj.bias"]);
    n.unfreeze();
    assert_eq!(n.trainable_parameters().len(), 6);
}

#[test]
fn quantizing_swaps_layers_and_their_parameter_names() {
    let mut n = net();
    let mut seen = Vec::new();
    quantize_module(&mut n, &mut |path, _| {
        seen.push(path.to_string());
        Ok(Some(QuantSpec::new(
            Some(32),
            Some(4),
            mlx_array::quant::QuantMode::Affine,
        )))
    })
    .unwrap();
    assert_eq!(seen, ["blocks.0.q_proj", "blocks.1.q_proj"]);
    let shapes = n.parameter_shapes();
    assert_eq!(shapes["blocks.0.q_proj.weight"], [32, 8]);
    assert_eq!(shapes["blocks.0.q_proj.scales"], [32, 2]);
    assert_eq!(shapes["blocks.0.q_proj.biases"], [32, 2]);
    assert_eq!(shapes["blocks.0.q_proj.bias"], [32]);
    // Quantized weights are frozen like mlx.nn's QuantizedLinear.
    assert_eq!(n.trainable_parameters().len(), 4);
}

#[test]
fn quantizing_with_a_bad_group_size_names_the_layer() {
    let mut n = net();
    let err = quantize_module(&mut n, &mut |_, _| {
        Ok(Some(QuantSpec::new(
            Some(48),
            Some(4),
            mlx_array::quant::QuantMode::Affine,
        )))
    })
    .unwrap_err();
    assert!(err.to_string().contains("blocks.0.q_proj"), "{err}");
}

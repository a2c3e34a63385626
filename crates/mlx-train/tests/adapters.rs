//! Adapter configs and weights that do not fit get errors naming the problem.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops, Array, Dtype};
use mlx_train::adapters::{AdapterConfig, LoraParameters};
use mlx_train::{fuse_adapters, Adapters, FineTuneType, TrainError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn parse(text: &str) -> Result<AdapterConfig, TrainError> {
    AdapterConfig::parse(text, Path::new("adapter_config.json"))
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(c) => panic!("accepted {text}: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn configs_as_mlx_lm_writes_them_parse() {
    let c = parse(r#"{"fine_tune_type": "dora", "num_layers": 16, "lora_parameters": {"rank": 8, "dropout": 0.0, "scale": 20.0}, "iters": 600}"#).unwrap();
    assert_eq!(c.fine_tune_type, FineTuneType::Dora);
    assert_eq!(c.num_layers, Some(16));
    assert_eq!(
        c.lora,
        Some(LoraParameters {
            rank: 8,
            scale: 20.0,
            dropout: 0.0,
            keys: None
        })
    );
    // No fine_tune_type: LoRA (older mlx-lm files).
    let c = parse(r#"{"num_layers": 4, "lora_parameters": {"rank": 2, "scale": 1, "keys": ["self_attn.q_proj"]}}"#).unwrap();
    assert_eq!(c.fine_tune_type, FineTuneType::Lora);
    assert_eq!(
        c.lora.unwrap().keys,
        Some(vec!["self_attn.q_proj".to_string()])
    );
    // A full fine-tune needs no LoRA parameters.
    assert_eq!(parse(r#"{"fine_tune_type": "full"}"#).unwrap().lora, None);
}

#[test]
fn bad_configs_are_named() {
    assert!(err("[1]").contains("not a JSON object"));
    assert!(err("{").contains("not valid JSON"));
    assert!(err(r#"{"fine_tune_type": "qlora"}"#)
        .contains(r#"fine_tune_type "qlora" is not one of lora, dora, full"#));
    assert!(err(r#"{"fine_tune_type": "lora"}"#).contains("no lora_parameters"));
    let e = err(r#"{"lora_parameters": {"rank": 8, "alpha": 16}}"#);
    assert!(
        e.contains("has no `scale`") && e.contains("uses `scale`, not `alpha`"),
        "{e}"
    );
    assert!(err(r#"{"lora_parameters": {"scale": 2}}"#).contains("has no `rank`"));
    assert!(err(r#"{"lora_parameters": {"rank": 0, "scale": 2}}"#)
        .contains("rank 0 is not a positive integer"));
    assert!(err(r#"{"lora_parameters": {"rank": 2, "scale": "x"}}"#)
        .contains("scale \"x\" is not a number"));
    assert!(
        err(r#"{"num_layers": "all", "lora_parameters": {"rank": 2, "scale": 1}}"#)
            .contains("num_layers \"all\" is not an integer")
    );
}

#[test]
fn missing_directories_and_files_are_named() {
    let e = Adapters::load("/nonexistent/adapters")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/nonexistent/adapters: the adapter path does not exist"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let e = Adapters::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
    std::fs::write(
        dir.path().join("adapter_config.json"),
        r#"{"fine_tune_type": "full"}"#,
    )
    .unwrap();
    let e = Adapters::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("adapters.safetensors: no such file"), "{e}");
}

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models/llama-small-f32-tied")
}

fn adapters(kind: &str, weights: Vec<(&str, Array)>) -> Adapters {
    let cfg = format!(
        r#"{{"fine_tune_type": "{kind}", "lora_parameters": {{"rank": 2, "scale": 2.0}}}}"#
    );
    Adapters {
        dir: PathBuf::from("adapters"),
        config: parse(&cfg).unwrap(),
        weights: weights
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn zeros(shape: &[i32]) -> Array {
    ops::zeros(shape, Dtype::Float32).unwrap()
}

fn fuse_err(a: &Adapters) -> String {
    let mut model = mlx_quant::model::load(&model_dir(), true).unwrap();
    match fuse_adapters(&mut model, a, false) {
        Ok(r) => panic!("fused {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn adapters_that_do_not_fit_the_model_are_named() {
    let model = mlx_quant::model::load(&model_dir(), true).unwrap();
    let shapes = mlx_nn::Module::parameter_shapes(model.module().unwrap());
    let q = &shapes["model.layers.0.self_attn.q_proj.weight"];
    let (out, inp) = (q[0], q[1]);
    let e = fuse_err(&adapters(
        "lora",
        vec![("model.layers.0.self_attn.q_proj.lora_a", zeros(&[inp, 2]))],
    ));
    assert!(
        e.contains("model.layers.0.self_attn.q_proj.lora_b: missing"),
        "{e}"
    );
    let e = fuse_err(&adapters(
        "lora",
        vec![
            (
                "model.layers.0.self_attn.q_proj.lora_a",
                zeros(&[inp + 1, 2]),
            ),
            ("model.layers.0.self_attn.q_proj.lora_b", zeros(&[2, out])),
        ],
    ));
    assert!(e.contains("do not fit its weight"), "{e}");
    let e = fuse_err(&adapters(
        "lora",
        vec![
            ("model.layers.9.mlp.nope.lora_a", zeros(&[inp, 2])),
            ("model.layers.9.mlp.nope.lora_b", zeros(&[2, out])),
        ],
    ));
    assert!(
        e.contains("model.layers.9.mlp.nope: not a linear, embedding or expert layer"),
        "{e}"
    );
    let e = fuse_err(&adapters(
        "lora",
        vec![("model.layers.0.self_attn.q_proj.weight", zeros(&[out, inp]))],
    ));
    assert!(e.contains("not an adapter parameter"), "{e}");
    let e = fuse_err(&adapters(
        "dora",
        vec![
            ("model.layers.0.self_attn.q_proj.lora_a", zeros(&[inp, 2])),
            ("model.layers.0.self_attn.q_proj.lora_b", zeros(&[2, out])),
        ],
    ));
    assert!(
        e.contains("model.layers.0.self_attn.q_proj.m: missing"),
        "{e}"
    );
    let e = fuse_err(&adapters(
        "dora",
        vec![
            ("model.layers.0.self_attn.q_proj.lora_a", zeros(&[inp, 2])),
            ("model.layers.0.self_attn.q_proj.lora_b", zeros(&[2, out])),
            ("model.layers.0.self_attn.q_proj.m", zeros(&[1])),
        ],
    ));
    assert!(
        e.contains("model.layers.0.self_attn.q_proj: m [1] does not fit its weight"),
        "{e}"
    );
    let e = fuse_err(&adapters(
        "full",
        vec![(
            "model.layers.0.self_attn.q_proj.weight",
            zeros(&[out, inp + 1]),
        )],
    ));
    assert!(
        e.contains("model.layers.0.self_attn.q_proj.weight: shape"),
        "{e}"
    );
    let e = fuse_err(&adapters("full", vec![("model.nope", zeros(&[1]))]));
    assert!(
        e.contains("model.nope: not a parameter of the model"),
        "{e}"
    );
}

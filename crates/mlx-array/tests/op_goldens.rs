//! Bit-exact comparison against Python MLX 0.32.4.
//!
//! `goldens/ops/` holds inputs and outputs computed by `xtask/py/gen_op_goldens.py`
//! (regenerate with `cargo xtask goldens`) and a manifest naming each case's op and
//! parameters. Every case is replayed through mlx-array and must give the same dtype,
//! shape and bytes. One test per golden file, so a failure points at an op family.
//!
//! Known, documented differences: none (see `docs/parity.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod golden_ops;

use mlx_array::{io, Array, Dtype, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/ops")
}

struct Manifest {
    cases: Vec<Value>,
}

fn manifest() -> Manifest {
    let path = golden_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask goldens`)", path.display()));
    let v: Value = serde_json::from_str(&text).expect("manifest.json is valid JSON");
    assert_eq!(
        v["mlx_version"], "0.32.4",
        "goldens were made with another MLX"
    );
    assert_eq!(
        mlx_array::mlx_version(),
        "0.32.4",
        "this build links another MLX"
    );
    Manifest {
        cases: v["cases"].as_array().expect("cases is a list").clone(),
    }
}

/// Largest |a - b| over the elements, when both convert to float32.
fn max_abs_diff(a: &Array, b: &Array) -> Result<f32> {
    let a = a.astype(Dtype::Float32)?.to_vec::<f32>()?;
    let b = b.astype(Dtype::Float32)?.to_vec::<f32>()?;
    Ok(a.iter()
        .zip(&b)
        .map(|(x, y)| {
            if x.to_bits() == y.to_bits() {
                0.0
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0f32, |m, d| if d.is_nan() || d > m { d } else { m }))
}

/// Compares one output; `None` when identical, else a description of the difference.
fn compare(got: &Array, want: &Array) -> Result<Option<String>> {
    if got.dtype() != want.dtype() {
        return Ok(Some(format!(
            "dtype {} != python {}",
            got.dtype(),
            want.dtype()
        )));
    }
    if got.shape() != want.shape() {
        return Ok(Some(format!(
            "shape {:?} != python {:?}",
            got.shape(),
            want.shape()
        )));
    }
    if got.to_bytes()? == want.to_bytes()? {
        return Ok(None);
    }
    let diff = max_abs_diff(got, want).map_or_else(|e| format!("? ({e})"), |d| d.to_string());
    Ok(Some(format!("bytes differ, max abs diff {diff}")))
}

/// Runs every case of `file`; panics listing each case that differs.
fn check_family(file: &str) {
    let m = manifest();
    let path = golden_dir().join(format!("{file}.safetensors"));
    let (tensors, _) = io::load_safetensors(&path).expect("golden file loads");
    let mut failures = Vec::new();
    let mut ran = 0;
    for c in m.cases.iter().filter(|c| c["file"] == file) {
        let name = c["name"].as_str().expect("case name");
        let op = c["op"].as_str().expect("case op");
        let inputs: Vec<Array> = c["inputs"]
            .as_array()
            .expect("inputs")
            .iter()
            .map(|k| {
                let k = k.as_str().expect("input key");
                tensors
                    .get(k)
                    .unwrap_or_else(|| panic!("{name}: no tensor {k}"))
                    .clone()
            })
            .collect();
        let n_out = c["outputs"].as_u64().expect("outputs") as usize;
        ran += 1;
        let outs = match golden_ops::run(op, &golden_ops::P(&c["params"]), &inputs) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: error: {e}"));
                continue;
            }
        };
        if outs.len() != n_out {
            failures.push(format!(
                "{name}: {} outputs, python has {n_out}",
                outs.len()
            ));
            continue;
        }
        for (i, got) in outs.iter().enumerate() {
            let want = &tensors[&format!("out/{name}/{i}")];
            match compare(got, want) {
                Ok(None) => {}
                Ok(Some(why)) => failures.push(format!("{name} output {i}: {why}")),
                Err(e) => failures.push(format!("{name} output {i}: error: {e}")),
            }
        }
    }
    assert!(ran > 0, "no cases for {file}");
    assert!(
        failures.is_empty(),
        "{} of {ran} {file} cases differ from Python MLX:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{file}: {ran} cases bit-identical to Python MLX");
}

#[test]
fn elementwise_matmul_and_casts_match_python_bit_for_bit() {
    check_family("elementwise");
}

#[test]
fn reductions_sorting_and_scans_match_python_bit_for_bit() {
    check_family("reduce");
}

#[test]
fn shapes_indexing_and_construction_match_python_bit_for_bit() {
    check_family("shape_index");
}

#[test]
fn activations_norms_rope_and_attention_match_python_bit_for_bit() {
    check_family("nn");
}

#[test]
fn quantization_matches_python_bit_for_bit() {
    check_family("quant");
}

#[test]
fn random_draws_match_python_bit_for_bit() {
    check_family("random");
}

#[test]
fn linalg_matches_python_bit_for_bit() {
    check_family("linalg");
}

#[test]
fn transforms_match_python_bit_for_bit() {
    check_family("transforms");
}

#[test]
fn every_golden_case_belongs_to_a_tested_family() {
    let known = [
        "elementwise",
        "reduce",
        "shape_index",
        "nn",
        "quant",
        "random",
        "linalg",
        "transforms",
    ];
    let m = manifest();
    let mut per_file: BTreeMap<String, usize> = BTreeMap::new();
    for c in &m.cases {
        *per_file
            .entry(c["file"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    for f in per_file.keys() {
        assert!(known.contains(&f.as_str()), "golden file {f} has no test");
    }
    assert!(m.cases.len() > 500, "only {} golden cases", m.cases.len());
}

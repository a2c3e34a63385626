//! Helpers shared by the mlx-quant tests.
#![allow(dead_code)]
use mlx_array::quant::QuantMode;
use mlx_array::{Array, Dtype};
use mlx_quant::{ConvertOptions, Recipe};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh, empty temporary directory for one test.
pub fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let d = std::env::temp_dir().join(format!("mlxq-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Copies a committed golden checkpoint (`goldens/models/<name>`) into `dest`, with the
/// generation config the oracle's `prepare` writes.
pub fn golden_source(name: &str, dest: &Path) {
    let src = root().join("goldens/models").join(name);
    std::fs::create_dir_all(dest).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let n = e.file_name();
        if n != "oracle.safetensors" {
            std::fs::copy(e.path(), dest.join(&n)).unwrap();
        }
    }
    std::fs::write(
        dest.join("generation_config.json"),
        r#"{"eos_token_id": 2, "bos_token_id": 1}"#,
    )
    .unwrap();
}

/// `ConvertOptions` from mlx_lm.convert CLI flags.
pub fn options(src: &Path, out: &Path, flags: &[&str]) -> ConvertOptions {
    let mut o = ConvertOptions {
        hf_path: src.to_string_lossy().into_owned(),
        mlx_path: out.to_path_buf(),
        ..Default::default()
    };
    let mut it = flags.iter();
    while let Some(f) = it.next() {
        let mut val = || it.next().copied().unwrap();
        match *f {
            "-q" => o.quantize = true,
            "-d" => o.dequantize = true,
            "--q-bits" => o.q_bits = Some(val().parse().unwrap()),
            "--q-group-size" => o.q_group_size = Some(val().parse().unwrap()),
            "--q-mode" => o.q_mode = QuantMode::parse(val()).unwrap(),
            "--quant-predicate" => o.quant_predicate = Some(Recipe::parse(val()).unwrap()),
            "--dtype" => o.dtype = Dtype::from_name(val()),
            other => panic!("unknown flag {other}"),
        }
    }
    o
}

/// Every tensor of a model directory.
pub fn tensors(dir: &Path) -> BTreeMap<String, Array> {
    let mut all = BTreeMap::new();
    for f in mlx_models::loader::weight_files(dir).unwrap() {
        all.extend(mlx_array::io::load_safetensors(&f).unwrap().0);
    }
    all
}

/// Parsed JSON file.
pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A JSON array of equal-length token rows as `(rows, [n, length] int32 array)`.
pub fn token_rows(v: &serde_json::Value) -> (Vec<Vec<i32>>, Array) {
    let rows: Vec<Vec<i32>> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap() as i32)
                .collect()
        })
        .collect();
    let (n, len) = (rows.len() as i32, rows[0].len() as i32);
    let data = Array::from_slice(&rows.concat(), &[n, len]).unwrap();
    (rows, data)
}

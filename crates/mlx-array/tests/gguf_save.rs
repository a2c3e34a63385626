#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! `io::save_gguf`: what it writes reads back through MLX's own loader (tensors, numeric
//! and string metadata, lists of strings with non-ASCII text), the same entries in the
//! same order give the same bytes, and what MLX cannot write is an error naming it.
use mlx_array::io::{self, GgufValue};
use mlx_array::{Array, Dtype};
use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-array-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

type Arrays = Vec<(String, Array)>;
type Meta = Vec<(String, GgufValue)>;

fn entries() -> (Arrays, Meta) {
    let w = Array::from_slice(&[1.5f32, -2.0, 3.25, 4.0, 0.5, 6.0], &[2, 3]).unwrap();
    let h = Array::from_slice(&[7i32, 8, 9], &[3]).unwrap();
    let arrays = vec![("blk.0.w".to_string(), w), ("b".to_string(), h)];
    let meta = vec![
        (
            "general.name".to_string(),
            GgufValue::String("tiny ü".into()),
        ),
        (
            "n".to_string(),
            GgufValue::Array(Array::scalar_i64(32, Dtype::Uint32).unwrap()),
        ),
        (
            "scores".to_string(),
            GgufValue::Array(Array::from_slice(&[-1000f32, 0.25], &[2]).unwrap()),
        ),
        (
            "tokens".to_string(),
            GgufValue::Strings(vec!["<s>".into(), "Ġthe".into(), "▁é".into()]),
        ),
    ];
    (arrays, meta)
}

fn save(path: &std::path::Path, arrays: &[(String, Array)], meta: &[(String, GgufValue)]) {
    io::save_gguf(
        path,
        arrays.iter().map(|(k, a)| (k.as_str(), a)),
        meta.iter().map(|(k, v)| (k.as_str(), v)),
    )
    .unwrap();
}

#[test]
fn saved_gguf_reads_back_and_is_deterministic() {
    let (arrays, meta) = entries();
    let (p1, p2) = (temp("a.gguf"), temp("b.gguf"));
    save(&p1, &arrays, &meta);
    save(&p2, &arrays, &meta);
    assert_eq!(std::fs::read(&p1).unwrap(), std::fs::read(&p2).unwrap());

    let (back, md) = io::load_gguf(&p1).unwrap();
    for (k, a) in &arrays {
        let b = &back[k];
        assert_eq!((b.shape(), b.dtype()), (a.shape(), a.dtype()), "{k}");
        assert_eq!(b.to_bytes().unwrap(), a.to_bytes().unwrap(), "{k}");
    }
    match &md["general.name"] {
        GgufValue::String(s) => assert_eq!(s, "tiny ü"),
        v => panic!("general.name: {v:?}"),
    }
    match &md["tokens"] {
        GgufValue::Strings(v) => assert_eq!(v, &["<s>", "Ġthe", "▁é"]),
        v => panic!("tokens: {v:?}"),
    }
    match &md["n"] {
        GgufValue::Array(a) => {
            assert_eq!(a.dtype(), Dtype::Uint32);
            assert_eq!(a.item::<u32>().unwrap(), 32);
        }
        v => panic!("n: {v:?}"),
    }
    match &md["scores"] {
        GgufValue::Array(a) => assert_eq!(a.to_vec::<f32>().unwrap(), vec![-1000.0, 0.25]),
        v => panic!("scores: {v:?}"),
    }
}

#[test]
fn unwritable_values_are_errors_naming_them() {
    let (arrays, _) = entries();
    let none = [("general.empty".to_string(), GgufValue::None)];
    let e = io::save_gguf(
        temp("none.gguf"),
        arrays.iter().map(|(k, a)| (k.as_str(), a)),
        none.iter().map(|(k, v)| (k.as_str(), v)),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("general.empty"), "{e}");

    let bf = Array::from_slice(&[1f32, 2.0], &[2])
        .unwrap()
        .astype(Dtype::Bfloat16)
        .unwrap();
    let e = io::save_gguf(temp("bf16.gguf"), [("w", &bf)], [])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bfloat16") && e.contains("not supported"), "{e}");
    // The process keeps working.
    let (arrays, meta) = entries();
    save(&temp("after.gguf"), &arrays, &meta);
}

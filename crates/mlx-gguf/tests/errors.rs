//! Bad inputs give errors that name the problem, never panics.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_gguf::{import_gguf, GgufError, GgufHeader, ImportOptions};

fn import(gguf: &std::path::Path, tmp: &TempDir) -> Result<mlx_gguf::ImportReport, GgufError> {
    import_gguf(gguf, &tmp.path().join("out"), &ImportOptions::default())
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let tmp = TempDir::new("missing");
    let p = tmp.path().join("nope.gguf");
    let e = import(&p, &tmp).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("nope.gguf"), "{e}");
    assert!(!tmp.path().join("out").exists());
}

#[test]
fn non_gguf_file_is_rejected_by_magic() {
    let tmp = TempDir::new("magic");
    let p = tmp.path().join("x.gguf");
    std::fs::write(&p, b"PK\x03\x04 not a gguf at all").unwrap();
    let e = import(&p, &tmp).unwrap_err();
    assert!(matches!(e, GgufError::NotGguf { .. }), "{e:?}");
}

#[test]
fn truncated_file_is_reported_at_every_cut() {
    let tmp = TempDir::new("trunc");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, Some(0));
    let bytes = std::fs::read(&gguf).unwrap();
    let cut = tmp.path().join("cut.gguf");
    // Inside the header, inside the token list, and inside the tensor data.
    for n in [2, 10, 30, 200, 3000, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&cut, &bytes[..n]).unwrap();
        let e = import(&cut, &tmp).unwrap_err();
        assert!(
            matches!(e, GgufError::Truncated { .. }),
            "cut at {n}: {e:?}"
        );
        assert!(e.to_string().contains("truncated"), "{e}");
    }
    let e = GgufHeader::read(&{
        std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
        cut.clone()
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("output.weight"),
        "the last tensor is the one cut off: {e}"
    );
}

#[test]
fn unsupported_tensor_type_names_the_tensor_and_type() {
    let tmp = TempDir::new("q5k");
    let mut tensors: Vec<Tensor> = tiny_llama_weights(8, None).iter().map(encode).collect();
    // Replace one tensor by an IQ4_XS block (256 elements, 136 bytes): not decodable here.
    tensors[1] = Tensor {
        name: "blk.0.attn_norm.weight".into(),
        dims: vec![256],
        ggml_type: 23,
        data: vec![0; 136],
    };
    let p = tmp.path().join("q5k.gguf");
    std::fs::write(&p, gguf_bytes(&tiny_llama_kvs("llama"), &tensors)).unwrap();
    let e = import(&p, &tmp).unwrap_err();
    match &e {
        GgufError::UnsupportedTensorType { tensor, type_name } => {
            assert_eq!(tensor, "blk.0.attn_norm.weight");
            assert_eq!(type_name, "IQ4_XS");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string().contains("IQ4_XS") && e.to_string().contains("Q4_K"),
        "{e}"
    );
}

#[test]
fn dequantized_types_are_refused_when_not_allowed() {
    let tmp = TempDir::new("q4k");
    let mut tensors: Vec<Tensor> = tiny_llama_weights(8, None).iter().map(encode).collect();
    tensors[1] = Tensor {
        name: "blk.0.attn_norm.weight".into(),
        dims: vec![256],
        ggml_type: 14,
        data: vec![0; 210],
    };
    let p = tmp.path().join("q4k.gguf");
    std::fs::write(&p, gguf_bytes(&tiny_llama_kvs("llama"), &tensors)).unwrap();
    let opts = ImportOptions {
        allow_dequantize: false,
        ..Default::default()
    };
    let e = import_gguf(&p, &tmp.path().join("out"), &opts).unwrap_err();
    assert!(
        matches!(&e, GgufError::DequantizeRefused { tensor, type_name } if tensor == "blk.0.attn_norm.weight" && type_name == "Q6_K"),
        "{e:?}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let tmp = TempDir::new("arch");
    let tensors: Vec<Tensor> = tiny_llama_weights(8, None).iter().map(encode).collect();
    let mut kvs = tiny_llama_kvs("gemma2");
    kvs.retain(|(k, _)| !k.starts_with("gemma2."));
    let p = tmp.path().join("g.gguf");
    std::fs::write(&p, gguf_bytes(&kvs, &tensors)).unwrap();
    let e = import(&p, &tmp).unwrap_err();
    assert!(
        matches!(&e, GgufError::UnsupportedArchitecture { arch, .. } if arch == "gemma2"),
        "{e:?}"
    );
}

#[test]
fn missing_hyperparameter_is_named() {
    let tmp = TempDir::new("hp");
    let tensors: Vec<Tensor> = tiny_llama_weights(8, None).iter().map(encode).collect();
    let mut kvs = tiny_llama_kvs("llama");
    kvs.retain(|(k, _)| *k != "llama.attention.head_count");
    let p = tmp.path().join("h.gguf");
    std::fs::write(&p, gguf_bytes(&kvs, &tensors)).unwrap();
    let e = import(&p, &tmp).unwrap_err();
    assert!(
        matches!(&e, GgufError::MissingMetadata { key } if key == "llama.attention.head_count"),
        "{e:?}"
    );
}

#[test]
fn unknown_tensor_name_is_named() {
    let tmp = TempDir::new("name");
    let mut tensors: Vec<Tensor> = tiny_llama_weights(8, None).iter().map(encode).collect();
    tensors[1].name = "blk.0.mystery.weight".into();
    let p = tmp.path().join("n.gguf");
    std::fs::write(&p, gguf_bytes(&tiny_llama_kvs("llama"), &tensors)).unwrap();
    let e = import(&p, &tmp).unwrap_err();
    assert!(
        matches!(&e, GgufError::UnknownTensor { tensor, .. } if tensor == "blk.0.mystery.weight"),
        "{e:?}"
    );
}

#[test]
fn unknown_tokenizer_model_is_reported_unsupported() {
    let tmp = TempDir::new("spm");
    let tensors: Vec<Tensor> = tiny_llama_weights(8, None).iter().map(encode).collect();
    let mut kvs = tiny_llama_kvs("llama");
    for (k, v) in kvs.iter_mut() {
        if *k == "tokenizer.ggml.model" {
            *v = Kv::Str("bert".into());
        }
    }
    let p = tmp.path().join("s.gguf");
    std::fs::write(&p, gguf_bytes(&kvs, &tensors)).unwrap();
    let e = import(&p, &tmp).unwrap_err();
    assert!(
        matches!(e, GgufError::Tokenizer(_)) && e.to_string().contains("`bert`"),
        "{e}"
    );
}

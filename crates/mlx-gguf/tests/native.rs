//! The Rust block decoder against llama.cpp's reference values (goldens/gguf/blocks.json,
//! from the `gguf` package) and against MLX's own loader.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::*;
use mlx_array::quant::{dequantize, QuantMode};
use mlx_array::Dtype;
use mlx_gguf::native::{dequantize_bytes, form, load_tensors, Form};
use mlx_gguf::{GgmlType, GgufHeader};

fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
        / scale
}

#[test]
fn block_decoder_matches_llama_cpp_reference_for_every_type() {
    let goldens = goldens();
    assert_eq!(goldens.len(), 10);
    for g in &goldens {
        let got = dequantize_bytes(GgmlType(g.ggml_type), &g.bytes).unwrap();
        let d = max_rel_diff(&got, &g.values);
        assert!(d < 1e-6, "{}: relative max diff {d}", g.name);
    }
}

#[test]
fn decoded_arrays_hold_the_reference_values() {
    let tmp = TempDir::new("native");
    let goldens = goldens();
    let tensors: Vec<Tensor> = goldens
        .iter()
        .map(|g| Tensor {
            name: format!("{}.weight", g.name),
            dims: vec![256, 2],
            ggml_type: g.ggml_type,
            data: g.bytes.clone(),
        })
        .collect();
    let path = tmp.path().join("blocks.gguf");
    std::fs::write(
        &path,
        gguf_bytes(
            &[("general.architecture", Kv::Str("llama".into()))],
            &tensors,
        ),
    )
    .unwrap();
    let arrays = load_tensors(&GgufHeader::read(&path).unwrap()).unwrap();
    for g in &goldens {
        let w = &arrays[&format!("{}.weight", g.name)];
        let values = match form(GgmlType(g.ggml_type)).unwrap() {
            Form::Affine { bits, group_size } => {
                assert_eq!(w.dtype(), Dtype::Uint32, "{}", g.name);
                assert_eq!(w.shape(), vec![2, 256 * bits / 32], "{}", g.name);
                let scales = &arrays[&format!("{}.scales", g.name)];
                let biases = &arrays[&format!("{}.biases", g.name)];
                assert_eq!(scales.shape(), vec![2, 256 / group_size], "{}", g.name);
                dequantize(
                    w,
                    scales,
                    Some(biases),
                    Some(group_size),
                    Some(bits),
                    QuantMode::Affine,
                    Some(Dtype::Float32),
                )
                .unwrap()
            }
            Form::Dequantized => {
                assert_eq!(w.dtype(), Dtype::Float16, "{}", g.name);
                w.astype(Dtype::Float32).unwrap()
            }
            Form::Plain(_) => unreachable!(),
        };
        let got = values.reshape(&[-1]).unwrap().to_vec::<f32>().unwrap();
        // Scales and biases are float16 in the output.
        let d = max_rel_diff(&got, &g.values);
        assert!(d < 2e-3, "{}: relative max diff {d}", g.name);
    }
}

#[test]
fn decoder_equals_mlx_loader_bit_for_bit_where_mlx_is_exact() {
    let tmp = TempDir::new("vs-mlx");
    let (gguf, _) = write_tiny_llama(tmp.path(), 8, Some(1));
    let header = GgufHeader::read(&gguf).unwrap();
    assert!(header
        .tensors
        .iter()
        .all(|t| t.ggml_type.mlx_loads_exactly()));
    let ours = load_tensors(&header).unwrap();
    let (mlx, _) = mlx_array::io::load_gguf(&gguf).unwrap();
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        mlx.keys().collect::<Vec<_>>()
    );
    for (k, a) in &ours {
        let b = &mlx[k];
        assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{k}");
        assert!(
            a.array_equal(b, false).unwrap().item::<bool>().unwrap(),
            "{k} differs from MLX's loader"
        );
    }
}

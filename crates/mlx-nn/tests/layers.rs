//! Layers against direct computations.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::quant::{dequantize, quantize, QuantMode};
use mlx_array::{fast, random, Array, Dtype};
use mlx_nn::attention::quantized_sdpa;
use mlx_nn::{
    initialize_rope, AttnMask, Embedding, KvFetch, Linear, LinearLayer, Module, Param, QuantSpec,
    Quantizable, Rope, RopeScaling, SwitchGlu,
};

fn randn(shape: &[i32], seed: u64) -> Array {
    let k = random::key(seed).unwrap();
    random::normal(shape, Dtype::Float32, None, None, Some(&k)).unwrap()
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    a.subtract(b)
        .unwrap()
        .abs()
        .unwrap()
        .max(None, false)
        .unwrap()
        .item::<f32>()
        .unwrap()
}

#[test]
fn linear_is_x_times_w_transposed_plus_bias() {
    let w = Array::from_slice(&[1f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let b = Array::from_slice(&[0.5f32, -1.0, 0.0], &[3]).unwrap();
    let l = Linear::from_weights(w, Some(b));
    let x = Array::from_slice(&[1f32, 1.0], &[1, 2]).unwrap();
    assert_eq!(
        l.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        [3.5, 6.0, 11.0]
    );
}

#[test]
fn embedding_rows_and_tied_head() {
    let w = Array::from_slice(&[1f32, 0.0, 0.0, 1.0, 2.0, 2.0], &[3, 2]).unwrap();
    let e = Embedding {
        weight: Param::new(w),
    };
    let ids = Array::from_slice(&[2i32, 0], &[1, 2]).unwrap();
    let rows = e.forward(&ids).unwrap();
    assert_eq!(rows.shape(), [1, 2, 2]);
    assert_eq!(rows.to_vec::<f32>().unwrap(), [2.0, 2.0, 1.0, 0.0]);
    let logits = e.as_linear(&rows).unwrap();
    assert_eq!(
        logits.to_vec::<f32>().unwrap(),
        [2.0, 2.0, 8.0, 1.0, 0.0, 2.0]
    );
}

#[test]
fn quantized_linear_matches_the_dequantized_matmul() {
    for mode in [QuantMode::Affine, QuantMode::Mxfp4, QuantMode::Mxfp8] {
        let mut l = LinearLayer::Dense(Linear::from_weights(randn(&[16, 64], 1), None));
        let spec = QuantSpec::new(None, None, mode);
        l.quantize(spec).unwrap();
        assert_eq!(l.quant_spec(), Some(spec));
        assert_eq!(l.dense_weight_shape(), [16, 64]);
        let x = randn(&[2, 64], 2);
        let y = l.forward(&x).unwrap();
        l.dequantize(None).unwrap();
        assert!(l.quant_spec().is_none());
        let names: Vec<String> = l.parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight"]);
        let d = max_diff(&y, &l.forward(&x).unwrap());
        assert!(d < 1e-3, "{mode:?}: {d}");
    }
}

#[test]
fn default_rope_is_mx_fast_rope() {
    let x = randn(&[1, 2, 5, 8], 3);
    let r = initialize_rope(8, 10000.0, false, None, None).unwrap();
    let want = fast::rope(
        &x,
        8,
        false,
        Some(10000.0),
        1.0,
        fast::RopeOffset::Int(3),
        None,
    )
    .unwrap();
    assert_eq!(
        r.forward(&x, 3).unwrap().to_bytes().unwrap(),
        want.to_bytes().unwrap()
    );
}

#[test]
fn linear_rope_scaling_divides_positions_by_the_factor() {
    let cfg = RopeScaling {
        rope_type: "linear".into(),
        factor: Some(4.0),
        ..Default::default()
    };
    match initialize_rope(8, 10000.0, false, Some(&cfg), None).unwrap() {
        Rope::Default { scale, .. } => assert_eq!(scale, 0.25),
        other => panic!("{other:?}"),
    }
}

#[test]
fn proportional_rope_leaves_the_unrotated_features_alone() {
    let cfg = RopeScaling {
        rope_type: "proportional".into(),
        partial_rotary_factor: Some(0.5),
        ..Default::default()
    };
    let r = initialize_rope(8, 10000.0, false, Some(&cfg), None).unwrap();
    let x = randn(&[1, 1, 3, 8], 4);
    let y = r.forward(&x, 5).unwrap();
    // Infinite frequencies past the rotated half: those features are unchanged.
    let tail = |a: &Array| {
        a.take(&Array::from_slice(&[2i32, 3, 6, 7], &[4]).unwrap(), Some(3))
            .unwrap()
    };
    assert_eq!(tail(&y).to_bytes().unwrap(), tail(&x).to_bytes().unwrap());
}

#[test]
fn rope_config_errors_name_the_problem() {
    let bad = RopeScaling {
        rope_type: "spiral".into(),
        ..Default::default()
    };
    let e = initialize_rope(8, 1e4, false, Some(&bad), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("spiral"), "{e}");
    let no_factor = RopeScaling {
        rope_type: "llama3".into(),
        ..Default::default()
    };
    let e = initialize_rope(8, 1e4, false, Some(&no_factor), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("factor") && e.contains("llama3"), "{e}");
}

#[test]
fn quantized_sdpa_is_close_to_attention_on_dequantized_keys() {
    let q = randn(&[1, 4, 3, 32], 5);
    let k = randn(&[1, 2, 7, 32], 6);
    let v = randn(&[1, 2, 7, 32], 7);
    let pack = |a: &Array| {
        let p = quantize(a, Some(32), Some(8), QuantMode::Affine).unwrap();
        (p.weight, p.scales, p.biases.unwrap())
    };
    let (qk, qv) = (pack(&k), pack(&v));
    let deq = |t: &(Array, Array, Array)| {
        dequantize(
            &t.0,
            &t.1,
            Some(&t.2),
            Some(32),
            Some(8),
            QuantMode::Affine,
            None,
        )
        .unwrap()
    };
    let fetch = KvFetch::Quantized {
        keys: qk.clone(),
        values: qv.clone(),
        group_size: 32,
        bits: 8,
    };
    for mask in [AttnMask::None, AttnMask::Causal] {
        let got = mlx_nn::scaled_dot_product_attention(&q, &fetch, 0.2, &mask, None).unwrap();
        let sm = match mask {
            AttnMask::Causal => fast::SdpaMask::Causal,
            _ => fast::SdpaMask::None,
        };
        let want =
            fast::scaled_dot_product_attention(&q, &deq(&qk), &deq(&qv), 0.2, sm, None).unwrap();
        assert_eq!(got.shape(), [1, 4, 3, 32]);
        assert!(max_diff(&got, &want) < 1e-4, "{}", max_diff(&got, &want));
    }
    let direct = quantized_sdpa(&q, &qk, &qv, 0.2, &AttnMask::None, 32, 8).unwrap();
    assert_eq!(direct.shape(), [1, 4, 3, 32]);
}

#[test]
fn switch_glu_sorted_path_matches_per_token_experts() {
    let mut glu = SwitchGlu::new(8, 16, 4, false).unwrap();
    let shapes = glu.parameter_shapes();
    let w = shapes
        .iter()
        .enumerate()
        .map(|(i, (n, s))| (n.clone(), randn(s, 10 + i as u64)))
        .collect();
    glu.load_weights(w, true).unwrap();
    // 40 tokens x top-2 = 80 >= 64 slots: the sorted gather path.
    let x = randn(&[1, 40, 8], 20);
    let idx: Vec<i32> = (0..80).map(|i| i * 7 % 4).collect();
    let idx = Array::from_slice(&idx, &[1, 40, 2]).unwrap();
    let y = glu.forward(&x, &idx).unwrap();
    assert_eq!(y.shape(), [1, 40, 2, 8]);
    // Token by token (2 slots each: the unsorted path) gives the same values.
    for t in [0, 17, 39] {
        let xt = x.slice_axis(1, t, t + 1).unwrap();
        let it = idx.slice_axis(1, t, t + 1).unwrap();
        let yt = glu.forward(&xt, &it).unwrap();
        let d = max_diff(&yt, &y.slice_axis(1, t, t + 1).unwrap());
        assert!(d < 1e-5, "token {t}: {d}");
    }
}

/// Precomputed RoPE frequencies hold data as soon as the layer is built: a lazy array
/// belongs to the thread that made it, and MLX's GPU backend cannot evaluate it from
/// another one (the server runs the model on its engine thread). The CPU backend does
/// not mind, so this checks the array itself.
#[test]
fn precomputed_rope_frequencies_are_evaluated_when_built() {
    let configs = [
        RopeScaling {
            rope_type: "llama3".into(),
            factor: Some(8.0),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
            original_max_position_embeddings: Some(8192.0),
            ..Default::default()
        },
        RopeScaling {
            rope_type: "yarn".into(),
            factor: Some(4.0),
            original_max_position_embeddings: Some(4096.0),
            ..Default::default()
        },
        RopeScaling {
            rope_type: "longrope".into(),
            short_factor: Some(vec![1.0; 4]),
            long_factor: Some(vec![2.0; 4]),
            original_max_position_embeddings: Some(4096.0),
            ..Default::default()
        },
        RopeScaling {
            rope_type: "proportional".into(),
            partial_rotary_factor: Some(0.5),
            ..Default::default()
        },
    ];
    for cfg in &configs {
        match initialize_rope(8, 10000.0, false, Some(cfg), Some(131072)).unwrap() {
            Rope::Freqs { freqs, .. } => {
                assert!(freqs.is_available(), "{}: lazy frequencies", cfg.rope_type)
            }
            other => panic!("{}: {other:?}", cfg.rope_type),
        }
    }
}

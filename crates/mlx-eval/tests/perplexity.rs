//! Perplexity against mlx-lm's: for the committed tiny models and datasets, the
//! sequences `load_data` cuts and the perplexity `eval_ppl` reports equal those of
//! mlx-lm 0.32.2's `load_data` / `eval_ppl` bit for bit
//! (`goldens/perplexity/expected.json`, written by `xtask/py/perplexity_goldens.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_eval::{datasets, eval_ppl, load_data, EvalError, Features, RandomState};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../goldens")
}

#[test]
fn data_and_perplexity_equal_mlx_lm() {
    let root = goldens();
    let text = std::fs::read_to_string(root.join("perplexity/expected.json")).unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 5);
    for c in &cases {
        let name = format!(
            "{}/{}",
            c["model"].as_str().unwrap(),
            c["data"].as_str().unwrap()
        );
        let dir = root
            .join("generate/models")
            .join(c["model"].as_str().unwrap());
        // Quantized stays quantized: mlx-lm's arithmetic.
        let (model, _) = mlx_models::load_model(&dir).unwrap();
        let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).unwrap();
        let ds = datasets::load_split(
            &root.join("perplexity").join(c["data"].as_str().unwrap()),
            "train",
            &Features::default(),
            false,
        )
        .unwrap();
        let mut rng = RandomState::new(c["seed"].as_u64().unwrap() as u32);
        let data = load_data(
            &tok,
            &ds,
            c["num_samples"].as_i64().unwrap(),
            c["sequence_length"].as_u64().unwrap() as usize,
            &mut rng,
        )
        .unwrap();
        let want: Vec<Vec<i64>> = serde_json::from_value(c["tokens"].clone()).unwrap();
        let got: Vec<i64> = data
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        let width = want[0].len();
        assert_eq!(
            data.shape(),
            vec![want.len() as i32, width as i32],
            "{name}"
        );
        assert_eq!(got, want.concat(), "{name}: tokens");

        let mut calls = Vec::new();
        let r = eval_ppl(
            model.as_ref(),
            &data,
            c["batch_size"].as_u64().unwrap() as usize,
            |i, n| calls.push((i, n)),
        )
        .unwrap();
        let expect = |k: &str| c[k].as_str().unwrap().parse::<f64>().unwrap();
        assert_eq!(
            r.ppl.to_bits(),
            expect("ppl").to_bits(),
            "{name}: {} vs {}",
            r.ppl,
            expect("ppl")
        );
        assert_eq!(
            r.standard_error.to_bits(),
            expect("se").to_bits(),
            "{name}: se"
        );
        assert_eq!(r.tokens, want.len() * (width - 1));
        let batches = want
            .len()
            .div_ceil(c["batch_size"].as_u64().unwrap() as usize);
        assert_eq!(
            calls,
            (1..=batches).map(|i| (i, batches)).collect::<Vec<_>>()
        );
    }
}

#[test]
fn losses_are_the_next_token_negative_log_likelihood() {
    // Independent of mlx-lm: the mean of -log softmax(logits)[next token], by hand.
    let root = goldens();
    let dir = root.join("generate/models/llama-small-f32");
    let (model, _) = mlx_models::load_model(&dir).unwrap();
    let tokens: Vec<i32> = (0..18).map(|i| (i * 7 + 3) % 50).collect();
    let data = mlx_array::Array::from_slice(&tokens, &[2, 9]).unwrap();
    let r = eval_ppl(model.as_ref(), &data, 1, |_, _| {}).unwrap();
    let logits = model
        .forward(&data.slice(&[0, 0], &[2, 8], None).unwrap(), &mut [])
        .unwrap()
        .astype(mlx_array::Dtype::Float32)
        .unwrap();
    let v = logits.dim(2).unwrap() as usize;
    let l: Vec<f32> = logits.to_vec().unwrap();
    let mut losses = Vec::new();
    for b in 0..2 {
        for t in 0..8 {
            let row = &l[(b * 8 + t) * v..(b * 8 + t + 1) * v];
            let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            losses.push(lse - row[tokens[b * 9 + t + 1] as usize] as f64);
        }
    }
    let mean = losses.iter().sum::<f64>() / losses.len() as f64;
    let var = losses.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (losses.len() - 1) as f64;
    assert_eq!(r.tokens, 16);
    assert!(
        (f64::from(r.mean_loss) - mean).abs() < 1e-5,
        "{} vs {mean}",
        r.mean_loss
    );
    assert!((r.ppl - mean.exp()).abs() / mean.exp() < 1e-5);
    assert!((f64::from(r.std_dev) - var.sqrt()).abs() < 1e-4);
    let se = mean.exp() * var.sqrt() / 16f64.sqrt();
    assert!((r.standard_error - se).abs() / se < 1e-4);
}

#[test]
fn bad_arguments_are_errors() {
    let root = goldens();
    let dir = root.join("generate/models/llama-small-f32");
    let (model, _) = mlx_models::load_model(&dir).unwrap();
    let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let data = mlx_array::Array::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let e = eval_ppl(model.as_ref(), &data, 0, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("--batch-size"), "{e}");
    let flat = mlx_array::Array::from_slice(&[1i32, 2, 3, 4], &[4]).unwrap();
    assert!(matches!(
        eval_ppl(model.as_ref(), &flat, 1, |_, _| {}),
        Err(EvalError::Invalid(_))
    ));
    let ds = datasets::load_split(
        &root.join("perplexity/text"),
        "train",
        &Features::default(),
        false,
    )
    .unwrap();
    let mut rng = RandomState::new(0);
    let e = load_data(&tok, &ds, 4, 1, &mut rng).unwrap_err();
    assert!(e.to_string().contains("--sequence-length"), "{e}");
    let e = load_data(&tok, &ds, 4, 1_000_000, &mut rng).unwrap_err();
    assert!(e.to_string().contains("fewer than one sequence"), "{e}");
    // More samples than the rows give: every sequence there is.
    let all = load_data(&tok, &ds, 100_000, 16, &mut RandomState::new(0)).unwrap();
    let every = load_data(&tok, &ds, -1, 16, &mut RandomState::new(0)).unwrap();
    assert_eq!(all.shape(), every.shape());
    assert!(all.shape()[0] > 10);
}

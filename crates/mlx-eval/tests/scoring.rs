//! lm-evaluation-harness scoring against live mlx-lm: `_score_fn` (several step sizes,
//! a padded batch), `loglikelihood` (shared contexts, one-token continuations, an empty
//! context, truncation by `max_tokens`) and `loglikelihood_rolling` equal mlx-lm
//! 0.32.2's `MLXLM` methods bit for bit, and greedy `generate_until` gives its texts (`xtask/py/eval_scores_oracle.py`, run with
//! `$MLX_PYTHON`, else `.venv/bin/python`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_eval::scoring::{loglikelihood, loglikelihood_rolling, score};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> String {
    std::env::var("MLX_PYTHON")
        .unwrap_or_else(|_| root().join(".venv/bin/python").display().to_string())
}

fn oracle(case: &Value) -> Value {
    let mut child = Command::new(python())
        .arg(root().join("xtask/py/eval_scores_oracle.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Python oracle (set MLX_PYTHON to the .venv's python)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(case.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn float(v: &Value) -> f64 {
    match v.as_str().unwrap() {
        "-inf" => f64::NEG_INFINITY,
        "inf" => f64::INFINITY,
        s => s.parse().unwrap(),
    }
}

fn check(model_name: &str, max_tokens: Option<usize>, step_size: usize) {
    let dir = root().join("goldens/generate/models").join(model_name);
    let seqs: Vec<Vec<u32>> = vec![
        vec![1, 5, 9, 13, 2, 40, 41, 7],
        vec![1, 7, 3],
        vec![3, 3, 3, 3, 3],
    ];
    let ll: Vec<(String, String)> = [
        ("The cat", " sat"),
        ("The cat", " ran away quickly"),
        ("The cat", "s"),
        ("", "Hello there"),
        ("Question: what is two plus two?\nAnswer:", " four"),
        ("Question: what is two plus two?\nAnswer:", " 4, of course"),
        ("A", " b c d e f g h i j k l m n o p"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let rolling: Vec<String> = vec![
        "hello world, this is a longer text to score as a whole".into(),
        "a b".into(),
        "x".into(),
        "The quick brown fox jumps over the lazy dog.".into(),
    ];
    let want = oracle(&json!({
        "model": dir,
        "chat": false,
        "max_tokens": max_tokens,
        "batch_size": 3,
        "score": seqs,
        "step_size": step_size,
        "loglikelihood": ll.iter().map(|(a, b)| vec![a, b]).collect::<Vec<_>>(),
        "rolling": rolling,
    }));

    let (model, _) = mlx_models::load_model(&dir).unwrap();
    let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).unwrap();

    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let s = score(model.as_ref(), &refs, None, step_size).unwrap();
    let got: Vec<f32> = s.scores.to_vec().unwrap();
    let width = s.scores.dim(1).unwrap() as usize;
    let want_rows = want["score"]["scores"].as_array().unwrap();
    assert_eq!(
        want_rows.len() * width,
        got.len(),
        "{model_name}: score shape"
    );
    for (r, row) in want_rows.iter().enumerate() {
        for (c, v) in row.as_array().unwrap().iter().enumerate() {
            let w = float(v) as f32;
            let g = got[r * width + c];
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{model_name}: score[{r}][{c}] {g} vs {w}"
            );
        }
    }
    let ig: Vec<bool> = s.is_greedy.to_vec().unwrap();
    let want_ig: Vec<bool> =
        serde_json::from_value::<Vec<Vec<bool>>>(want["score"]["is_greedy"].clone())
            .unwrap()
            .concat();
    assert_eq!(ig, want_ig, "{model_name}: is_greedy");

    let got = loglikelihood(model.as_ref(), &tok, &ll, max_tokens, true).unwrap();
    let want_ll = want["loglikelihood"].as_array().unwrap();
    assert_eq!(got.len(), want_ll.len());
    for (i, ((g, gg), w)) in got.iter().zip(want_ll).enumerate() {
        let wv = float(&w[0]);
        assert_eq!(
            g.to_bits(),
            wv.to_bits(),
            "{model_name}: loglikelihood[{i}] {g} vs {wv}"
        );
        assert_eq!(*gg, w[1].as_bool().unwrap(), "{model_name}: is_greedy[{i}]");
    }

    let got = loglikelihood_rolling(model.as_ref(), &tok, &rolling, 3, true).unwrap();
    let want_r = want["rolling"].as_array().unwrap();
    assert_eq!(got.len(), want_r.len());
    for (i, (g, w)) in got.iter().zip(want_r).enumerate() {
        let wv = float(w);
        assert_eq!(
            g.to_bits(),
            wv.to_bits(),
            "{model_name}: rolling[{i}] {g} vs {wv}"
        );
    }
}

#[test]
fn scores_equal_mlx_lm_llama_f32() {
    check("llama-small-f32", None, 2048);
}

#[test]
fn scores_equal_mlx_lm_chunked_and_truncated() {
    // Step size 3 exercises the chunked path; max_tokens 6 truncates the contexts (and
    // cuts one away entirely: -inf).
    check("llama-small-f32", Some(6), 3);
}

#[test]
fn scores_equal_mlx_lm_qwen3_bf16() {
    check("qwen3-small-bf16", None, 2048);
}

#[test]
fn scores_equal_mlx_lm_quantized() {
    check("llama-small-q4-g32", None, 4);
}

#[test]
fn scoring_refuses_bad_input() {
    let dir = root().join("goldens/generate/models/llama-small-f32");
    let (model, _) = mlx_models::load_model(&dir).unwrap();
    let one: &[u32] = &[1];
    assert!(score(model.as_ref(), &[one], None, 2048).is_err());
    assert!(score(model.as_ref(), &[], None, 2048).is_err());
    let two: &[u32] = &[1, 2];
    assert!(score(model.as_ref(), &[two], None, 0).is_err());
}

#[test]
fn generate_until_equals_mlx_lm_greedy() {
    let dir = root().join("goldens/generate/models/llama-small-f32");
    let reqs = vec![
        (
            json!("The cat"),
            json!({"until": ["\n\n"], "max_gen_toks": 12}),
        ),
        (
            json!("Once upon a time"),
            json!({"until": [" the"], "max_gen_toks": 20}),
        ),
        (
            json!("Q: 1 2 3\nA:"),
            json!({"until": ["\n", "."], "max_gen_toks": 8}),
        ),
    ];
    let want = oracle(&json!({
        "model": dir,
        "chat": false,
        "batch_size": 2,
        "generate": reqs.iter().map(|(c, k)| json!([c, k])).collect::<Vec<_>>(),
    }));
    let (model, _) = mlx_models::load_model(&dir).unwrap();
    let tok = mlx_tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let opts = mlx_eval::harness::HarnessOptions {
        python: String::new(),
        tasks: Vec::new(),
        num_shots: None,
        limit: None,
        seed: 123,
        fewshot_as_multiturn: false,
        use_chat_template: false,
        chat_template_args: Default::default(),
        confirm_run_unsafe_code: false,
        max_tokens: None,
        batch_size: 2,
        temp: 0.0,
        top_p: 1.0,
        top_k: 0,
        include_path: None,
        tokenizer_name: String::new(),
    };
    let mut slot = Some(model);
    let got = mlx_eval::harness::generate_until(&mut slot, &tok, &opts, &reqs).unwrap();
    assert!(slot.is_some(), "the model comes back after generating");
    let want: Vec<String> = serde_json::from_value(want["generate"].clone()).unwrap();
    assert_eq!(got, want);
    assert!(
        got.iter().any(|t| !t.is_empty()),
        "nothing generated: {got:?}"
    );
}

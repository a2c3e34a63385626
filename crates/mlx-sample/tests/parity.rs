//! Samplers and processors against mlx-lm's outputs (xtask/py/sample_oracle.py): the
//! same seed gives the same tokens, filters and processors the same bits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{io, random, Array};
use mlx_sample::{
    apply_min_p, apply_top_k, apply_top_p, apply_xtc, categorical_sampling, make_logits_processors,
    make_sampler, LogitsParams, SamplerParams,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn golden(name: &str) -> (BTreeMap<String, Array>, BTreeMap<String, String>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/sample")
        .join(name);
    io::load_safetensors(&path).unwrap_or_else(|e| {
        panic!("{e}: regenerate with `/work/venv/mlx/bin/python xtask/py/sample_oracle.py`")
    })
}

fn get<'a>(m: &'a BTreeMap<String, Array>, k: &str) -> &'a Array {
    m.get(k)
        .unwrap_or_else(|| panic!("golden tensor {k} missing"))
}

fn assert_bits_eq(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (
        got.to_bytes().expect("read"),
        want.to_bytes().expect("read"),
    );
    assert!(g == w, "{what}: values differ\n got: {got}\nwant: {want}");
}

fn f(v: &Value, k: &str, default: f64) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(default)
}

fn i(v: &Value, k: &str, default: i64) -> i32 {
    v.get(k).and_then(Value::as_i64).unwrap_or(default) as i32
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_i64)
                .map(|x| x as i32)
                .collect()
        })
        .unwrap_or_default()
}

fn sampler_params(p: &Value) -> SamplerParams {
    let d = SamplerParams::default();
    SamplerParams {
        temp: f(p, "temp", d.temp),
        top_p: f(p, "top_p", d.top_p),
        min_p: f(p, "min_p", d.min_p),
        min_tokens_to_keep: i(p, "min_tokens_to_keep", d.min_tokens_to_keep.into()),
        top_k: i(p, "top_k", d.top_k.into()),
        xtc_probability: f(p, "xtc_probability", d.xtc_probability),
        xtc_threshold: f(p, "xtc_threshold", d.xtc_threshold),
        xtc_special_tokens: ints(&p["xtc_special_tokens"]),
    }
}

#[test]
fn seeded_samplers_draw_the_same_tokens_as_mlx_lm() {
    let (arrays, meta) = golden("sampling.safetensors");
    let cases: Value = serde_json::from_str(&meta["cases"]).expect("cases json");
    let cases = cases.as_array().expect("list");
    assert!(cases.len() >= 60);
    for (c, case) in cases.iter().enumerate() {
        let lp = get(&arrays, &format!("logprobs.{}", case["input"]));
        let seed = case["seed"].as_u64().expect("seed");
        random::seed(seed).expect("seed");
        let sampler = make_sampler(&sampler_params(&case["params"])).expect("make_sampler");
        let toks: Vec<Array> = (0..case["steps"].as_i64().expect("steps"))
            .map(|_| sampler.sample(lp).expect("sample"))
            .collect();
        let refs: Vec<&Array> = toks.iter().collect();
        let got = mlx_array::stack(&refs, 0).expect("stack");
        assert_bits_eq(
            &got,
            get(&arrays, &format!("tokens.{c}")),
            &format!("case {c}: {case}"),
        );
    }
}

#[test]
fn sampling_steps_match_mlx_lm_bit_for_bit() {
    let (arrays, meta) = golden("sampling.safetensors");
    let filters: Value = serde_json::from_str(&meta["filters"]).expect("filters json");
    for (n, case) in filters.as_array().expect("list").iter().enumerate() {
        let lp = get(&arrays, &format!("logprobs.{}", case["input"]));
        random::seed(case["seed"].as_u64().expect("seed")).expect("seed");
        let c = &case["case"];
        let num = |k: usize| c[k].as_f64().expect("number");
        let got = match c[0].as_str().expect("kind") {
            "top_p" => apply_top_p(lp, num(1)),
            "min_p" => apply_min_p(lp, num(1), num(2) as i32),
            "top_k" => apply_top_k(lp, num(1) as i32),
            "xtc" => apply_xtc(lp, num(1), num(2), &ints(&c[3])),
            "categorical" => categorical_sampling(lp, num(1)),
            other => panic!("unknown filter {other}"),
        }
        .expect("filter");
        assert_bits_eq(
            &got,
            get(&arrays, &format!("filter.{n}")),
            &format!("filter {n}: {case}"),
        );
    }
}

fn logits_params(p: &Value) -> LogitsParams {
    let d = LogitsParams::default();
    let pen = |k: &str| p.get(k).and_then(Value::as_f64);
    LogitsParams {
        logit_bias: p["logit_bias"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|kv| {
                        (
                            kv[0].as_i64().expect("id") as i32,
                            kv[1].as_f64().expect("bias"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        repetition_penalty: pen("repetition_penalty"),
        repetition_context_size: i(
            p,
            "repetition_context_size",
            d.repetition_context_size.into(),
        ),
        presence_penalty: pen("presence_penalty"),
        presence_context_size: i(p, "presence_context_size", d.presence_context_size.into()),
        frequency_penalty: pen("frequency_penalty"),
        frequency_context_size: i(p, "frequency_context_size", d.frequency_context_size.into()),
    }
}

#[test]
fn logits_processors_match_mlx_lm_bit_for_bit() {
    let (arrays, meta) = golden("processors.safetensors");
    let cases: Value = serde_json::from_str(&meta["cases"]).expect("cases json");
    for (c, case) in cases.as_array().expect("list").iter().enumerate() {
        let mut procs = make_logits_processors(&logits_params(&case["params"])).expect("make");
        assert_eq!(
            procs.len() as i64,
            case["n_processors"].as_i64().expect("n"),
            "{case}"
        );
        let logits = get(&arrays, &format!("logits.{}", case["logits"]));
        let history = get(&arrays, &format!("history.{}", case["history"]));
        let got = procs
            .process_with_history(history, logits)
            .expect("process");
        assert_bits_eq(
            &got,
            get(&arrays, &format!("proc.{c}")),
            &format!("case {c}: {case}"),
        );
    }
}

//! `mlx-generate` against mlx-lm's recorded generations (goldens/generate/cases.json,
//! written by `xtask/py/gen_oracle.py goldens` from `mlx_lm generate` runs on tiny
//! models with a small byte-level BPE tokenizer): no Python needed.
//!
//! Two checks per case: the text the binary prints equals mlx-lm's stdout, and the
//! engine, given mlx-lm's prompt token ids and the same options, yields mlx-lm's token
//! ids.
mod common;

use mlx_bins::load::{load, LoadArgs};
use mlx_engine::{stream_generate, GenerateOptions, KvQuantization, PromptInput};
use serde_json::Value;

/// One recorded mlx-lm run.
struct Case {
    name: String,
    args: Vec<String>,
    ours_extra_args: Vec<String>,
    seeded: bool,
    stdout: String,
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    key_draws: usize,
}

fn cases() -> Vec<Case> {
    let path = common::goldens().join("cases.json");
    let text = std::fs::read_to_string(&path).expect("goldens/generate/cases.json");
    let v: Value = serde_json::from_str(&text).expect("cases.json is JSON");
    let strings = |x: &Value| -> Vec<String> {
        x.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let ids = |x: &Value| -> Vec<u32> {
        x.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_u64().map(|n| n as u32))
                    .collect()
            })
            .unwrap_or_default()
    };
    v.as_array()
        .expect("a list of cases")
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            args: strings(&c["args"]),
            ours_extra_args: strings(&c["ours_extra_args"]),
            seeded: c["seeded"].as_bool().unwrap_or(false),
            stdout: c["stdout"].as_str().unwrap_or_default().to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            tokens: ids(&c["tokens"]),
            key_draws: c["key_draws"].as_u64().unwrap_or(0) as usize,
        })
        .collect()
}

/// mlx-lm's BPE detokenizer prints the byte-level character of byte 0 ('Ā', U+0100)
/// instead of a NUL byte (`_decode_bytes` tests the decoded byte for truth).
fn prints_byte_zero_char(c: &Case) -> bool {
    c.stdout.contains('\u{100}')
}

/// Runs the binary for `case`; returns a description of the difference, if any.
fn text_difference(case: &Case) -> Option<String> {
    let args: Vec<&str> = case
        .args
        .iter()
        .chain(&case.ours_extra_args)
        .map(String::as_str)
        .collect();
    let out = common::generate(&args, b"");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Some(format!("{}: failed ({}): {stderr}", case.name, out.status));
    }
    let (ours, theirs) = (mask_timing(&stdout), mask_timing(&case.stdout));
    (ours != theirs).then(|| format!("{}:\n  ours   {ours:?}\n  mlx-lm {theirs:?}", case.name))
}

/// Verbose output's speed and memory numbers vary from run to run.
fn mask_timing(text: &str) -> String {
    text.lines()
        .map(|l| match l.split_once(" tokens, ") {
            Some((head, _)) if l.starts_with("Prompt: ") || l.starts_with("Generation: ") => {
                format!("{head} tokens")
            }
            _ if l.starts_with("Peak memory: ") => "Peak memory".to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_text(select: impl Fn(&Case) -> bool) {
    let selected: Vec<Case> = cases().into_iter().filter(|c| select(c)).collect();
    assert!(!selected.is_empty(), "no cases selected");
    let failures: Vec<String> = selected.iter().filter_map(text_difference).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from mlx-lm:\n{}",
        failures.len(),
        selected.len(),
        failures.join("\n")
    );
}

#[test]
fn greedy_generations_print_mlx_lm_text() {
    check_text(|c| !c.seeded && !prints_byte_zero_char(c));
}

#[test]
fn byte_zero_token_prints_like_mlx_lm() {
    check_text(|c| !c.seeded && prints_byte_zero_char(c));
}

#[test]
fn seeded_generations_print_mlx_lm_text() {
    check_text(|c| c.seeded);
}

/// mlx-lm's model construction takes `key_draws` keys from the global sequence (one per
/// Linear/Embedding weight and Linear bias, one more per quantized layer); loading
/// must take as many.
#[test]
fn init_key_draws_match_mlx_lm_construction() {
    let mut seen = std::collections::BTreeMap::new();
    for c in cases() {
        if let Some(m) = flag(&c.args, "--model") {
            seen.insert(m.to_string(), c.key_draws);
        }
    }
    assert!(seen.len() >= 4, "too few models in cases.json: {seen:?}");
    for (model, expected) in seen {
        let dir = common::root().join(&model);
        let n = mlx_models::model::mlx_lm_init_key_draws(&dir).expect("count draws");
        assert_eq!(n, expected, "{model}");
    }
}

/// mlx-lm's llama defines `make_cache`, so `--max-kv-size` leaves its caches alone.
#[test]
fn llama_ignores_max_kv_size_like_mlx_lm() {
    check_text(|c| c.name == "llama-max-kv-size-ignored");
}

/// mlx-lm's `make_prompt_cache(model, max_kv_size)` returns `model.make_cache()` where
/// the class defines it (llama, gemma3_text): only the others get a rotating window.
#[test]
fn max_kv_size_gives_a_window_only_to_models_without_make_cache() {
    for (name, window) in [
        ("llama-small-f32", None),
        ("gemma3_text-small-f32", None),
        ("qwen3-small-bf16", Some(20)),
    ] {
        let dir = common::goldens().join("models").join(name);
        let loaded = load(&LoadArgs {
            model: dir.to_str(),
            cpu_weights: Default::default(),
            adapter_path: None,
        })
        .expect("load");
        let got = mlx_bins::load::rotating_window(loaded.model.as_ref(), Some(20));
        assert_eq!(got, window, "{name}");
    }
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn num<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    flag(args, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Generates from mlx-lm's prompt ids with the case's options, in process. The seed is
/// set before loading, like mlx-lm: `load` takes the keys mlx-lm's model construction
/// takes, so the sampler sees mlx-lm's keys.
fn engine_tokens(case: &Case) -> anyhow::Result<Vec<u32>> {
    let a: Vec<String> = case
        .args
        .iter()
        .chain(&case.ours_extra_args)
        .cloned()
        .collect();
    let cpu_weights = mlx_bins::load::CpuWeights {
        cpu_dequantize: a.iter().any(|x| x == "--cpu-dequantize"),
        keep_quantized: false,
    };
    let cache_file = flag(&a, "--prompt-cache-file").map(|f| common::root().join(f));
    let mut caches_from_file = None;
    let mut model = flag(&a, "--model").map(str::to_string);
    if let Some(f) = &cache_file {
        let (caches, meta) = mlx_cache::load_prompt_cache(f)?;
        model = model.or_else(|| meta.get("model").cloned());
        caches_from_file = Some(caches);
    }
    let model = model.map(|m| common::root().join(m).to_string_lossy().into_owned());
    if let Some(seed) = flag(&a, "--seed") {
        mlx_array::random::seed(seed.parse()?)?;
    }
    let loaded = load(&LoadArgs {
        model: model.as_deref(),
        cpu_weights,
        adapter_path: None,
    })?;
    let tok = &loaded.tokenizer;
    let mut special: Vec<i32> = tok.encode("\n", false)?.iter().map(|&t| t as i32).collect();
    special.extend(tok.eos_token_ids().iter().map(|&t| t as i32));
    let sampler = mlx_sample::make_sampler(&mlx_sample::SamplerParams {
        temp: num(&a, "--temp", 0.0),
        top_p: num(&a, "--top-p", 1.0),
        min_p: num(&a, "--min-p", 0.0),
        min_tokens_to_keep: num(&a, "--min-tokens-to-keep", 1),
        top_k: num(&a, "--top-k", 0),
        xtc_probability: num(&a, "--xtc-probability", 0.0),
        xtc_threshold: num(&a, "--xtc-threshold", 0.1),
        xtc_special_tokens: special,
    })?;
    let max_kv = flag(&a, "--max-kv-size").map(|v| v.parse()).transpose()?;
    let mut caches = match caches_from_file {
        Some(c) => c,
        None => {
            let window = mlx_bins::load::rotating_window(loaded.model.as_ref(), max_kv);
            mlx_cache::make_prompt_cache(&loaded.model.cache_specs(), window)?
        }
    };
    let kv_quantization = flag(&a, "--kv-bits")
        .map(|b| -> anyhow::Result<KvQuantization> {
            Ok(KvQuantization {
                bits: b.parse()?,
                group_size: num(&a, "--kv-group-size", 64),
                start: num(&a, "--quantized-kv-start", 5000),
            })
        })
        .transpose()?;
    let opts = GenerateOptions {
        max_tokens: num(&a, "--max-tokens", 100),
        prefill_step_size: num(&a, "--prefill-step-size", 2048),
        sampler: Some(sampler),
        kv_quantization,
        ..Default::default()
    };
    let mut tokens = Vec::new();
    stream_generate(
        loaded.model.as_ref(),
        tok,
        PromptInput::Tokens(&case.prompt_ids),
        &mut caches,
        opts,
        |r| {
            tokens.push(r.token);
            true
        },
    )?;
    Ok(tokens)
}

fn check_tokens(select: impl Fn(&Case) -> bool) {
    let selected: Vec<Case> = cases().into_iter().filter(|c| select(c)).collect();
    assert!(!selected.is_empty(), "no cases selected");
    let mut failures = Vec::new();
    for case in &selected {
        match engine_tokens(case) {
            Ok(t) if t == case.tokens => {}
            Ok(t) => failures.push(format!(
                "{}: ours {t:?}\n  mlx-lm {:?}",
                case.name, case.tokens
            )),
            Err(e) => failures.push(format!("{}: {e:#}", case.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from mlx-lm:\n{}",
        failures.len(),
        selected.len(),
        failures.join("\n")
    );
}

#[test]
fn greedy_token_ids_match_mlx_lm() {
    check_tokens(|c| !c.seeded);
}

#[test]
fn seeded_token_ids_match_mlx_lm_after_its_construction_key_draws() {
    check_tokens(|c| c.seeded);
}

//! `BatchGenerator` (in-process batch generation, what `mlx-benchmark -b N` runs)
//! against mlx-lm's `batch_generate` on the committed tiny models
//! (goldens/generate/batch_generate.json, from xtask/py/batch_generate_oracle.py):
//! prompts of different lengths, prefilled together in padded chunks, some waiting for
//! a slot, generate exactly mlx-lm's greedy tokens; and the statistics count what ran.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_engine::batch::{BatchGenerator, BatchOptions};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|t| t.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn batch_generate_matches_mlx_lm() {
    let path = root().join("goldens/generate/batch_generate.json");
    let cases: Vec<Json> =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file"))
            .expect("golden json");
    assert!(cases.len() >= 5);
    // Every case runs; the failures are reported together.
    let mut failed = Vec::new();
    for case in &cases {
        let dir = root().join(case["model"].as_str().unwrap());
        let (model, _) = mlx_models::load_model(&dir).expect("tiny model");
        let settings = &case["settings"];
        let mut opts = BatchOptions {
            stop_sequences: ids(&case["eos"]).into_iter().map(|t| vec![t]).collect(),
            ..Default::default()
        };
        if let Some(n) = settings["completion_batch_size"].as_u64() {
            opts.completion_batch_size = n as usize;
        }
        if let Some(n) = settings["prefill_batch_size"].as_u64() {
            opts.prefill_batch_size = n as usize;
        }
        if let Some(n) = settings["prefill_step_size"].as_u64() {
            opts.prefill_step_size = n as usize;
        }
        let eos = ids(&case["eos"]);
        let prompts: Vec<Vec<u32>> = case["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(ids)
            .collect();
        let max_tokens = case["max_tokens"].as_u64().unwrap() as usize;
        let gen = BatchGenerator::start(model, opts).expect("engine");
        // Twice: the second call reuses the engine (no prompt cache carries over).
        for round in 0..2 {
            let out = gen.generate(&prompts, max_tokens).expect("batch");
            let got: Vec<Vec<u32>> = out
                .tokens
                .iter()
                .map(|t| {
                    // mlx-lm's batch_generate leaves out the stop token.
                    let mut t = t.clone();
                    if t.last().is_some_and(|l| eos.contains(l)) {
                        t.pop();
                    }
                    t
                })
                .collect();
            let want: Vec<Vec<u32>> = case["tokens"].as_array().unwrap().iter().map(ids).collect();
            if got != want {
                failed.push(format!(
                    "{} {settings} round {round}: got {got:?}, mlx-lm {want:?}",
                    case["model"]
                ));
                break;
            }
            let s = out.stats;
            let prompt_total: usize = prompts.iter().map(|p| p.len()).sum();
            assert_eq!(s.prompt_tokens as usize, prompt_total, "{}", case["model"]);
            let generated: usize = out.tokens.iter().map(|t| t.len()).sum();
            assert_eq!(s.generation_tokens as usize, generated);
            assert!(s.prompt_time > 0.0 && s.prompt_time < s.wall_time, "{s:?}");
            assert!(s.prompt_tps() > 0.0 && s.generation_tps() > 0.0, "{s:?}");
            assert!(s.peak_memory > 0.0);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases differ:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

#[test]
fn bad_batches_are_refused() {
    let dir = root().join("goldens/generate/models/llama-small-f32");
    let (model, _) = mlx_models::load_model(&dir).expect("tiny model");
    let zero = BatchOptions {
        completion_batch_size: 0,
        ..Default::default()
    };
    let (model2, _) = mlx_models::load_model(&dir).expect("tiny model");
    let e = BatchGenerator::start(model2, zero).err().expect("refused");
    assert!(e.to_string().contains("completion_batch_size"), "{e}");
    let gen = BatchGenerator::start(model, BatchOptions::default()).expect("engine");
    let e = gen
        .generate(&[vec![1, 2], vec![]], 4)
        .expect_err("empty prompt");
    assert!(e.to_string().contains("prompt 1 is empty"), "{e}");
    let e = gen.generate(&[vec![1, 2]], 0).expect_err("max_tokens 0");
    assert!(e.to_string().contains("max_tokens"), "{e}");
    // Still usable after the refusals.
    let out = gen.generate(&[vec![1, 2]], 3).expect("batch");
    assert_eq!(out.tokens[0].len(), 3);
}

/// Models with recurrent layers (`ArraysCache`) batch in the engine: each prompt's greedy
/// tokens among others (fewer slots than prompts, so later ones join a decoding batch;
/// prompts of different lengths prefilled in one padded chunk) equal its tokens alone. mamba's and nemotron_h's
/// blocks ignore a batched prefill's padding (as mlx-lm's do), so the engine prefills
/// their prompts one at a time; the others keep the padding out through the cache's
/// lengths (and match mlx-lm's `batch_generate` in the test above).
#[test]
fn recurrent_models_batched_equal_alone() {
    let lengths = [5usize, 1, 12, 7, 3];
    let prompts: Vec<Vec<u32>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((i * 31 + j * 17 + 3) % 127 + 1) as u32)
                .collect()
        })
        .collect();
    for name in [
        "mamba-small-f32",
        "nemotron_h-small-f32",
        "mamba2-small-f32",
        "qwen3_next-small-f32",
        "lfm2-small-f32",
        "granitemoehybrid-small-f32",
        "lfm2_moe-small-f32",
        "falcon_h1-small-f32",
        "jamba-small-f32",
        "olmo_hybrid-small-f32",
        "recurrent_gemma-small-f32",
        "plamo2-small-f32",
        "rwkv7-small-f32",
    ] {
        let dir = root().join("goldens/models").join(name);
        let (model, _) = mlx_models::load_model(&dir).expect("tiny model");
        let opts = BatchOptions {
            completion_batch_size: 3,
            ..Default::default()
        };
        let gen = BatchGenerator::start(model, opts).expect("engine");
        let together = gen.generate(&prompts, 8).expect("batch").tokens;
        for (p, t) in prompts.iter().zip(&together) {
            let alone = gen
                .generate(std::slice::from_ref(p), 8)
                .expect("alone")
                .tokens;
            assert_eq!(&alone[0], t, "{name}: prompt {p:?}");
        }
    }
}

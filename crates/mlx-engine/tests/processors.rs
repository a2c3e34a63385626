//! Stateful logits processors through every generation path: a processor that needs
//! the accepted token (it allows one token, counting up per accepted token, so it
//! repeats a token if a step is built before it hears the previous one) drives
//! `TokenGenerator`, the batch scheduler next to unconstrained rows (which must give
//! the same tokens as without it), and the scheduler with KV quantization (each
//! sequence alone).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops, Array, Dtype};
use mlx_engine::batch::{Engine, EngineEvent, EngineMetrics, EngineOptions, GenerationRequest};
use mlx_engine::{GenerateOptions, KvQuantization, TokenGenerator, TokenIterator};
use mlx_sample::{BuildProcessor, LogitsProcessor};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

fn model(dir: &str) -> Box<dyn mlx_models::LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens")
        .join(dir);
    mlx_models::load_model(dir).expect("load model").0
}

const TIED: &str = "models/llama-small-f32-tied";
/// Head dimension 32: its caches can be quantized in groups of 32.
const HD32: &str = "generate/models/llama-small-f32-hd32";

/// Allows only `base + (tokens accepted so far)`: counting up from `base` exactly when
/// every step is built after the previous token was accepted.
#[derive(Debug, Clone)]
struct Counting {
    base: u32,
    accepted: u32,
    vocab: u32,
}

impl LogitsProcessor for Counting {
    fn process(&mut self, _history: &Array, logits: &Array) -> mlx_sample::Result<Array> {
        let next = (self.base + self.accepted) % self.vocab;
        let ids = ops::arange(0.0, f64::from(self.vocab), 1.0, Dtype::Uint32)?;
        let allowed = ids.equal(&Array::scalar(next)?)?;
        let neg = Array::scalar_f64(-1e9, logits.dtype())?;
        Ok(mlx_array::where_(&allowed, logits, &neg)?)
    }

    fn accept(&mut self, _token: u32) -> mlx_sample::Result<()> {
        self.accepted += 1;
        Ok(())
    }

    fn needs_accepted_token(&self) -> bool {
        true
    }

    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }
}

#[derive(Debug)]
struct BuildCounting {
    base: u32,
    vocab: u32,
}

impl BuildProcessor for BuildCounting {
    fn build(&self) -> mlx_sample::Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(Counting {
            base: self.base,
            accepted: 0,
            vocab: self.vocab,
        }))
    }
}

fn counting_from(base: u32, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (base + i) % vocab).collect()
}

#[test]
fn token_generator_tells_the_processor_each_token_before_the_next_step() {
    let model = model(TIED);
    let vocab = model.vocab_size() as u32;
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None).expect("caches");
    let opts = GenerateOptions {
        max_tokens: 12,
        prefill_step_size: 2,
        logits_processors: vec![Box::new(Counting {
            base: 7,
            accepted: 0,
            vocab,
        })],
        ..Default::default()
    };
    let prompt = [5, 9, 2, 40];
    let mut gen = TokenGenerator::new(model.as_ref(), &prompt, &mut caches, opts).expect("gen");
    let mut got = Vec::new();
    while let Some((t, _)) = gen.next_token().expect("step") {
        got.push(t);
    }
    assert_eq!(got, counting_from(7, 12, vocab));
}

fn run_engine(dir: &str, kv: Option<KvQuantization>) {
    let model = model(dir);
    let vocab = model.vocab_size() as u32;
    let opts = EngineOptions {
        decode_concurrency: 8,
        prompt_concurrency: 4,
        prefill_step_size: 3,
        prompt_cache_size: 0,
        prompt_cache_bytes: None,
        kv_quantization: kv,
        max_queue: 64,
        memory: None,
        memory_limit: None,
        disk_cache: None,
        preload: Vec::new(),
        draft_min_acceptance: 0.0,
        draft_max_batch: 0,
        prediction_drafts: Default::default(),
        model_drafts: Default::default(),
    };
    let engine = Engine::start(model, opts, Arc::new(EngineMetrics::default())).expect("engine");
    let prompts: [&[u32]; 3] = [&[3, 4, 5, 6, 7, 8, 9], &[11, 12], &[20, 21, 22, 23]];
    let run = |constrained: &[bool]| -> Vec<Vec<u32>> {
        let mut subs = Vec::new();
        for (p, &c) in prompts.iter().zip(constrained) {
            let mut req = GenerationRequest::new(p.to_vec(), 10);
            if c {
                req.processors
                    .push(Arc::new(BuildCounting { base: 30, vocab }));
            }
            let (tx, rx) = mpsc::channel();
            let sub = engine.submit(req, Arc::new(tx)).expect("submit");
            subs.push((sub, rx));
        }
        subs.into_iter()
            .map(|(sub, rx)| {
                let mut out = Vec::new();
                loop {
                    match rx.recv().expect("event") {
                        EngineEvent::Token { out: t, .. } => {
                            out.push(t.token);
                            if t.finish.is_some() {
                                break;
                            }
                        }
                        EngineEvent::Failed { error, .. } => panic!("{error}"),
                        _ => {}
                    }
                }
                sub.release();
                out
            })
            .collect()
    };
    let free = run(&[false, false, false]);
    let mixed = run(&[false, true, false]);
    assert_eq!(mixed[1], counting_from(30, 10, vocab));
    assert_eq!(
        mixed[0], free[0],
        "an unconstrained row changed next to a constrained one"
    );
    assert_eq!(
        mixed[2], free[2],
        "an unconstrained row changed next to a constrained one"
    );
}

#[test]
fn batched_rows_with_a_token_hungry_processor_follow_it_and_leave_others_alone() {
    run_engine(TIED, None);
}

#[test]
fn sequences_alone_with_kv_bits_tell_the_processor_each_token_first() {
    run_engine(
        HD32,
        Some(KvQuantization {
            bits: 8,
            group_size: 32,
            start: 0,
        }),
    );
}

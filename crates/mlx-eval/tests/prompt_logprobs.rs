//! The engine's prompt log-probabilities (what `/v1/completions` echoes, from the
//! prefill's logits) equal mlx-eval's native scoring — mlx-lm's `_score_fn`
//! arithmetic, itself checked bit for bit against live mlx-lm in `scoring.rs` — on the
//! same tokens: alone, batched with other prompts of other lengths, in chunks, and
//! decoding alone (the scheduler's path for KV quantization). Bit for bit wherever the
//! forward pass is the same computation (one prompt, or padded prompts as `_score_fn`
//! pads them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_engine::batch::{
    Engine, EngineEvent, EngineMetrics, EngineOptions, Finish, GenerationRequest, PromptLogprob,
};
use mlx_engine::KvQuantization;
use mlx_eval::scoring::score;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/generate/models")
        .join(name)
}

fn load(name: &str) -> Box<dyn mlx_models::LanguageModel> {
    mlx_models::load_model(model_dir(name))
        .expect("load model")
        .0
}

fn engine(name: &str, step: usize, kv: Option<KvQuantization>) -> Engine {
    let opts = EngineOptions {
        decode_concurrency: 8,
        prompt_concurrency: 4,
        prefill_step_size: step,
        prompt_cache_size: 4,
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
    Engine::start(load(name), opts, Arc::new(EngineMetrics::default())).expect("engine")
}

/// What one choice got: the prompt event's entries and finish, then the tokens.
#[derive(Debug, Default)]
struct Got {
    prompt: Option<(Vec<PromptLogprob>, Option<Finish>)>,
    tokens: Vec<u32>,
}

fn request(prompt: &[u32], max_tokens: usize, top: usize, want: bool) -> GenerationRequest {
    GenerationRequest {
        top_logprobs: top,
        prompt_logprobs: want,
        speculate: None,
        ..GenerationRequest::new(prompt.to_vec(), max_tokens)
    }
}

/// Submits every request at once (so the scheduler batches them) and waits for all.
fn run(engine: &Engine, reqs: Vec<GenerationRequest>) -> Vec<Got> {
    let subs: Vec<_> = reqs
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            let sub = engine.submit(r, Arc::new(tx)).expect("submit");
            (sub, rx)
        })
        .collect();
    subs.into_iter()
        .map(|(sub, rx)| {
            let mut got = Got::default();
            loop {
                match rx.recv().expect("engine event") {
                    EngineEvent::Prompt {
                        logprobs, finish, ..
                    } => {
                        assert!(got.prompt.is_none(), "one prompt event");
                        assert!(got.tokens.is_empty(), "the prompt event comes first");
                        got.prompt = Some((logprobs, finish));
                        if finish.is_some() {
                            break;
                        }
                    }
                    EngineEvent::Token { out, .. } => {
                        got.tokens.push(out.token);
                        if out.finish.is_some() {
                            break;
                        }
                    }
                    EngineEvent::Failed { error, .. } => panic!("{error}"),
                    _ => {}
                }
            }
            sub.release();
            got
        })
        .collect()
}

/// `_score_fn` of `prompts` as one padded batch with `step`: each row's scores.
fn expected(name: &str, prompts: &[&[u32]], step: usize) -> Vec<Vec<f32>> {
    let model = load(name);
    let s = score(model.as_ref(), prompts, None, step).expect("score");
    let width = s.scores.dim(1).unwrap() as usize;
    let all: Vec<f32> = s.scores.to_vec().unwrap();
    prompts
        .iter()
        .enumerate()
        .map(|(r, p)| all[r * width..r * width + p.len() - 1].to_vec())
        .collect()
}

fn assert_bits(what: &str, got: &[PromptLogprob], prompt: &[u32], want: &[f32]) {
    assert_eq!(
        got.len(),
        prompt.len() - 1,
        "{what}: one entry per token after the first"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.token, prompt[i + 1], "{what}: token {i}");
        assert_eq!(
            g.logprob.to_bits(),
            w.to_bits(),
            "{what}: position {i}: {} vs {w}",
            g.logprob
        );
    }
}

const A: &[u32] = &[1, 5, 9, 13, 2, 40, 41, 7, 100, 3, 17];
const B: &[u32] = &[1, 7, 3];
const C: &[u32] = &[3, 3, 3, 3, 3, 250, 12];

#[test]
fn one_prompt_scores_equal_score_fn_bit_for_bit() {
    for name in ["llama-small-f32", "qwen3-small-bf16"] {
        let e = engine(name, 2048, None);
        let got = run(&e, vec![request(A, 0, 3, true)]);
        let (lps, finish) = got[0].prompt.clone().expect("a prompt event");
        assert_eq!(
            finish,
            Some(Finish::Length),
            "max_tokens 0 ends at the prompt"
        );
        assert!(got[0].tokens.is_empty(), "max_tokens 0 generates nothing");
        assert_bits(name, &lps, A, &expected(name, &[A], 2048)[0]);
        // The alternatives: three, the most likely among them, and the token's own
        // log-probability equals the best one exactly where it is the argmax.
        for l in &lps {
            assert_eq!(l.top.len(), 3);
            let best = l.top.iter().map(|t| t.1).fold(f32::MIN, f32::max);
            assert!(l.logprob <= best);
            if let Some(t) = l.top.iter().find(|t| t.0 == l.token) {
                assert_eq!(t.1.to_bits(), l.logprob.to_bits());
            }
        }
    }
}

#[test]
fn batched_and_chunked_prompts_score_like_score_fn() {
    let name = "llama-small-f32";
    // Together in one prefill batch: each row equals `_score_fn` on the same padded batch.
    let e = engine(name, 2048, None);
    let got = run(
        &e,
        [A, B, C].iter().map(|p| request(p, 0, 0, true)).collect(),
    );
    let want = expected(name, &[A, B, C], 2048);
    for (i, (g, p)) in got.iter().zip([A, B, C]).enumerate() {
        let (lps, _) = g.prompt.clone().expect("a prompt event");
        assert_bits(&format!("batched row {i}"), &lps, p, &want[i]);
        assert!(lps.iter().all(|l| l.top.is_empty()));
    }
    // Chunks of 4 tokens: `_score_fn` with step size 4.
    let e = engine(name, 4, None);
    let got = run(&e, vec![request(A, 0, 0, true)]);
    let (lps, _) = got[0].prompt.clone().unwrap();
    assert_bits("chunked", &lps, A, &expected(name, &[A], 4)[0]);
}

#[test]
fn decoding_alone_scores_too_and_generation_is_unchanged() {
    let name = "llama-small-f32-hd32";
    // KV quantization from an offset never reached: the scheduler's alone path.
    let kv = KvQuantization {
        bits: 8,
        group_size: 32,
        start: 100_000,
    };
    for kv in [None, Some(kv)] {
        let e = engine(name, 2048, kv);
        let got = run(
            &e,
            vec![
                request(A, 4, 2, true),
                request(A, 4, 0, false),
                request(&A[..1], 2, 0, true),
            ],
        );
        let (lps, finish) = got[0].prompt.clone().expect("a prompt event");
        assert_eq!(finish, None);
        assert_bits(&format!("{kv:?}"), &lps, A, &expected(name, &[A], 2048)[0]);
        assert_eq!(got[0].tokens.len(), 4);
        assert_eq!(
            got[0].tokens, got[1].tokens,
            "{kv:?}: scoring the prompt leaves the tokens as they were"
        );
        assert!(got[1].prompt.is_none(), "no prompt event unless asked");
        // A one-token prompt has nothing to score: an empty prompt event, then tokens.
        let (lps, _) = got[2].prompt.clone().expect("a prompt event");
        assert!(lps.is_empty());
        assert_eq!(got[2].tokens.len(), 2);
    }
}

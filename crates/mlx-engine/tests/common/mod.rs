//! Helpers shared by the speculation tests.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{random, Array};
use mlx_engine::batch::{Engine, EngineEvent, EngineOptions, GenerationRequest};
use mlx_models::LanguageModel;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

/// The model `dir` of `goldens/generate/models`.
pub fn model(dir: &str) -> Box<dyn LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/generate/models")
        .join(dir);
    mlx_models::load_model(dir).expect("load model").0
}

/// The model `name` (of `goldens/generate/models`) with Gaussian noise (`scale` times
/// each tensor's RMS) added to every weight: a draft model that agrees with it often,
/// not always (its files live as long as the returned directory).
pub fn noisy_copy(name: &str, scale: f32) -> (Box<dyn LanguageModel>, tempfile::TempDir) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/generate/models")
        .join(name);
    let (weights, _) = mlx_array::io::load_safetensors(src.join("model.safetensors")).unwrap();
    let key = mlx_array::random::key(5).unwrap();
    let keys = mlx_array::random::split(&key, weights.len() as i32).unwrap();
    let noisy: Vec<(String, Array)> = weights
        .iter()
        .enumerate()
        .map(|(n, (name, w))| {
            let n = n as i32;
            let k = keys
                .slice(&[n, 0], &[n + 1, 2], None)
                .unwrap()
                .squeeze(Some(&[0]))
                .unwrap();
            let rms = w
                .square()
                .unwrap()
                .mean(None, false)
                .unwrap()
                .sqrt()
                .unwrap();
            let noise = random::normal(&w.shape(), w.dtype(), None, None, Some(&k)).unwrap();
            let scaled = noise
                .multiply(
                    &rms.multiply(&Array::scalar_f64(scale as f64, w.dtype()).unwrap())
                        .unwrap(),
                )
                .unwrap();
            (name.clone(), w.add(&scaled).unwrap())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    mlx_array::io::save_safetensors(
        dir.path().join("model.safetensors"),
        noisy.iter().map(|(n, a)| (n.as_str(), a)),
        [("format", "mlx")],
    )
    .unwrap();
    let model = mlx_models::load_model(dir.path())
        .expect("load the noisy draft")
        .0;
    (model, dir)
}

/// The engine options of the speculation tests.
pub fn opts() -> EngineOptions {
    EngineOptions {
        decode_concurrency: 8,
        prompt_concurrency: 4,
        prefill_step_size: 4,
        prompt_cache_size: 0,
        prompt_cache_bytes: None,
        kv_quantization: None,
        max_queue: 64,
        memory: None,
        memory_limit: None,
        disk_cache: None,
        preload: Vec::new(),
        draft_min_acceptance: 0.0,
        draft_max_batch: 0,
        prediction_drafts: Default::default(),
        // The draft model's tests count its drafts: every one verified, as mlx-lm (one
        // test takes the default).
        model_drafts: mlx_engine::batch::DraftWidth::All,
    }
}

/// A token's log-probability and top alternatives `(id, logprob)`.
pub type TokenLogprobs = (Option<f32>, Vec<(u32, f32)>);

/// One request's tokens, how many came from drafts, and the drafts proposed.
#[derive(Debug, Default, Clone)]
pub struct Got {
    pub tokens: Vec<u32>,
    pub from_draft: usize,
    pub drafted: usize,
    /// Each token's log-probability and top alternatives (when the request asked).
    pub logprobs: Vec<TokenLogprobs>,
}

/// Submits every request at once and collects each one's tokens.
pub fn serve(engine: &Engine, reqs: Vec<GenerationRequest>) -> Vec<Got> {
    let subs: Vec<_> = reqs
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            (engine.submit(r, Arc::new(tx)).expect("submit"), rx)
        })
        .collect();
    subs.into_iter()
        .map(|(sub, rx)| {
            let mut got = Got::default();
            read(&rx, &mut got, usize::MAX);
            sub.release();
            got
        })
        .collect()
}

/// Reads a request's tokens into `got` until it finishes or `until` tokens are in.
pub fn read(rx: &mpsc::Receiver<EngineEvent>, got: &mut Got, until: usize) {
    while got.tokens.len() < until {
        match rx.recv().expect("event") {
            EngineEvent::Token { out, .. } => {
                got.tokens.push(out.token);
                got.from_draft += usize::from(out.from_draft);
                got.drafted += out.drafted;
                got.logprobs.push((out.logprob, out.top.clone()));
                if out.finish.is_some() {
                    break;
                }
            }
            EngineEvent::Failed { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
}

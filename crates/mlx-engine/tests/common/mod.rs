//! Helpers shared by the speculation and batch tests.
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

/// A grammar over token ids that works as an output constraint does: the `i`-th token of
/// the answer must be `i` modulo `modulus`; it needs each accepted token before the next
/// step, reaches a dead end when told a token it does not allow, and with `host_bits`
/// gives its mask as a bitset computed on the host (as llguidance's constraints do),
/// else only as a `where` on the logits. With `dead_end_at: Some(n)` its host mask finds
/// a dead end once `n` tokens were accepted (as llguidance finds that no token can go
/// on) and then allows token 0 only (as a constraint allows only EOS).
#[allow(dead_code)] // not every test file uses it
#[derive(Debug, Clone)]
pub struct Periodic {
    modulus: u32,
    host_bits: bool,
    dead_end_at: Option<u32>,
    accepted: u32,
    failed: bool,
}

#[allow(dead_code)]
impl Periodic {
    fn allows(&self, t: u32) -> bool {
        if self.failed {
            return t == 0;
        }
        t % self.modulus == self.accepted % self.modulus
    }
}

impl mlx_sample::LogitsProcessor for Periodic {
    fn process(&mut self, _history: &Array, logits: &Array) -> mlx_sample::Result<Array> {
        let v = logits.dim(-1)?;
        let allow: Vec<bool> = (0..v as u32).map(|t| self.allows(t)).collect();
        let cond = Array::from_slice(&allow, &[1, v])?;
        let neg = Array::scalar_f64(f64::NEG_INFINITY, logits.dtype())?;
        Ok(mlx_array::where_(&cond, logits, &neg)?)
    }

    fn allowed_bits(&mut self, vocab: usize) -> Option<mlx_sample::Result<Vec<u32>>> {
        if !self.host_bits {
            return None;
        }
        if self.dead_end_at == Some(self.accepted) {
            self.failed = true;
        }
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for t in (0..vocab as u32).filter(|&t| self.allows(t)) {
            words[t as usize / 32] |= 1 << (t % 32);
        }
        Some(Ok(words))
    }

    fn accept(&mut self, token: u32) -> mlx_sample::Result<()> {
        if std::thread::current().name() == Some("mlx-grammar") {
            PERIODIC_WORKER_ACCEPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if token % self.modulus != self.accepted % self.modulus {
            self.failed = true;
        }
        self.accepted += 1;
        Ok(())
    }

    fn needs_accepted_token(&self) -> bool {
        true
    }

    fn dead_end(&self) -> bool {
        self.failed
    }

    fn fork(&self) -> Box<dyn mlx_sample::LogitsProcessor> {
        Box::new(self.clone())
    }
}

/// How many tokens [`Periodic`]s accepted on the engine's grammar worker thread
/// (`MLX_MASKS_BESIDE`).
#[allow(dead_code)] // not every test file uses it
pub static PERIODIC_WORKER_ACCEPTS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Builds a fresh [`Periodic`] for every choice of a request.
#[allow(dead_code)] // not every test file uses it
#[derive(Debug)]
pub struct BuildPeriodic {
    pub modulus: u32,
    pub host_bits: bool,
    pub dead_end_at: Option<u32>,
}

impl mlx_sample::BuildProcessor for BuildPeriodic {
    fn build(&self) -> mlx_sample::Result<Box<dyn mlx_sample::LogitsProcessor>> {
        Ok(Box::new(Periodic {
            modulus: self.modulus,
            host_bits: self.host_bits,
            dead_end_at: self.dead_end_at,
            accepted: 0,
            failed: false,
        }))
    }
}

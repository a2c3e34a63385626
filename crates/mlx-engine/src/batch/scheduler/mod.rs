//! The engine thread: it owns the model, the prompt cache and every MLX evaluation;
//! callers submit requests over a channel and receive events through their own
//! [`EventSink`].
//!
//! Scheduling is continuous. Every choice of a request is a sequence with a stable
//! [`SeqId`]; it moves through stages (`Stages`), each its own object: waiting (no
//! slot yet), then in batched mode prefilling (`PrefillBatch`: up to `prompt_concurrency` prompts, one
//! chunk each per loop in one forward pass) and decoding (`DecodeBatch`: one forward
//! pass per step for all, mlx-lm's `BatchGenerator`), or, with KV-cache quantization or
//! caches that cannot be batched, alone (`Alone`: batch size 1, every step queued
//! before any token is read). Up to `decode_concurrency` sequences hold a slot. Each
//! loop drops cancelled sequences, admits waiting ones, runs one prefill step and one
//! decode step; every step's results go, by id, through `Shared::route`, which sends
//! the events and takes finished, failed and abandoned sequences out of their stage.
mod joining;
mod routing;

use super::admission::{Admit, MemoryAdmission};
use super::alone::Alone;
use super::decode::DecodeBatch;
use super::disk_cache::{DiskCache, DiskCacheOptions};
use super::guard::{self, Over};
use super::metrics::EngineMetrics;
use super::prefill::PrefillBatch;
use super::prompt_cache::{CacheKind, PromptCache};
use super::request::{
    DraftFrom, EngineEvent, EventSink, GenerationRequest, Job, SeqId, Submission,
};
use super::sequence::Sequence;
use super::speculate::{SpecBatch, CATCH_UP_SHARE};
use super::stage::{Leave, Outcome, Stage};
use super::width::DraftWidth;
use crate::error::{EngineError, Result};
use crate::step::KvQuantization;
use joining::Joining;
use mlx_cache::{BatchPromptCache, PromptCache as LayerCaches};
use mlx_models::{CacheSpec, LanguageModel};
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Sequences holding a slot at once.
    pub decode_concurrency: usize,
    /// Prompts prefilled per loop.
    pub prompt_concurrency: usize,
    /// Tokens per prefill chunk.
    pub prefill_step_size: usize,
    /// Prompt-cache entries.
    pub prompt_cache_size: usize,
    /// Prompt-cache bytes.
    pub prompt_cache_bytes: Option<u64>,
    /// KV-cache quantization.
    pub kv_quantization: Option<KvQuantization>,
    /// Requests waiting for a slot beyond this are refused ([`EngineError::Busy`]).
    pub max_queue: usize,
    /// Memory admission (`None`: sequences are admitted whatever they will take).
    pub memory: Option<MemoryAdmission>,
    /// The memory limit enforced while generating, in bytes (`None`: none): a step
    /// whose MLX peak memory goes over it stops its largest sequence with
    /// [`EngineError::Unavailable`] unless the prompt cache can give the excess back
    /// (MLX's own allocators do not fail at the limit; see `guard.rs`).
    pub memory_limit: Option<u64>,
    /// The prompt cache's disk tier (needs `prompt_cache_size` >= 1).
    pub disk_cache: Option<DiskCacheOptions>,
    /// Prompt-cache files (mlx-lm's format, with their tokens in the metadata) put in
    /// the prompt cache before the first request.
    pub preload: Vec<std::path::PathBuf>,
    /// Speculating rows whose drafts' acceptance over their last
    /// [`crate::speculative::ACCEPTANCE_WINDOW`] rounds falls below this (0 to 1) leave
    /// the speculating batch and decode plainly ([`crate::speculative::AcceptancePolicy`];
    /// 0: never).
    pub draft_min_acceptance: f64,
    /// While more rows than this decode (speculating and plain together), speculating
    /// rows leave their batch and decode plainly, for good (0: never; see
    /// [`crate::speculative::check_max_batch`]).
    pub draft_max_batch: usize,
    /// How many drafts a prediction gives (OpenAI predicted outputs) each step verifies:
    /// by default as many as pay for their positions in the batched forward, from the
    /// step times measured (`batch/width.rs`); every one, or none. The same tokens
    /// whichever. `MLX_PREDICTION_DRAFTS=all` / `none` overrides the default.
    pub prediction_drafts: DraftWidth,
    /// How many drafts the draft model makes and verifies each step for a speculating
    /// batch: by default as many as pay for their drafting and positions, from its step
    /// times (`batch/width.rs`, each row count on its own); every one
    /// (`num_draft_tokens`, as mlx-lm), or none. The same tokens whichever.
    /// `MLX_MODEL_DRAFTS=all` / `none` overrides the default.
    pub model_drafts: DraftWidth,
}

/// Work on the model that runs on the engine thread between steps (see
/// [`Engine::with_model`]).
pub type ModelTask = Box<dyn FnOnce(&mut dyn LanguageModel) + Send>;

enum Command {
    Submit(Box<Job>),
    Model(ModelTask),
    ForgetAdapter(u32),
    Shutdown,
}

/// Handle to the engine thread.
pub struct Engine {
    tx: Mutex<Sender<Command>>,
    queued: Arc<AtomicUsize>,
    next_id: AtomicU64,
    max_queue: usize,
    alive: Arc<AtomicBool>,
    metrics: Arc<EngineMetrics>,
    thread: Mutex<Option<JoinHandle<Box<dyn LanguageModel>>>>,
}

/// Whether a layer's cache joins a batch (mlx-lm's server batches every model whose
/// caches all have `merge`).
fn spec_batches(spec: &CacheSpec) -> bool {
    match spec {
        CacheSpec::Standard => true,
        CacheSpec::Rotating { keep, .. } => *keep == 0,
        // Recurrent state (ArraysCache): merged, filtered and extended row by row like
        // mlx-lm's; right-padded prefill chunks pass their lengths (`prepare`) so the
        // padding never enters the state.
        CacheSpec::Arrays { .. } => true,
        // A CacheList merges its caches one by one.
        CacheSpec::List(subs) => subs.iter().all(spec_batches),
        // mlx-lm's ChunkedKVCache has no `merge`, so its server runs such models (Llama 4)
        // one request at a time; so do we.
        CacheSpec::Chunked { .. } => false,
    }
}

impl Engine {
    /// Starts the engine thread with `model`.
    pub fn start(
        model: Box<dyn LanguageModel>,
        opts: EngineOptions,
        metrics: Arc<EngineMetrics>,
    ) -> Result<Engine> {
        Engine::start_with_draft(model, None, opts, metrics)
    }

    /// Starts the engine thread with `model` and a draft model for the requests that
    /// ask for speculative decoding from it ([`super::DraftFrom::DraftModel`]). The
    /// draft's vocabulary must not be larger than the model's (its ids index the
    /// model's embedding) and its caches must be trimmable.
    pub fn start_with_draft(
        model: Box<dyn LanguageModel>,
        draft: Option<Box<dyn LanguageModel>>,
        opts: EngineOptions,
        metrics: Arc<EngineMetrics>,
    ) -> Result<Engine> {
        if let Some(d) = &draft {
            let (dv, tv) = (d.vocab_size(), model.vocab_size());
            if dv > tv {
                return Err(EngineError::Invalid(format!(
                    "the draft model's vocabulary ({dv}) is larger than the model's ({tv}): \
                     the draft must use the model's tokenizer"
                )));
            }
            if !d
                .cache_specs()
                .iter()
                .all(|s| matches!(s, CacheSpec::Standard))
            {
                return Err(EngineError::Invalid(
                    "the draft model's caches cannot be trimmed (sliding-window or recurrent \
                     layers): speculative decoding needs a draft with standard KV caches"
                        .into(),
                ));
            }
        }
        crate::speculative::check_min_acceptance(opts.draft_min_acceptance)?;
        crate::speculative::check_max_batch(opts.draft_max_batch as i64, opts.decode_concurrency)?;
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let max_queue = opts.max_queue;
        let batched =
            opts.kv_quantization.is_none() && model.cache_specs().iter().all(spec_batches);
        if !batched
            && model
                .cache_specs()
                .iter()
                .any(|s| matches!(s, CacheSpec::Chunked { .. }))
        {
            tracing::info!(
                "requests run one at a time: the model's chunked-attention caches \
                 (ChunkedKVCache) cannot be batched (mlx-lm cannot batch them either)"
            );
        }
        // Speculating rows trim their caches after each verification.
        let speculates = model
            .cache_specs()
            .iter()
            .all(|s| matches!(s, CacheSpec::Standard));
        let stages = if batched {
            Stages::Batched {
                prefilling: PrefillBatch::default(),
                decoding: DecodeBatch::default(),
                drafting: Box::new(
                    SpecBatch::new(opts.draft_min_acceptance, opts.draft_max_batch)
                        .widths(DraftWidth::from_env("MLX_MODEL_DRAFTS", opts.model_drafts))
                        .plain_model_steps(
                            match std::env::var("MLX_MODEL_PLAIN_STEPS").as_deref() {
                                Ok("1") => true,
                                Ok("0") => false,
                                _ => crate::step::on_gpu(),
                            },
                        )
                        .deferred_draft_prefill(
                            std::env::var("MLX_DRAFT_PREFILL").as_deref() != Ok("eager"),
                        )
                        .catch_up_share(catch_up_share_from_env())
                        .eager_feed(crate::speculative::eager_feed_every_round())
                        .pooled_acceptance(
                            std::env::var("MLX_DRAFT_POOLED_ACCEPTANCE").as_deref() != Ok("0"),
                        )
                        .first_shapes_untimed(first_shapes_untimed())
                        .hold_for_joining(
                            std::env::var("MLX_DRAFT_JOINING_HOLD").as_deref() != Ok("0"),
                        )
                        .widest_tries(std::env::var("MLX_WIDTH_TRY_WIDEST").as_deref() == Ok("1")),
                ),
                predicting: Box::new(
                    SpecBatch::new(opts.draft_min_acceptance, opts.draft_max_batch)
                        .widths(DraftWidth::from_env(
                            "MLX_PREDICTION_DRAFTS",
                            opts.prediction_drafts,
                        ))
                        .first_shapes_untimed(first_shapes_untimed()),
                ),
            }
        } else {
            Stages::Alone(Alone::default())
        };
        let specs = model.cache_specs();
        let mut cache = PromptCache::new(opts.prompt_cache_size, opts.prompt_cache_bytes);
        for path in &opts.preload {
            let (tokens, caches) = super::disk_cache::load_tokens_file(path, &specs)
                .map_err(|e| EngineError::Invalid(format!("{}: {e}", path.display())))?;
            tracing::info!(
                "prompt cache: {} tokens preloaded from {}",
                tokens.len(),
                path.display()
            );
            cache.insert(tokens, caches, CacheKind::System);
        }
        let disk = match &opts.disk_cache {
            Some(d) => Some(DiskCache::open(d.clone(), specs).map_err(|e| {
                EngineError::Unavailable(format!(
                    "cannot open the prompt-cache directory {}: {e}",
                    d.dir.display()
                ))
            })?),
            None => None,
        };
        let shared = Shared {
            cache,
            disk,
            opts,
            metrics: Arc::clone(&metrics),
            mlx_failed: std::cell::Cell::new(false),
            progress: HashMap::new(),
            speculates,
        };
        shared.update_cache_metrics();
        let state = Scheduler {
            waiting: VecDeque::new(),
            stages,
            shared,
            model,
            draft,
            queued: Arc::clone(&queued),
            loops: 0,
        };
        let alive2 = Arc::clone(&alive);
        let thread = std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                let model = run(state, rx);
                alive2.store(false, Ordering::SeqCst);
                model
            })
            .map_err(|e| {
                EngineError::Unavailable(format!("cannot start the engine thread: {e}"))
            })?;
        Ok(Engine {
            tx: Mutex::new(tx),
            queued,
            next_id: AtomicU64::new(0),
            max_queue,
            alive,
            metrics,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Whether the engine thread is running.
    pub fn is_healthy(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// The engine's counters.
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    /// Queues `req` (its `n` choices, each a sequence), its events going to `events`;
    /// [`EngineError::Busy`] when the queue is full, [`EngineError::Unavailable`] when
    /// the engine is gone.
    pub fn submit(&self, req: GenerationRequest, events: Arc<dyn EventSink>) -> Result<Submission> {
        let n = req.n.max(1);
        let prev = self.queued.fetch_add(n, Ordering::SeqCst);
        if prev + n > self.max_queue {
            self.queued.fetch_sub(n, Ordering::SeqCst);
            self.metrics.rejected_queue_full.add(1);
            return Err(EngineError::Busy(format!(
                "the server is busy: {prev} requests are waiting (--max-queue {})",
                self.max_queue
            )));
        }
        self.metrics.queue_depth.set((prev + n) as u64);
        let cancel = Arc::new(AtomicBool::new(false));
        let req = Arc::new(req);
        let submitted = Instant::now();
        let choices: Vec<Arc<AtomicBool>> =
            (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        for (choice, choice_cancel) in choices.iter().enumerate() {
            let job = Job {
                id: SeqId(self.next_id.fetch_add(1, Ordering::Relaxed)),
                req: Arc::clone(&req),
                choice,
                events: Arc::clone(&events),
                cancel: Arc::clone(&cancel),
                choice_cancel: Arc::clone(choice_cancel),
                submitted,
            };
            if tx.send(Command::Submit(Box::new(job))).is_err() {
                self.queued.fetch_sub(n - choice, Ordering::SeqCst);
                return Err(EngineError::Unavailable(
                    "the generation engine is not running".into(),
                ));
            }
        }
        Ok(Submission::new(cancel, choices))
    }

    /// Runs `task` on the engine thread with the model, between two steps (e.g. adding
    /// or removing resident LoRA adapters: sequences keep running with their own).
    /// [`EngineError::Unavailable`] when the engine is gone. The task reports its own
    /// result (through a channel it holds).
    pub fn with_model(&self, task: ModelTask) -> Result<()> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Model(task))
            .map_err(|_| EngineError::Unavailable("the generation engine is not running".into()))
    }

    /// Drops the prompt-cache entries made with resident adapter `adapter` (after it is
    /// removed from the model; its id is not to be used again).
    pub fn forget_adapter(&self, adapter: u32) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::ForgetAdapter(adapter));
    }

    /// Stops the engine: queued and running requests fail; waits for the thread.
    pub fn shutdown(&self) {
        let _ = self.shutdown_into_model();
    }

    /// Stops the engine like [`Engine::shutdown`] and hands the model back to the
    /// caller's thread (`None` when the engine thread died or was already stopped), for
    /// a caller that runs the model itself between batches (mlx-eval's scoring).
    pub fn shutdown_into_model(&self) -> Option<Box<dyn LanguageModel>> {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Shutdown);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        handle.and_then(|h| h.join().ok())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What routing results needs besides the stages.
struct Shared {
    opts: EngineOptions,
    metrics: Arc<EngineMetrics>,
    cache: PromptCache,
    /// An MLX operation failed this loop (e.g. an allocation): the prompt cache gives
    /// back half its memory afterwards.
    mlx_failed: std::cell::Cell<bool>,
    disk: Option<DiskCache>,
    /// `(processed, total)` uncached prompt tokens of the sequences prefilling.
    progress: HashMap<SeqId, (usize, usize)>,
    /// Whether the model's caches can be trimmed (speculative decoding).
    speculates: bool,
}

/// The stages a sequence goes through after waiting for a slot.
enum Stages {
    /// Prompts prefill together, then decode together in one batch.
    Batched {
        prefilling: PrefillBatch,
        decoding: DecodeBatch,
        /// Rows speculating with the draft model.
        drafting: Box<SpecBatch>,
        /// Rows speculating by prompt lookup (predicted outputs).
        predicting: Box<SpecBatch>,
    },
    /// Every sequence prefills and decodes alone (KV-cache quantization, or caches that
    /// cannot be batched).
    Alone(Alone),
}

impl Stages {
    fn each(&mut self) -> Vec<&mut dyn Stage> {
        match self {
            Stages::Batched {
                prefilling,
                decoding,
                drafting,
                predicting,
            } => vec![prefilling, decoding, drafting.as_mut(), predicting.as_mut()],
            Stages::Alone(alone) => vec![alone],
        }
    }

    fn all(&self) -> Vec<&dyn Stage> {
        match self {
            Stages::Batched {
                prefilling,
                decoding,
                drafting,
                predicting,
            } => vec![prefilling, decoding, drafting.as_ref(), predicting.as_ref()],
            Stages::Alone(alone) => vec![alone],
        }
    }

    fn len(&self) -> usize {
        self.all().iter().map(|s| s.len()).sum()
    }

    fn nbytes(&self) -> usize {
        self.all().iter().map(|s| s.nbytes()).sum()
    }

    /// An admitted sequence enters its first stage.
    fn push(&mut self, seq: Sequence) {
        match self {
            Stages::Batched { prefilling, .. } => prefilling.push(seq),
            Stages::Alone(alone) => alone.push(seq),
        }
    }
}

struct Scheduler {
    waiting: VecDeque<Box<Job>>,
    stages: Stages,
    shared: Shared,
    model: Box<dyn LanguageModel>,
    /// The draft model of speculative decoding.
    draft: Option<Box<dyn LanguageModel>>,
    queued: Arc<AtomicUsize>,
    loops: u64,
}

/// The engine thread's loop until shutdown; returns the model.
fn run(mut st: Scheduler, rx: Receiver<Command>) -> Box<dyn LanguageModel> {
    let stream = match crate::generation_stream() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("engine: cannot create an MLX stream: {e}");
            return st.model;
        }
    };
    mlx_array::with_stream(stream, || loop {
        let idle = st.running() == 0 && st.waiting.is_empty();
        let mut shutdown = false;
        if idle {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(Command::Submit(job)) => st.waiting.push_back(job),
                Ok(Command::Model(task)) => st.run_task(task),
                Ok(Command::ForgetAdapter(a)) => st.forget_adapter(a),
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => shutdown = true,
                Err(RecvTimeoutError::Timeout) => continue,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(Command::Submit(job)) => st.waiting.push_back(job),
                Ok(Command::Model(task)) => st.run_task(task),
                Ok(Command::ForgetAdapter(a)) => st.forget_adapter(a),
                Ok(Command::Shutdown) | Err(TryRecvError::Disconnected) => {
                    shutdown = true;
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        if shutdown {
            st.fail_all(EngineError::Unavailable(
                "the server is shutting down".into(),
            ));
            return;
        }
        if catch_unwind(AssertUnwindSafe(|| st.iterate())).is_err() {
            tracing::error!("engine: a generation step panicked; failing the running requests");
            st.fail_all(EngineError::Internal(
                "internal error in the generation engine".into(),
            ));
        }
    });
    st.model
}

impl Scheduler {
    fn run_task(&mut self, task: ModelTask) {
        if catch_unwind(AssertUnwindSafe(|| task(self.model.as_mut()))).is_err() {
            tracing::error!("engine: a task on the model panicked");
        }
    }

    fn forget_adapter(&mut self, adapter: u32) {
        self.shared.cache.remove_adapter(adapter);
        self.shared.update_cache_metrics();
    }

    fn running(&self) -> usize {
        self.stages.len()
    }

    fn fail_all(&mut self, err: EngineError) {
        for job in self.waiting.drain(..) {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            job.fail(err.clone());
        }
        for stage in self.stages.each() {
            for s in stage.drain() {
                s.job().fail(err.clone());
            }
        }
        let m = &self.shared.metrics;
        m.queue_depth.set(self.queued.load(Ordering::SeqCst) as u64);
        m.active_sequences.set(0);
    }

    fn iterate(&mut self) {
        self.drop_cancelled();
        self.admit();
        let model = self.model.as_ref();
        let draft = self.draft.as_deref();
        match &mut self.stages {
            Stages::Batched {
                prefilling,
                decoding,
                drafting,
                predicting,
            } => {
                let mut joining = Joining {
                    decoding,
                    drafting,
                    predicting,
                    draft,
                };
                self.shared.prefill_batched(model, prefilling, &mut joining);
                self.shared.decode_batched(model, decoding);
                // The prompts admitted and still to join (not those waiting for a slot,
                // which may wait long): a draft-model batch about to grow does not start
                // a catch-up ([`SpecBatch::expect_joining`]).
                drafting.expect_joining(prefilling.len());
                // Rows stepping aside join `decoding`: the count holds for both.
                let running = decoding.len() + drafting.len() + predicting.len();
                self.shared
                    .decode_speculative(model, draft, drafting, decoding, running);
                self.shared
                    .decode_speculative(model, None, predicting, decoding, running);
            }
            Stages::Alone(alone) => self.shared.step_alone(model, alone),
        }
        self.update_progress();
        self.loops += 1;
        if self.shared.mlx_failed.take() {
            // The failed sequences' caches are gone; make more room for the others.
            let cache = &mut self.shared.cache;
            let (n, bytes) = (cache.len() / 2, cache.nbytes() / 2);
            cache.trim_to(n, bytes);
            self.shared.update_cache_metrics();
            mlx_array::memory::clear_cache();
        } else if self.loops.is_multiple_of(256) {
            mlx_array::memory::clear_cache();
        }
        let m = &self.shared.metrics;
        m.active_sequences.set(self.running() as u64);
        m.queue_depth.set(self.queued.load(Ordering::SeqCst) as u64);
    }

    /// The prefill-progress gauges: sequences still prefilling (all but their last
    /// prompt token processed is the end of prefill).
    fn update_progress(&mut self) {
        let mut stages = self.stages.each();
        let progress = &mut self.shared.progress;
        progress.retain(|id, (p, t)| {
            *p + 1 < *t && stages.iter_mut().any(|s| s.get_mut(*id).is_some())
        });
        let (p, t) = progress
            .values()
            .fold((0, 0), |(p, t), (pi, ti)| (p + pi, t + ti));
        self.shared.metrics.prefill_processed_tokens.set(p as u64);
        self.shared.metrics.prefill_total_tokens.set(t as u64);
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        let mut gone = 0u64;
        self.waiting.retain(|j| {
            gone += u64::from(j.client_gone());
            !j.cancelled()
        });
        let dropped = before - self.waiting.len();
        let m = &self.shared.metrics;
        if dropped > 0 {
            self.queued.fetch_sub(dropped, Ordering::SeqCst);
            // The gauge first, so a reader who sees the cancellation also sees the
            // shorter queue (the end of the loop would set it one step later).
            m.queue_depth.set(self.queued.load(Ordering::SeqCst) as u64);
            m.cancelled.add(gone);
            tracing::info!("engine: {dropped} queued request(s) cancelled");
        }
        for stage in self.stages.each() {
            self.shared.drop_cancelled(stage);
        }
    }

    fn admit(&mut self) {
        let mut pending = 0u64;
        while self.stages.len() < self.shared.opts.decode_concurrency {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            if let Some(m) = self.shared.opts.memory {
                match self
                    .shared
                    .admit_memory(&m, &job, self.stages.nbytes() as u64, pending)
                {
                    (Admit::Now, need) => pending += need,
                    (Admit::Later, _) => {
                        self.waiting.push_front(job);
                        if self.stages.len() == 0 {
                            // Memory held elsewhere (another model's engine): look again
                            // shortly instead of spinning.
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        break;
                    }
                    (Admit::Never(msg), _) => {
                        self.queued.fetch_sub(1, Ordering::SeqCst);
                        self.shared.metrics.engine_errors.add(1);
                        tracing::warn!("engine: request refused: {msg}");
                        job.fail(EngineError::Unavailable(msg));
                        continue;
                    }
                }
            }
            let shared = &mut self.shared;
            self.queued.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!(
                "engine: admitted {:.1} ms after submission",
                job.submitted.elapsed().as_secs_f64() * 1e3
            );
            if let Some(seq) = shared.start(*job, self.model.as_ref()) {
                self.stages.push(seq);
            }
        }
        let shared = &mut self.shared;
        if let Some(limit) = shared.opts.prompt_cache_bytes {
            let active = self.stages.nbytes() as u64;
            shared
                .cache
                .trim_to(usize::MAX, limit.saturating_sub(active));
            shared.update_cache_metrics();
        }
    }
}

impl Shared {
    /// Memory admission of `job` (see [`MemoryAdmission`]): when it does not fit now,
    /// the prompt cache gives back what it can first. Returns the decision and the bytes
    /// it will take.
    fn admit_memory(
        &mut self,
        m: &MemoryAdmission,
        job: &Job,
        running: u64,
        pending: u64,
    ) -> (Admit, u64) {
        let need = m.estimate(
            job.req.prompt.len(),
            job.req.max_tokens,
            self.opts.prefill_step_size,
        );
        let active = mlx_array::memory::active_memory() as u64;
        let decision = m.decide(need, active, running, self.cache.nbytes(), pending);
        if decision != Admit::Later || self.cache.is_empty() {
            return (decision, need);
        }
        let short = (active + pending + need).saturating_sub(m.limit_bytes);
        self.cache
            .trim_to(usize::MAX, self.cache.nbytes().saturating_sub(short));
        self.update_cache_metrics();
        mlx_array::memory::clear_cache();
        let active = mlx_array::memory::active_memory() as u64;
        (
            m.decide(need, active, running, self.cache.nbytes(), pending),
            need,
        )
    }

    /// Batched mode, prefill: sequences with only their last prompt token left (a
    /// prompt-cache hit) join the decode batch; up to `prompt_concurrency` others
    /// prefill together, one chunk each per loop, and join it once prefilled.
    fn prefill_batched(
        &mut self,
        model: &dyn LanguageModel,
        prefilling: &mut PrefillBatch,
        joining: &mut Joining<'_>,
    ) {
        let hits = prefilling.take_cache_hits();
        let hits = self.report_prompts(hits);
        self.join_hits(hits, joining);
        // One prompt at a time where right padding would leak into a recurrent state.
        let concurrency = if model.padded_prefill_is_exact() {
            self.opts.prompt_concurrency
        } else {
            1
        };
        if let Err((seqs, e)) = prefilling.fill(concurrency) {
            self.fail_seqs(seqs, e);
        }
        if prefilling.prefilling() == 0 {
            return;
        }
        let tic = Instant::now();
        let checkpoints = self.opts.prompt_cache_size > 0;
        guard::watch(self.opts.memory_limit);
        let stepped = prefilling.step(model, self.opts.prefill_step_size, checkpoints);
        let took = tic.elapsed();
        self.metrics.prefill_micros.add(took.as_micros() as u64);
        tracing::debug!(
            "engine: prefill step of {} prompt(s) in {:.1} ms ({})",
            prefilling.prefilling(),
            took.as_secs_f64() * 1e3,
            mlx_array::memory::note(),
        );
        match stepped {
            Ok(progress) => {
                let rows = prefilling.stepping();
                self.enforce_memory_limit(prefilling, &rows);
                self.route(prefilling, progress)
            }
            Err(e) => return self.fail_seqs(prefilling.drain_rows(), e),
        }
        match prefilling.take_ready() {
            Ok(Some((seqs, cache))) => {
                let n = seqs.len();
                self.join_prefilled(seqs, cache, joining);
                tracing::debug!(
                    "engine: {n} prefilled sequence(s) joined decoding, {} decoding ({})",
                    joining.running(),
                    mlx_array::memory::note(),
                );
            }
            Ok(None) => {}
            Err(e) => self.fail_seqs(prefilling.drain_rows(), e),
        }
    }

    /// Batched mode, decode: one step of the batch; finished, failed and abandoned rows
    /// leave it.
    fn decode_batched(&mut self, model: &dyn LanguageModel, decoding: &mut DecodeBatch) {
        if decoding.len() == 0 {
            return;
        }
        let rows = decoding.len() as u64;
        guard::watch(self.opts.memory_limit);
        let outcomes = match decoding.step(model) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("engine: batched decoding failed: {e}");
                return self.fail_seqs(decoding.drain(), e);
            }
        };
        self.metrics.decode_steps.add(1);
        self.metrics.decode_rows.add(rows);
        tracing::trace!(
            "engine: decoding step of {rows} row(s) queued ({})",
            mlx_array::memory::note()
        );
        let stepped = decoding.stepping();
        self.enforce_memory_limit(decoding, &stepped);
        self.route(decoding, outcomes);
    }

    /// Sequences alone: one prefill step each (up to `prompt_concurrency`), then one
    /// decoding step of every decoding sequence.
    fn step_alone(&mut self, model: &dyn LanguageModel, alone: &mut Alone) {
        let (budget, step, kv) = (
            self.opts.prompt_concurrency,
            self.opts.prefill_step_size,
            self.opts.kv_quantization,
        );
        let stepping = alone.prefilling(budget);
        guard::watch(self.opts.memory_limit);
        let progress = alone.prefill(model, budget, step, kv, &self.metrics);
        self.enforce_memory_limit(alone, &stepping);
        self.route(alone, progress);
        let stepping = alone.decoding();
        guard::watch(self.opts.memory_limit);
        let outcomes = alone.decode(model, kv, &self.metrics);
        self.enforce_memory_limit(alone, &stepping);
        self.route(alone, outcomes);
    }

    /// A sequence for `job`: its caches from the prompt cache (or new); `Started` sent.
    fn start(&mut self, job: Job, model: &dyn LanguageModel) -> Option<Sequence> {
        let prompt = &job.req.prompt;
        let adapter = job.req.adapter;
        // Prompt log-probabilities come from the prefill's logits: every position is
        // computed, none taken from the prompt cache (memory or disk).
        let mut hit = if job.req.prompt_logprobs {
            None
        } else {
            self.cache.fetch_nearest_for(adapter, prompt)
        };
        // The disk tier holds the base model's caches only (its files are keyed by model).
        if let Some(disk) = self
            .disk
            .as_mut()
            .filter(|_| !job.req.prompt_logprobs && adapter == 0)
        {
            let have = hit.as_ref().map_or(0, |h| h.cached_tokens);
            if let Some(d) = disk.fetch(prompt, have) {
                self.metrics.disk_cache_hits.add(1);
                self.cache.insert(d.tokens, d.caches, d.kind);
                self.update_cache_metrics();
                if let Some(better) = self.cache.fetch_nearest(prompt) {
                    hit = Some(better);
                }
            }
        }
        let (caches, cached) = match hit {
            Some(hit) => {
                self.metrics.cache_hits.add(1);
                (hit.caches, hit.cached_tokens)
            }
            None => {
                self.metrics.cache_misses.add(1);
                match mlx_cache::make_prompt_cache(&model.cache_specs(), None) {
                    Ok(c) => (c, 0),
                    Err(e) => {
                        job.fail(EngineError::Unavailable(format!(
                            "cannot make a KV cache: {e}"
                        )));
                        return None;
                    }
                }
            }
        };
        self.metrics.prompt_tokens.add(prompt.len() as u64);
        self.metrics.cached_prompt_tokens.add(cached as u64);
        let (choice, events) = (job.choice, Arc::clone(&job.events));
        match Sequence::new(job, caches, cached) {
            Ok(seq) => {
                seq.job().send(EngineEvent::Started {
                    choice,
                    cached_tokens: cached,
                });
                Some(seq)
            }
            Err(error) => {
                events.send(EngineEvent::Failed { choice, error });
                None
            }
        }
    }
}

/// `MLX_DRAFT_CATCH_UP_SHARE` ([`SpecBatch::catch_up_share`]) where it is a number of at
/// least 0 (`inf` included), else the default (with a warning when it is set to
/// something else).
fn catch_up_share_from_env() -> f64 {
    const VAR: &str = "MLX_DRAFT_CATCH_UP_SHARE";
    match std::env::var(VAR) {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s >= 0.0 => s,
            _ => {
                tracing::warn!("{VAR}={v} is not a number of at least 0: the default stands");
                CATCH_UP_SHARE
            }
        },
        Err(_) => CATCH_UP_SHARE,
    }
}

/// `MLX_WIDTH_FIRST_SHAPES_UNTIMED=1` ([`SpecBatch::first_shapes_untimed`]).
fn first_shapes_untimed() -> bool {
    std::env::var("MLX_WIDTH_FIRST_SHAPES_UNTIMED").as_deref() == Ok("1")
}

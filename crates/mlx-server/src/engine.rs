//! The engine thread: it owns the model, the prompt cache and every MLX evaluation;
//! HTTP handlers submit requests over a channel and receive events on their own.
//!
//! Scheduling is continuous: up to `decode_concurrency` sequences hold a slot; each loop
//! runs one prefill step, then one decode step. Up to `prompt_concurrency` prompts
//! prefill together ([`PrefillBatch`], one chunk each per loop in one forward pass);
//! once only its last prompt token is left, a sequence moves to the [`DecodeBatch`],
//! which decodes all of them in one forward pass per step with batch caches (mlx-lm's
//! `BatchGenerator`); each keeps its own sampler, processors and stop state. With
//! KV-cache quantization (which mlx-lm does not batch either) or caches that cannot be
//! batched, every sequence prefills and decodes alone with batch size 1, all decode
//! steps queued before any token is read.
use crate::batch::{DecodeBatch, Leave};
use crate::error::{ApiError, ServerError};
use crate::metrics::Metrics;
use crate::prefill::PrefillBatch;
use crate::prompt_cache::{CacheKind, PromptCache};
use crate::sequence::{mlx_err, EngineEvent, GenerationRequest, Job, Prefill, Sequence};
use mlx_array::{transforms, Array};
use mlx_cache::PromptCache as LayerCaches;
use mlx_engine::KvQuantization;
use mlx_models::{CacheSpec, LanguageModel};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Engine settings (from the server flags).
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
    /// Requests waiting for a slot beyond this are refused (429).
    pub max_queue: usize,
}

enum Command {
    Submit(Box<Job>),
    Shutdown,
}

/// A submitted request: its events, and cancellation when dropped before it is
/// [released](Submission::release).
pub struct Submission {
    /// Events of all choices.
    pub events: UnboundedReceiver<EngineEvent>,
    cancel: Arc<AtomicBool>,
    choices: Vec<Arc<AtomicBool>>,
    done: Arc<AtomicBool>,
}

impl Submission {
    /// A submission fed by `events` instead of the engine (to drive [`crate::output`]
    /// directly, e.g. in tests).
    pub fn from_events(events: UnboundedReceiver<EngineEvent>) -> Submission {
        Submission {
            events,
            cancel: Arc::new(AtomicBool::new(false)),
            choices: Vec::new(),
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops the generation: the client is gone (also done on drop).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Stops one choice (the others go on).
    pub fn cancel_choice(&self, choice: usize) {
        if let Some(c) = self.choices.get(choice) {
            c.store(true, Ordering::Relaxed);
        }
    }

    /// The answer is complete: stops whatever still runs without counting it as a
    /// client disconnect, and disarms the drop guards.
    pub fn release(&self) {
        self.done.store(true, Ordering::Relaxed);
        for c in &self.choices {
            c.store(true, Ordering::Relaxed);
        }
    }

    /// The cancel flag, weakly (for watchers of the client connection).
    pub fn flag(&self) -> std::sync::Weak<AtomicBool> {
        Arc::downgrade(&self.cancel)
    }

    /// A guard that cancels the generation when dropped before the answer is complete
    /// (held by a streamed body, so a client that goes away stops its generation).
    pub fn guard(&self) -> CancelGuard {
        CancelGuard {
            cancel: Arc::clone(&self.cancel),
            done: Arc::clone(&self.done),
        }
    }
}

/// Cancels a generation when dropped, unless it was released.
pub struct CancelGuard {
    cancel: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Relaxed) {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Relaxed) {
            self.cancel();
        }
    }
}

/// Handle to the engine thread.
pub struct Engine {
    tx: Mutex<Sender<Command>>,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    alive: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread with `model`.
    pub fn start(
        model: Box<dyn LanguageModel>,
        opts: EngineOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Engine, ServerError> {
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let max_queue = opts.max_queue;
        let batched = opts.kv_quantization.is_none()
            && model.cache_specs().iter().all(|s| match s {
                CacheSpec::Standard => true,
                CacheSpec::Rotating { keep, .. } => *keep == 0,
                CacheSpec::Arrays { .. } => false,
            });
        let state = State {
            batched,
            prefilling: PrefillBatch::new(),
            batch: DecodeBatch::new(),
            cache: PromptCache::new(opts.prompt_cache_size, opts.prompt_cache_bytes),
            opts,
            model,
            metrics: Arc::clone(&metrics),
            queued: Arc::clone(&queued),
            waiting: VecDeque::new(),
            slots: Vec::new(),
            loops: 0,
        };
        let alive2 = Arc::clone(&alive);
        let thread = std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                run(state, rx);
                alive2.store(false, Ordering::SeqCst);
            })
            .map_err(|e| ServerError::Engine(format!("cannot start the engine thread: {e}")))?;
        Ok(Engine {
            tx: Mutex::new(tx),
            queued,
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

    /// Queues `req` (its `n` choices); 429 when the queue is full, 503 when the
    /// engine is gone.
    pub fn submit(&self, req: GenerationRequest) -> Result<Submission, ApiError> {
        let n = req.n.max(1);
        let prev = self.queued.fetch_add(n, Ordering::SeqCst);
        if prev + n > self.max_queue {
            self.queued.fetch_sub(n, Ordering::SeqCst);
            self.metrics.rejected_queue_full.add(1);
            return Err(ApiError::new(
                crate::error::ErrorKind::RateLimit,
                format!(
                    "the server is busy: {prev} requests are waiting (--max-queue {})",
                    self.max_queue
                ),
            ));
        }
        self.metrics.queue_depth.set((prev + n) as u64);
        let (etx, erx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let req = Arc::new(req);
        let submitted = Instant::now();
        let choices: Vec<Arc<AtomicBool>> =
            (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        for (choice, choice_cancel) in choices.iter().enumerate() {
            let job = Job {
                req: Arc::clone(&req),
                choice,
                events: etx.clone(),
                cancel: Arc::clone(&cancel),
                choice_cancel: Arc::clone(choice_cancel),
                submitted,
            };
            if tx.send(Command::Submit(Box::new(job))).is_err() {
                self.queued.fetch_sub(n - choice, Ordering::SeqCst);
                return Err(ApiError::unavailable(
                    "the generation engine is not running",
                ));
            }
        }
        Ok(Submission {
            events: erx,
            cancel,
            choices,
            done: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Stops the engine: queued and running requests get 503; waits for the thread.
    pub fn shutdown(&self) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Shutdown);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct State {
    /// Whether sequences prefill and decode in batches (else each alone).
    batched: bool,
    prefilling: PrefillBatch,
    batch: DecodeBatch,
    opts: EngineOptions,
    model: Box<dyn LanguageModel>,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    cache: PromptCache,
    waiting: VecDeque<Box<Job>>,
    slots: Vec<Sequence>,
    loops: u64,
}

fn run(mut st: State, rx: Receiver<Command>) {
    let stream = mlx_array::Device::default_device().and_then(|d| d.new_stream());
    let stream = match stream {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("engine: cannot create an MLX stream: {e}");
            return;
        }
    };
    mlx_array::with_stream(stream, || loop {
        let idle = st.running() == 0 && st.waiting.is_empty();
        let mut shutdown = false;
        if idle {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(Command::Submit(job)) => st.waiting.push_back(job),
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => shutdown = true,
                Err(RecvTimeoutError::Timeout) => continue,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(Command::Submit(job)) => st.waiting.push_back(job),
                Ok(Command::Shutdown) | Err(TryRecvError::Disconnected) => {
                    shutdown = true;
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        if shutdown {
            st.fail_all(ApiError::unavailable("the server is shutting down"));
            return;
        }
        if catch_unwind(AssertUnwindSafe(|| st.iterate())).is_err() {
            tracing::error!("engine: a generation step panicked; failing the running requests");
            st.fail_all(ApiError::internal(
                "internal error in the generation engine",
            ));
        }
    })
}

impl State {
    fn running(&self) -> usize {
        self.slots.len() + self.prefilling.len() + self.batch.len()
    }

    fn fail_all(&mut self, err: ApiError) {
        for job in self.waiting.drain(..) {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            job.send(EngineEvent::Failed {
                choice: job.choice,
                error: err.clone(),
            });
        }
        let prefilling = self.prefilling.drain();
        for s in self
            .slots
            .drain(..)
            .chain(prefilling)
            .chain(self.batch.drain())
        {
            s.job.send(EngineEvent::Failed {
                choice: s.job.choice,
                error: err.clone(),
            });
        }
        self.metrics
            .queue_depth
            .set(self.queued.load(Ordering::SeqCst) as u64);
        self.metrics.active_sequences.set(0);
    }

    fn iterate(&mut self) {
        self.drop_cancelled();
        self.admit();
        self.prefill();
        self.decode();
        self.decode_batch();
        self.loops += 1;
        if self.loops % 256 == 0 {
            mlx_array::memory::clear_cache();
        }
        self.metrics.active_sequences.set(self.running() as u64);
        self.metrics
            .queue_depth
            .set(self.queued.load(Ordering::SeqCst) as u64);
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        let mut gone = 0u64;
        self.waiting.retain(|j| {
            gone += u64::from(j.client_gone());
            !j.cancelled()
        });
        let dropped = before - self.waiting.len();
        if dropped > 0 {
            self.queued.fetch_sub(dropped, Ordering::SeqCst);
            // The gauge first, so a reader who sees the cancellation also sees the
            // shorter queue (the end of the loop would set it one step later).
            self.metrics
                .queue_depth
                .set(self.queued.load(Ordering::SeqCst) as u64);
            self.metrics.cancelled.add(gone);
            tracing::info!("engine: {dropped} queued request(s) cancelled");
        }
        let metrics = &self.metrics;
        self.slots.retain(|s| {
            if !s.job.cancelled() {
                return true;
            }
            log_stopped(metrics, s);
            false
        });
        let gone: Vec<usize> = (0..self.prefilling.len())
            .filter(|&i| self.prefilling.rows()[i].job.cancelled())
            .collect();
        match self.prefilling.remove(&gone) {
            Ok(removed) => {
                for s in removed {
                    log_stopped(&self.metrics, &s);
                }
            }
            Err(e) => {
                let seqs = self.prefilling.drain();
                self.fail_seqs(seqs, e);
            }
        }
        let gone: Vec<(usize, Leave)> = (0..self.batch.len())
            .filter(|&i| self.batch.rows()[i].job.cancelled())
            .map(|i| (i, Leave::Dropped))
            .collect();
        if gone.is_empty() {
            return;
        }
        match self.batch.remove(gone) {
            Ok(removed) => {
                for (s, _) in removed {
                    log_stopped(&self.metrics, &s);
                }
            }
            Err(e) => self.fail_batch(e),
        }
    }

    fn admit(&mut self) {
        while self.running() < self.opts.decode_concurrency {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!(
                "engine: admitted {:.1} ms after submission",
                job.submitted.elapsed().as_secs_f64() * 1e3
            );
            let prompt = &job.req.prompt;
            let (caches, cached) = match self.cache.fetch_nearest(prompt) {
                Some(hit) => {
                    self.metrics.cache_hits.add(1);
                    (hit.caches, hit.cached_tokens)
                }
                None => {
                    self.metrics.cache_misses.add(1);
                    match mlx_cache::make_prompt_cache(&self.model.cache_specs(), None) {
                        Ok(c) => (c, 0),
                        Err(e) => {
                            job.send(EngineEvent::Failed {
                                choice: job.choice,
                                error: ApiError::unavailable(format!(
                                    "cannot make a KV cache: {e}"
                                )),
                            });
                            continue;
                        }
                    }
                }
            };
            self.metrics.prompt_tokens.add(prompt.len() as u64);
            self.metrics.cached_prompt_tokens.add(cached as u64);
            let choice = job.choice;
            let events = job.events.clone();
            match Sequence::new(*job, caches, cached) {
                Ok(seq) => {
                    seq.job.send(EngineEvent::Started {
                        choice,
                        cached_tokens: cached,
                    });
                    self.slots.push(seq);
                }
                Err(error) => {
                    let _ = events.send(EngineEvent::Failed { choice, error });
                }
            }
        }
        if let Some(limit) = self.opts.prompt_cache_bytes {
            let active: u64 = self.slots.iter().map(|s| s.nbytes() as u64).sum::<u64>()
                + (self.prefilling.nbytes() + self.batch.nbytes()) as u64;
            self.cache.trim_to(usize::MAX, limit.saturating_sub(active));
            self.update_cache_metrics();
        }
    }

    fn update_cache_metrics(&self) {
        self.metrics.cache_entries.set(self.cache.len() as u64);
        self.metrics.cache_bytes.set(self.cache.nbytes());
    }

    fn fail(&mut self, i: usize, error: ApiError) {
        let s = self.slots.remove(i);
        self.fail_seq(s, error);
    }

    fn fail_seq(&self, s: Sequence, error: ApiError) {
        if error.status.is_server_error() {
            self.metrics.engine_errors.add(1);
            tracing::warn!("engine: request failed: {}", error.message);
        }
        s.job.send(EngineEvent::Failed {
            choice: s.job.choice,
            error,
        });
    }

    fn prefill(&mut self) {
        if self.batched {
            return self.prefill_batched();
        }
        let mut budget = self.opts.prompt_concurrency;
        let mut i = 0;
        while i < self.slots.len() && budget > 0 {
            if self.slots[i].decoding() {
                i += 1;
                continue;
            }
            budget -= 1;
            let (step, kv) = (self.opts.prefill_step_size, self.opts.kv_quantization);
            let model = self.model.as_ref();
            let tic = Instant::now();
            let r = self.slots[i].prefill(model, step, kv);
            self.metrics
                .prefill_micros
                .add(tic.elapsed().as_micros() as u64);
            match r {
                Ok(Prefill::Chunk(processed, total)) => {
                    send_progress(&self.slots[i], processed, total);
                    i += 1;
                }
                Ok(Prefill::Started) => i += 1,
                Err(e) => self.fail(i, e),
            }
        }
    }

    /// Batched mode: sequences with only their last prompt token left (a prompt-cache
    /// hit) join the decode batch; up to `prompt_concurrency` others prefill together,
    /// one chunk each per loop, and join it once prefilled.
    fn prefill_batched(&mut self) {
        let (ready, rest): (Vec<Sequence>, Vec<Sequence>) = self
            .slots
            .drain(..)
            .partition(|s| s.last_prompt_token().is_some());
        self.slots = rest;
        if let Err((seqs, e)) = self.batch.join(ready) {
            self.fail_seqs(seqs, e);
        }
        let room = self
            .opts
            .prompt_concurrency
            .saturating_sub(self.prefilling.len())
            .min(self.slots.len());
        let new: Vec<Sequence> = self.slots.drain(..room).collect();
        if let Err((seqs, e)) = self.prefilling.add(new) {
            self.fail_seqs(seqs, e);
        }
        if self.prefilling.is_empty() {
            return;
        }
        let tic = Instant::now();
        let stepped = self
            .prefilling
            .step(self.model.as_ref(), self.opts.prefill_step_size);
        let took = tic.elapsed();
        self.metrics.prefill_micros.add(took.as_micros() as u64);
        tracing::debug!(
            "engine: prefill step of {} prompt(s) in {:.1} ms ({})",
            self.prefilling.len(),
            took.as_secs_f64() * 1e3,
            mlx_array::memory::note(),
        );
        match stepped {
            Ok(progress) => {
                for (i, processed, total) in progress {
                    send_progress(&self.prefilling.rows()[i], processed, total);
                }
            }
            Err(e) => {
                let seqs = self.prefilling.drain();
                return self.fail_seqs(seqs, e);
            }
        }
        match self.prefilling.take_ready() {
            Ok(Some((seqs, cache))) => {
                let n = seqs.len();
                if let Err((seqs, e)) = self.batch.join_prefilled(seqs, cache) {
                    self.fail_seqs(seqs, e);
                }
                tracing::debug!(
                    "engine: {n} prefilled sequence(s) joined decoding, {} decoding ({})",
                    self.batch.len(),
                    mlx_array::memory::note(),
                );
            }
            Ok(None) => {}
            Err(e) => {
                let seqs = self.prefilling.drain();
                self.fail_seqs(seqs, e);
            }
        }
    }

    fn fail_seqs(&self, seqs: Vec<Sequence>, e: ApiError) {
        for s in seqs {
            self.fail_seq(s, e.clone());
        }
    }

    fn decode(&mut self) {
        let model = self.model.as_ref();
        let kv = self.opts.kv_quantization;
        let mut nexts: Vec<Option<(Array, Array)>> = Vec::with_capacity(self.slots.len());
        let mut failed: Vec<(usize, ApiError)> = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !s.decoding() {
                nexts.push(None);
                continue;
            }
            match s.queue_next(model, kv) {
                Ok(n) => {
                    if n.is_some() {
                        self.metrics.decode_steps.add(1);
                        self.metrics.decode_rows.add(1);
                    }
                    nexts.push(n)
                }
                Err(e) => {
                    nexts.push(None);
                    failed.push((i, e));
                }
            }
        }
        let pending: Vec<&Array> = nexts.iter().flatten().flat_map(|(y, lp)| [y, lp]).collect();
        if !pending.is_empty() {
            if let Err(e) = transforms::async_eval(&pending) {
                tracing::warn!("engine: batched evaluation failed ({e}); evaluating per sequence");
                for (i, n) in nexts.iter().enumerate() {
                    if let Some((y, lp)) = n {
                        if let Err(e) = transforms::eval(&[y, lp]) {
                            failed.push((i, mlx_err(e)));
                        }
                    }
                }
            }
        }
        let now = Instant::now();
        let mut finished: Vec<(usize, bool)> = Vec::new();
        for (i, next) in nexts.into_iter().enumerate() {
            if failed.iter().any(|(f, _)| *f == i) {
                continue;
            }
            let s = &mut self.slots[i];
            if !s.decoding() {
                continue;
            }
            match s.emit(next) {
                Ok(out) => {
                    count_token(&self.metrics, s.last_token_at, s.job.submitted, now);
                    s.last_token_at = Some(now);
                    let done = out.finish.is_some();
                    let delivered = s.job.send(EngineEvent::Token {
                        choice: s.job.choice,
                        out,
                    });
                    if done || !delivered {
                        finished.push((i, done && delivered));
                    }
                }
                Err(e) => failed.push((i, e)),
            }
        }
        // Remove from the back so indices stay valid.
        let mut removals: Vec<(usize, Option<ApiError>, bool)> = failed
            .into_iter()
            .map(|(i, e)| (i, Some(e), false))
            .chain(finished.into_iter().map(|(i, keep)| (i, None, keep)))
            .collect();
        removals.sort_by_key(|r| std::cmp::Reverse(r.0));
        removals.dedup_by_key(|r| r.0);
        for (i, err, keep) in removals {
            match err {
                Some(e) => self.fail(i, e),
                None => {
                    let s = self.slots.remove(i);
                    if keep {
                        self.store(s);
                    } else if s.job.client_gone() {
                        self.metrics.cancelled.add(1);
                    }
                }
            }
        }
    }

    /// Sequences done with their prefill join the batch, then one batched step runs;
    /// finished, failed and abandoned rows leave it.
    fn decode_batch(&mut self) {
        if !self.batched || self.batch.is_empty() {
            return;
        }
        let rows = self.batch.len() as u64;
        let (emitted, failed) = match self.batch.step(self.model.as_ref()) {
            Ok(r) => r,
            Err(e) => return self.fail_batch(e),
        };
        self.metrics.decode_steps.add(1);
        self.metrics.decode_rows.add(rows);
        tracing::trace!(
            "engine: decoding step of {rows} row(s) queued ({})",
            mlx_array::memory::note()
        );
        let now = Instant::now();
        let mut leaving: Vec<(usize, Leave)> = Vec::new();
        let mut reasons: Vec<Option<ApiError>> = Vec::new();
        for (i, e) in failed {
            if !leaving.iter().any(|(j, _)| *j == i) {
                leaving.push((i, Leave::Dropped));
                reasons.push(Some(e));
            }
        }
        for (i, out) in emitted {
            if leaving.iter().any(|(j, _)| *j == i) {
                continue;
            }
            let s = &self.batch.rows()[i];
            count_token(&self.metrics, s.last_token_at, s.job.submitted, now);
            let done = out.finish.is_some();
            let delivered = s.job.send(EngineEvent::Token {
                choice: s.job.choice,
                out,
            });
            if let Some(s) = self.batch.row_mut(i) {
                s.last_token_at = Some(now);
            }
            if done || !delivered {
                let how = if done && delivered {
                    Leave::Finished
                } else {
                    Leave::Dropped
                };
                leaving.push((i, how));
                reasons.push(None);
            }
        }
        let removed = match self.batch.remove(leaving) {
            Ok(r) => r,
            Err(e) => return self.fail_batch(e),
        };
        for ((s, caches), reason) in removed.into_iter().zip(reasons) {
            match (reason, caches) {
                (Some(e), _) => self.fail_seq(s, e),
                (None, Some(caches)) => self.store_caches(s.processed, caches),
                (None, None) => {
                    if s.job.client_gone() {
                        self.metrics.cancelled.add(1);
                    }
                }
            }
        }
    }

    /// A batched step failed: every row gets the error, the batch starts over.
    fn fail_batch(&mut self, e: ApiError) {
        tracing::warn!("engine: batched decoding failed: {}", e.message);
        for s in self.batch.drain() {
            self.fail_seq(s, e.clone());
        }
    }

    /// Keeps a finished sequence's caches for later prompts sharing its prefix.
    fn store(&mut self, s: Sequence) {
        let Sequence {
            caches, processed, ..
        } = s;
        self.store_caches(processed, caches);
    }

    fn store_caches(&mut self, processed: Vec<u32>, caches: LayerCaches) {
        if self.opts.prompt_cache_size == 0 {
            return;
        }
        let consistent = caches
            .first()
            .is_none_or(|c| c.offset() as usize == processed.len());
        if consistent {
            self.cache.insert(processed, caches, CacheKind::Assistant);
            self.update_cache_metrics();
        }
    }
}

/// Metrics of one emitted token: time to first token, else time since the previous one.
fn count_token(metrics: &Metrics, last: Option<Instant>, submitted: Instant, now: Instant) {
    metrics.generation_tokens.add(1);
    match last {
        None => {
            let ttft = (now - submitted).as_secs_f64();
            tracing::debug!("engine: first token {:.1} ms after submission", ttft * 1e3);
            metrics.ttft.observe(ttft)
        }
        Some(t) => metrics.tpot.observe((now - t).as_secs_f64()),
    }
}

/// Logs (and counts, for a client that went away) a sequence dropped mid-generation.
fn log_stopped(metrics: &Metrics, s: &Sequence) {
    if s.job.client_gone() {
        metrics.cancelled.add(1);
        tracing::info!(
            "engine: client disconnected; generation stopped after {} tokens",
            s.generated
        );
    } else {
        tracing::debug!(
            "engine: choice {} stopped after {} tokens",
            s.job.choice,
            s.generated
        );
    }
}

/// Tells a request how far its prompt processing got.
fn send_progress(s: &Sequence, processed: usize, total: usize) {
    tracing::debug!("prompt processing progress: {processed}/{total}");
    s.job.send(EngineEvent::Progress {
        choice: s.job.choice,
        processed,
        total,
    });
}

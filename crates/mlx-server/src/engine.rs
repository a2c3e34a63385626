//! The server's handle to the generation engine (`mlx_engine::batch::Engine`, one
//! thread that owns the model and every MLX evaluation): requests go in with a tokio
//! channel for their events, engine errors come out as HTTP errors.
use crate::error::{ApiError, ServerError};
pub use mlx_engine::batch::CancelGuard;
use mlx_engine::batch::{self, EngineEvent, EngineOptions, EventSink};
use mlx_engine::batch::{EngineMetrics, GenerationRequest};
use mlx_models::LanguageModel;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// A request's events, delivered to its HTTP handler.
struct Events(UnboundedSender<EngineEvent>);

impl EventSink for Events {
    fn send(&self, event: EngineEvent) -> bool {
        self.0.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// A submitted request: its events, and cancellation when dropped before it is
/// [released](Submission::release).
pub struct Submission {
    /// Events of all choices.
    pub events: UnboundedReceiver<EngineEvent>,
    handle: batch::Submission,
    _use: Vec<InUse>,
}

/// Counts a submission as using its engine until dropped (the model pool never unloads
/// an engine in use), and stamps when the last use ended (for idle unloading).
struct InUse(Arc<Usage>);

/// How an engine is used: submissions alive, and when the last one ended.
struct Usage {
    active: AtomicUsize,
    epoch: Instant,
    /// Milliseconds after `epoch` at which the last submission ended.
    last_done_ms: AtomicU64,
}

impl Usage {
    fn acquire(self: &Arc<Usage>) -> InUse {
        self.active.fetch_add(1, Ordering::SeqCst);
        InUse(Arc::clone(self))
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let ms = (self.0.epoch.elapsed().as_millis() as u64).max(1);
        self.0.last_done_ms.fetch_max(ms, Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Submission {
    /// A submission fed by `events` instead of the engine (to drive [`crate::output`]
    /// directly, e.g. in tests).
    pub fn from_events(events: UnboundedReceiver<EngineEvent>) -> Submission {
        Submission {
            events,
            handle: batch::Submission::detached(),
            _use: Vec::new(),
        }
    }

    /// Stops the generation: the client is gone (also done on drop).
    pub fn cancel(&self) {
        self.handle.cancel();
    }

    /// Stops one choice (the others go on).
    pub fn cancel_choice(&self, choice: usize) {
        self.handle.cancel_choice(choice);
    }

    /// The answer is complete: stops whatever still runs without counting it as a
    /// client disconnect.
    pub fn release(&self) {
        self.handle.release();
    }

    /// The cancel flag, weakly (for watchers of the client connection).
    pub fn flag(&self) -> std::sync::Weak<AtomicBool> {
        self.handle.flag()
    }

    /// The flag set once the answer is complete ([`Submission::release`]), weakly.
    pub fn done_flag(&self) -> std::sync::Weak<AtomicBool> {
        self.handle.done_flag()
    }

    /// A guard that cancels the generation when dropped before the answer is complete.
    pub fn guard(&self) -> CancelGuard {
        self.handle.guard()
    }
}

fn new_usage() -> Arc<Usage> {
    Arc::new(Usage {
        active: AtomicUsize::new(0),
        epoch: Instant::now(),
        last_done_ms: AtomicU64::new(0),
    })
}

/// Handle to the engine thread.
pub struct Engine {
    inner: Arc<batch::Engine>,
    usage: Arc<Usage>,
    /// The usage of the engine this handle shares (see [`Engine::share`]).
    parent: Option<Arc<Usage>>,
}

impl Engine {
    /// Starts the engine thread with `model` (and `draft`, the draft model of
    /// speculative decoding), counting into `metrics`.
    pub fn start(
        model: Box<dyn LanguageModel>,
        draft: Option<Box<dyn LanguageModel>>,
        opts: EngineOptions,
        metrics: Arc<EngineMetrics>,
    ) -> Result<Engine, ServerError> {
        // A few queries' attention one query at a time on the GPU (`MLX_SDPA_SPLIT_QUERIES=0`
        // keeps MLX's): a speculating batch's verification would otherwise build a cuDNN
        // plan at every step (~45 ms on the H200), and the server's batches are not
        // mlx-lm's bits on a GPU either way (docs/parity.md).
        mlx_nn::attention::set_split_queries_default(true);
        // A prompt's attention padded to 256-multiples (`MLX_SDPA_BUCKET` decides where
        // set): cuDNN builds a plan for every new attention shape (~35 ms on an H100), and
        // a server's prompts come in every length (GPU.md session 47).
        mlx_nn::attention::set_bucket_default(256);
        let inner = batch::Engine::start_with_draft(model, draft, opts, metrics)
            .map_err(|e| ServerError::Engine(e.to_string()))?;
        Ok(Engine {
            inner: Arc::new(inner),
            usage: new_usage(),
            parent: None,
        })
    }

    /// Another handle to the same engine thread with its own usage count (a resident
    /// adapter's requests); its submissions count as uses of this handle too.
    pub fn share(&self) -> Engine {
        Engine {
            inner: Arc::clone(&self.inner),
            usage: new_usage(),
            parent: Some(Arc::clone(&self.usage)),
        }
    }

    /// Runs `task` with the model on the engine thread between two steps.
    pub fn with_model(&self, task: batch::ModelTask) -> Result<(), ApiError> {
        Ok(self.inner.with_model(task)?)
    }

    /// Drops the prompt-cache entries of resident adapter `adapter`.
    pub fn forget_adapter(&self, adapter: u32) {
        self.inner.forget_adapter(adapter)
    }

    /// Submissions whose answers are still being produced.
    pub fn in_use(&self) -> usize {
        self.usage.active.load(Ordering::SeqCst)
    }

    /// When the last submission ended (`None` before any did).
    pub fn last_done(&self) -> Option<Instant> {
        match self.usage.last_done_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(self.usage.epoch + Duration::from_millis(ms)),
        }
    }

    /// Whether the engine thread is running.
    pub fn is_healthy(&self) -> bool {
        self.inner.is_healthy()
    }

    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }

    /// Queues `req` (its `n` choices); 429 when the queue is full, 503 when the
    /// engine is gone.
    pub fn submit(&self, req: GenerationRequest) -> Result<Submission, ApiError> {
        let mut in_use = vec![self.usage.acquire()];
        in_use.extend(self.parent.as_ref().map(|p| p.acquire()));
        let (tx, events) = unbounded_channel();
        let handle = self.inner.submit(req, Arc::new(Events(tx)))?;
        Ok(Submission {
            events,
            handle,
            _use: in_use,
        })
    }

    /// Stops the engine: queued and running requests get 503; waits for the thread.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

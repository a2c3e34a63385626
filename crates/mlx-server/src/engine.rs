//! The server's handle to the generation engine (`mlx_engine::batch::Engine`, one
//! thread that owns the model and every MLX evaluation): requests go in with a tokio
//! channel for their events, engine errors come out as HTTP errors.
use crate::error::{ApiError, ServerError};
pub use mlx_engine::batch::CancelGuard;
use mlx_engine::batch::{self, EngineEvent, EngineOptions, EventSink};
use mlx_engine::batch::{EngineMetrics, GenerationRequest};
use mlx_models::LanguageModel;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
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
}

impl Submission {
    /// A submission fed by `events` instead of the engine (to drive [`crate::output`]
    /// directly, e.g. in tests).
    pub fn from_events(events: UnboundedReceiver<EngineEvent>) -> Submission {
        Submission {
            events,
            handle: batch::Submission::detached(),
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

    /// A guard that cancels the generation when dropped before the answer is complete.
    pub fn guard(&self) -> CancelGuard {
        self.handle.guard()
    }
}

/// Handle to the engine thread.
pub struct Engine {
    inner: batch::Engine,
}

impl Engine {
    /// Starts the engine thread with `model`, counting into `metrics`.
    pub fn start(
        model: Box<dyn LanguageModel>,
        opts: EngineOptions,
        metrics: Arc<EngineMetrics>,
    ) -> Result<Engine, ServerError> {
        let inner = batch::Engine::start(model, opts, metrics)
            .map_err(|e| ServerError::Engine(e.to_string()))?;
        Ok(Engine { inner })
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
        let (tx, events) = unbounded_channel();
        let handle = self.inner.submit(req, Arc::new(Events(tx)))?;
        Ok(Submission { events, handle })
    }

    /// Stops the engine: queued and running requests get 503; waits for the thread.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

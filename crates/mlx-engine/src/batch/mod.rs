//! Continuous batching (mlx-lm's `BatchGenerator`): one engine thread schedules many
//! sequences through prefill and decode stages, each decoding step one forward pass for
//! every sequence, each sequence with its own sampler, logits processors and stop
//! sequences. The HTTP server and [`BatchGenerator`] (`mlx-benchmark -b N`) drive it.
//!
//! [`Engine`] is the handle: [`Engine::submit`] queues a [`GenerationRequest`] and
//! returns a [`Submission`]; the request's [`EngineEvent`]s go to the caller's
//! [`EventSink`]. Errors are [`crate::EngineError`]s: `Invalid` (the request),
//! `Busy` (the queue is full), `Unavailable` (an MLX failure, a shutdown), `Internal`.
mod admission;
mod alone;
mod decode;
mod disk_cache;
mod generator;
mod guard;
mod metrics;
mod prefill;
mod prompt_cache;
mod request;
mod scheduler;
mod sequence;
mod speculate;
mod stage;
mod stop;
mod width;

pub use admission::{Admit, MemoryAdmission};
pub use decode::{masks_beside_steps, masks_first_steps};
pub use disk_cache::{file_metadata, DiskCache, DiskCacheOptions, DiskHit};
pub use generator::{BatchGenerator, BatchOptions, BatchResponse, BatchStats};
pub use metrics::{Counter, EngineMetrics, Gauge, Histogram};
pub use prompt_cache::{copy_caches, CacheHit, CacheKind, PromptCache};
pub use request::{
    CancelGuard, DraftFrom, EngineEvent, EventSink, Finish, GenerationRequest, PromptLogprob,
    SeqId, Speculate, Submission, TokenOut,
};
pub use scheduler::{Engine, EngineOptions, ModelTask};
pub use stop::StopMatcher;
pub use width::DraftWidth;

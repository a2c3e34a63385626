//! What every stage of the scheduler (prefilling, decoding, decoding alone) offers, so
//! that cancellation, removal and the routing of results work by sequence id the same
//! way for all of them.
use super::request::{Finish, PromptLogprob, SeqId, TokenOut};
use super::sequence::Sequence;
use crate::error::{EngineError, Result};
use mlx_cache::PromptCache;

/// What a stage's step produced for one sequence.
pub(crate) enum Outcome {
    /// A prefill chunk finished: `processed` of `total` uncached prompt tokens.
    Progress {
        /// Prompt tokens processed so far.
        processed: usize,
        /// Prompt tokens to process.
        total: usize,
    },
    /// The prompt is processed (requests with prompt log-probabilities or
    /// `max_tokens` 0); `finish` set when the sequence ends here.
    Prompt {
        /// Log-probabilities of prompt tokens `1..`.
        logprobs: Vec<PromptLogprob>,
        /// `Some` when no token is to be generated.
        finish: Option<Finish>,
    },
    /// A token.
    Token(TokenOut),
    /// The sequence failed (the others go on).
    Failed(EngineError),
    /// A prefill chunk ended a prompt segment: the caches holding `tokens`, to store
    /// in the prompt cache as `kind`.
    Checkpoint {
        /// The prompt tokens the caches hold.
        tokens: Vec<u32>,
        /// A copy of the sequence's caches.
        caches: PromptCache,
        /// Their kind.
        kind: super::prompt_cache::CacheKind,
    },
}

/// How a sequence leaves a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Finished: its caches go to the prompt cache.
    Finished,
    /// Dropped (cancelled, failed, or its receiver gone).
    Dropped,
}

/// A sequence that left a stage, with its caches when it finished.
pub(crate) struct Left {
    /// The sequence.
    pub seq: Sequence,
    /// Its caches (finished sequences only).
    pub caches: Option<PromptCache>,
}

/// A stage holding sequences by id.
pub(crate) trait Stage {
    /// Sequences in the stage.
    fn len(&self) -> usize;
    /// Bytes of KV cache the stage holds.
    fn nbytes(&self) -> usize;
    /// The sequence `id`, if it is here.
    fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence>;
    /// Ids of the sequences its next step runs (those waiting in it excluded).
    fn stepping(&self) -> Vec<SeqId>;
    /// Ids of the sequences no longer wanted.
    fn cancelled(&self) -> Vec<SeqId>;
    /// Takes sequences out by id (ids not here are ignored). An `Err` means the
    /// stage's shared state is broken: the caller drains it.
    fn remove(&mut self, leaving: &[(SeqId, Leave)]) -> Result<Vec<Left>>;
    /// Empties the stage, handing every sequence back (after a failure).
    fn drain(&mut self) -> Vec<Sequence>;
}

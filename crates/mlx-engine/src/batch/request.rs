//! What a caller hands the scheduler (a [`GenerationRequest`] and an [`EventSink`]) and
//! what it gets back: [`EngineEvent`]s, and a [`Submission`] to cancel with.
use super::prompt_cache::CacheKind;
use crate::error::EngineError;
use crate::step::Sampling;
use mlx_sample::{BuildProcessor, LogitsParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What one request asks of the engine.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most; 0 ends the sequence once its prompt is processed
    /// (scoring: with `prompt_logprobs`, an [`EngineEvent::Prompt`] and nothing else).
    pub max_tokens: usize,
    /// Sampler settings.
    pub sampling: Sampling,
    /// mlx-lm's logits processors (bias and penalties).
    pub logits: LogitsParams,
    /// Further logits processors, built fresh for every choice and applied after
    /// `logits`'s (e.g. a grammar).
    pub processors: Vec<Arc<dyn BuildProcessor>>,
    /// Token sequences that end generation: EOS ids first, then the encoded stop words.
    pub stop_sequences: Vec<Vec<u32>>,
    /// Log-probability of each token wanted.
    pub logprobs: bool,
    /// Number of alternatives per position wanted (0: none).
    pub top_logprobs: usize,
    /// Independent completions of the same prompt (OpenAI's `n`).
    pub n: usize,
    /// mlx-lm's prompt segments: the end of each (prompt positions, ascending, the last
    /// one the prompt's length) and the prompt-cache kind of the cache at that end.
    /// Batched prefill chunks stop at every end and store the cache there (a
    /// checkpoint), so that a later prompt sharing only that prefix (a chat whose
    /// template drops earlier reasoning, another chat with the same system prompt)
    /// reuses it. Empty: one segment of kind [`CacheKind::Assistant`], as mlx-lm does
    /// for prompts that are not chats.
    pub segments: Vec<(usize, CacheKind)>,
    /// Log-probability of every prompt token after the first (with `top_logprobs`
    /// alternatives), from the prefill's logits: the prompt is processed in full (no
    /// prompt-cache reuse) and an [`EngineEvent::Prompt`] precedes the first token.
    pub prompt_logprobs: bool,
    /// The resident LoRA adapter the sequence runs with (`0`: the base model): an id
    /// given to adapters added with [`super::Engine::with_model`] (see
    /// `mlx_nn::lora::ResidentLoraLinear`); rows with different adapters share batches.
    pub adapter: u32,
    /// Speculative decoding of this request (`None`: plain decoding).
    pub speculate: Option<Speculate>,
}

/// Where a speculating request's drafts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftFrom {
    /// The engine's draft model ([`super::Engine::start_with_draft`]).
    DraftModel,
    /// Prompt lookup in the given tokens (e.g. OpenAI's predicted output), then in the
    /// text generated so far.
    Prediction(Vec<u32>),
}

/// Speculative decoding asked for by a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speculate {
    /// Where the drafts come from.
    pub from: DraftFrom,
    /// Tokens drafted per round (1 to [`crate::speculative::MAX_NUM_DRAFT_TOKENS`]).
    pub num_draft_tokens: usize,
}

impl GenerationRequest {
    /// A request for up to `max_tokens` tokens after `prompt`, greedy, nothing else set.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
        GenerationRequest {
            prompt,
            max_tokens,
            sampling: Sampling::default(),
            logits: LogitsParams::default(),
            processors: Vec::new(),
            stop_sequences: Vec::new(),
            logprobs: false,
            top_logprobs: 0,
            n: 1,
            segments: Vec::new(),
            prompt_logprobs: false,
            adapter: 0,
            speculate: None,
        }
    }

    /// Whether the log-probability of each token is wanted.
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs || self.top_logprobs > 0
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// EOS or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The output constraint reached a dead end (no token of the vocabulary can
    /// continue it validly): the output is incomplete. Its token (an EOS the
    /// constraint forced, or a token it had to reject) is not part of the output.
    Constraint,
}

impl Finish {
    /// OpenAI's `finish_reason`; a constraint's dead end is `"error"` (vLLM's reason
    /// for a sequence the engine could not finish).
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Constraint => "error",
        }
    }
}

/// One generated token.
#[derive(Debug, Clone)]
pub struct TokenOut {
    /// Token id.
    pub token: u32,
    /// Its log-probability (when asked for).
    pub logprob: Option<f32>,
    /// The most likely alternatives `(id, logprob)` (when asked for).
    pub top: Vec<(u32, f32)>,
    /// Set on the last token.
    pub finish: Option<Finish>,
    /// Which of the request's stop sequences ended it (when `finish` is `Stop`).
    pub stop_index: Option<usize>,
    /// Speculative decoding: the token was a draft token the model accepted.
    pub from_draft: bool,
    /// Speculative decoding: draft tokens proposed in the round this token opens (0 on
    /// the other tokens of a round and without speculation).
    pub drafted: usize,
}

/// The log-probability of one prompt token given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The prompt token.
    pub token: u32,
    /// Its log-probability (float32 log-softmax of the logits at the position before).
    pub logprob: f32,
    /// The most likely alternatives at that position `(id, logprob)`, unsorted (as
    /// [`TokenOut::top`]).
    pub top: Vec<(u32, f32)>,
}

/// What the engine tells a request, tagged with the choice index.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// The sequence got a slot; `cached_tokens` prompt tokens came from the prompt cache.
    Started {
        /// Choice index.
        choice: usize,
        /// Prompt tokens reused from the prompt cache.
        cached_tokens: usize,
    },
    /// A prefill chunk finished.
    Progress {
        /// Choice index.
        choice: usize,
        /// Prompt tokens processed so far (of those not cached).
        processed: usize,
        /// Prompt tokens to process.
        total: usize,
    },
    /// The prompt is processed (sent for requests with `prompt_logprobs` or
    /// `max_tokens` 0, before any token): the log-probabilities of prompt tokens
    /// `1..` (empty unless `prompt_logprobs`).
    Prompt {
        /// Choice index.
        choice: usize,
        /// One entry per prompt token after the first, in order.
        logprobs: Vec<PromptLogprob>,
        /// `Some(Finish::Length)` when the sequence ends here (`max_tokens` 0).
        finish: Option<Finish>,
    },
    /// A token.
    Token {
        /// Choice index.
        choice: usize,
        /// The token.
        out: TokenOut,
    },
    /// The sequence failed; no more events follow for this choice.
    Failed {
        /// Choice index.
        choice: usize,
        /// What went wrong.
        error: EngineError,
    },
}

/// Where a request's events go (a channel of the caller's choice).
pub trait EventSink: Send + Sync {
    /// Delivers an event; `false` when the receiver is gone.
    fn send(&self, event: EngineEvent) -> bool;

    /// Whether the receiver is gone (checked between steps; `false` if unknown).
    fn is_closed(&self) -> bool {
        false
    }
}

impl EventSink for std::sync::mpsc::Sender<EngineEvent> {
    fn send(&self, event: EngineEvent) -> bool {
        std::sync::mpsc::Sender::send(self, event).is_ok()
    }
}

/// A stable sequence id, handed out when a choice is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// One queued or running choice of a request.
pub(crate) struct Job {
    /// Its id.
    pub id: SeqId,
    /// The request (shared by the `n` choices).
    pub req: Arc<GenerationRequest>,
    /// Choice index.
    pub choice: usize,
    /// Where events go.
    pub events: Arc<dyn EventSink>,
    /// Set when the client went away.
    pub cancel: Arc<AtomicBool>,
    /// Set when this choice alone is no longer wanted (its text hit a stop word).
    pub choice_cancel: Arc<AtomicBool>,
    /// When the request was submitted.
    pub submitted: Instant,
}

impl Job {
    /// Whether the choice is no longer wanted.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
            || self.choice_cancel.load(Ordering::Relaxed)
            || self.events.is_closed()
    }

    /// Whether the client went away (as opposed to the choice being stopped on purpose).
    pub fn client_gone(&self) -> bool {
        !self.choice_cancel.load(Ordering::Relaxed)
            && (self.cancel.load(Ordering::Relaxed) || self.events.is_closed())
    }

    /// Sends an event; `false` when the receiver is gone.
    pub fn send(&self, e: EngineEvent) -> bool {
        self.events.send(e)
    }

    /// Sends `Failed`.
    pub fn fail(&self, error: EngineError) {
        self.send(EngineEvent::Failed {
            choice: self.choice,
            error,
        });
    }
}

/// A submitted request: cancels its generation when dropped before it is
/// [released](Submission::release).
pub struct Submission {
    cancel: Arc<AtomicBool>,
    choices: Vec<Arc<AtomicBool>>,
    done: Arc<AtomicBool>,
}

impl Submission {
    pub(crate) fn new(cancel: Arc<AtomicBool>, choices: Vec<Arc<AtomicBool>>) -> Submission {
        Submission {
            cancel,
            choices,
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A handle tied to no generation (for callers that feed events themselves).
    pub fn detached() -> Submission {
        Submission::new(Arc::new(AtomicBool::new(false)), Vec::new())
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

    /// The flag [`Submission::release`] sets, weakly: a watcher of the client connection
    /// leaves an answer that is complete alone.
    pub fn done_flag(&self) -> std::sync::Weak<AtomicBool> {
        Arc::downgrade(&self.done)
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

impl Drop for Submission {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Relaxed) {
            self.cancel();
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

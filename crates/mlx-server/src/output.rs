//! From engine events to answer pieces: detokenization, reasoning / tool-call routing,
//! tool-call parsing and log-probabilities, shared by every endpoint.
use crate::engine::Submission;
use crate::error::ApiError;
use crate::text::{Channel, Markers, Piece, TextRouter};
use crate::tools::{ParsedCall, ToolFormat};
use mlx_engine::batch::{EngineEvent, Finish, PromptLogprob, TokenOut};
use mlx_tokenizer::{Detokenizer, StreamingDetokenizer, Tokenizer};
use serde_json::{json, Value as Json};
use std::sync::Arc;

/// How a request's output is read.
#[derive(Clone)]
pub struct OutputSpec {
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Markers (think, tool, stop words).
    pub markers: Markers,
    /// Where the answer starts (reasoning when the prompt opened a think section).
    pub initial: Channel,
    /// The tool-call format, when tools are in play.
    pub tool_format: Option<ToolFormat>,
    /// The request's tools (schemas for value conversion).
    pub tools: Option<Vec<Json>>,
    /// Number of choices.
    pub n: usize,
    /// How many of the engine's stop sequences are single stop tokens (EOS ids and
    /// `stop_token_ids`; the stop words follow).
    pub n_eos: usize,
    /// Stop words end a choice only once it has this many tokens (vLLM's `min_tokens`).
    pub min_tokens: usize,
}

/// A tool call ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallOut {
    /// Call id.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as a JSON object.
    pub arguments: Json,
}

impl ToolCallOut {
    /// Arguments as the JSON string OpenAI sends.
    pub fn arguments_string(&self) -> String {
        // mlx-lm's `json.dumps(arguments, ensure_ascii=False)`.
        mlx_tokenizer::py_json_dumps(&self.arguments, false)
    }
}

/// One token's log-probability with its alternatives.
#[derive(Debug, Clone)]
pub struct LogprobOut {
    /// Token id.
    pub id: u32,
    /// Decoded token text.
    pub token: String,
    /// Log-probability.
    pub logprob: f32,
    /// Alternatives, most likely first: (id, text, logprob).
    pub top: Vec<(u32, String, f32)>,
}

impl LogprobOut {
    /// OpenAI chat's `logprobs.content[i]` entry.
    pub fn chat_json(&self) -> Json {
        let top: Vec<Json> = self
            .top
            .iter()
            .map(|(id, t, lp)| json!({"id": id, "token": t, "logprob": lp, "bytes": t.as_bytes()}))
            .collect();
        json!({"id": self.id, "token": self.token, "logprob": self.logprob,
               "bytes": self.token.as_bytes(), "top_logprobs": top})
    }
}

/// New output of one choice.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    /// Visible text.
    pub content: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Completed tool calls.
    pub tool_calls: Vec<ToolCallOut>,
    /// Log-probabilities of the tokens of this delta.
    pub logprobs: Vec<LogprobOut>,
}

impl Delta {
    /// Whether there is anything to send.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
            && self.reasoning.is_empty()
            && self.tool_calls.is_empty()
            && self.logprobs.is_empty()
    }
}

/// What a generation produces, in order.
#[derive(Debug)]
pub enum Update {
    /// A choice got its slot.
    Started {
        /// Prompt tokens reused from the prompt cache.
        cached_tokens: usize,
    },
    /// Prefill progress (for keep-alive comments).
    Progress {
        /// Processed prompt tokens.
        processed: usize,
        /// Prompt tokens to process.
        total: usize,
    },
    /// The prompt's log-probabilities (requests with `prompt_logprobs`), before any
    /// [`Update::Delta`] of the choice: one entry per prompt token after the first.
    Prompt {
        /// Choice index.
        choice: usize,
        /// The entries.
        logprobs: Vec<LogprobOut>,
    },
    /// New output.
    Delta {
        /// Choice index.
        choice: usize,
        /// The output.
        delta: Delta,
    },
    /// A choice ended.
    Finished {
        /// Choice index.
        choice: usize,
        /// `stop`, `length` or `tool_calls`.
        reason: &'static str,
        /// The stop word that ended it, if one did.
        stop_word: Option<String>,
    },
    /// The request failed.
    Failed(ApiError),
}

struct ChoiceOutput {
    detok: Detokenizer,
    router: TextRouter,
    tool_text: String,
    made_tool_call: bool,
    /// Llama 3 answers that start with `{` may be a JSON tool call: held until the end.
    json_candidate: Option<String>,
    content_seen: bool,
    tokens: usize,
    finished: bool,
}

/// Drives one submission: engine events in, [`Update`]s out.
pub struct Generation {
    sub: Submission,
    spec: OutputSpec,
    choices: Vec<ChoiceOutput>,
    queued: std::collections::VecDeque<Update>,
    started: bool,
    cached_tokens: usize,
    /// Speculative decoding: draft tokens proposed and accepted (all choices).
    drafted: usize,
    accepted: usize,
}

fn new_call_id() -> String {
    format!("call_{}", crate::http::random_hex(24))
}

impl Generation {
    /// Wraps a submission.
    pub fn new(sub: Submission, spec: OutputSpec) -> Generation {
        let choices = (0..spec.n.max(1))
            .map(|_| ChoiceOutput {
                detok: spec.tokenizer.detokenizer(),
                router: TextRouter::new(spec.markers.clone(), spec.initial),
                tool_text: String::new(),
                made_tool_call: false,
                json_candidate: None,
                content_seen: false,
                tokens: 0,
                finished: false,
            })
            .collect();
        Generation {
            sub,
            spec,
            choices,
            queued: Default::default(),
            started: false,
            cached_tokens: 0,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Speculative decoding: `(drafted, accepted)` draft tokens so far (all choices).
    pub fn draft_counts(&self) -> (usize, usize) {
        (self.drafted, self.accepted)
    }

    /// Completion tokens generated so far (all choices, EOS included as in mlx-lm).
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.tokens).sum()
    }

    /// Prompt tokens reused from the prompt cache (of the first choice).
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// Stops the generation as abandoned by the client.
    pub fn cancel(&self) {
        self.sub.cancel();
    }

    /// Ends the generation normally (stops any choice still running, e.g. after a text
    /// stop word, without counting a disconnect).
    pub fn release(&self) {
        self.sub.release();
    }

    /// The next update; `None` when every choice has finished.
    pub async fn next(&mut self) -> Option<Update> {
        loop {
            if let Some(u) = self.queued.pop_front() {
                return Some(u);
            }
            if self.choices.iter().all(|c| c.finished) {
                self.sub.release();
                return None;
            }
            let Some(event) = self.sub.events.recv().await else {
                return Some(Update::Failed(ApiError::unavailable(
                    "the generation engine stopped",
                )));
            };
            self.handle(event);
        }
    }

    fn handle(&mut self, event: EngineEvent) {
        match event {
            EngineEvent::Started {
                cached_tokens,
                choice,
            } => {
                if choice == 0 {
                    self.cached_tokens = cached_tokens;
                }
                if !self.started {
                    self.started = true;
                    self.queued.push_back(Update::Started { cached_tokens });
                }
            }
            EngineEvent::Progress {
                processed, total, ..
            } => self.queued.push_back(Update::Progress { processed, total }),
            EngineEvent::Failed { error, .. } => {
                for c in &mut self.choices {
                    c.finished = true;
                }
                self.sub.release();
                self.queued.push_back(Update::Failed(error.into()));
            }
            EngineEvent::Token { choice, out } => self.on_token(choice, out),
            EngineEvent::Prompt {
                choice,
                logprobs,
                finish,
            } => self.on_prompt(choice, &logprobs, finish),
        }
    }

    fn on_prompt(&mut self, choice: usize, logprobs: &[PromptLogprob], finish: Option<Finish>) {
        let tok = &self.spec.tokenizer;
        let text = |id: u32| tok.decode(&[id], false).unwrap_or_default();
        let logprobs: Vec<LogprobOut> = logprobs
            .iter()
            .map(|p| {
                let mut top: Vec<(u32, String, f32)> =
                    p.top.iter().map(|(id, l)| (*id, text(*id), *l)).collect();
                top.sort_by(|a, b| b.2.total_cmp(&a.2));
                LogprobOut {
                    id: p.token,
                    token: text(p.token),
                    logprob: p.logprob,
                    top,
                }
            })
            .collect();
        let Some(c) = self.choices.get_mut(choice) else {
            return;
        };
        if c.finished {
            return;
        }
        self.queued.push_back(Update::Prompt { choice, logprobs });
        if let Some(f) = finish {
            c.finished = true;
            self.queued.push_back(Update::Finished {
                choice,
                reason: f.as_str(),
                stop_word: None,
            });
        }
    }

    fn logprob_out(&self, out: &TokenOut) -> Option<LogprobOut> {
        let tok = &self.spec.tokenizer;
        let text = |id: u32| tok.decode(&[id], false).unwrap_or_default();
        let lp = out.logprob?;
        let mut top: Vec<(u32, String, f32)> =
            out.top.iter().map(|(id, l)| (*id, text(*id), *l)).collect();
        top.sort_by(|a, b| b.2.total_cmp(&a.2));
        Some(LogprobOut {
            id: out.token,
            token: text(out.token),
            logprob: lp,
            top,
        })
    }

    fn on_token(&mut self, choice: usize, out: TokenOut) {
        let lp = self.logprob_out(&out);
        self.drafted += out.drafted;
        self.accepted += usize::from(out.from_draft);
        let Some(c) = self.choices.get_mut(choice) else {
            return;
        };
        if c.finished {
            return;
        }
        c.tokens += 1;
        if self.spec.min_tokens > 0 {
            c.router.arm_stops(c.tokens >= self.spec.min_tokens);
        }
        let mut pieces = Vec::new();
        match out.finish {
            // The stop token (EOS or the end of a stop sequence) is not shown.
            Some(Finish::Stop) => {
                c.detok.finalize();
                c.router.discard();
            }
            // A constraint's dead end: its token (a forced EOS or a token the constraint
            // rejected) is not shown; the text so far is.
            Some(Finish::Constraint) => {
                c.detok.finalize();
                pieces.extend(c.router.flush());
            }
            Some(Finish::Length) => {
                c.detok.add_token(out.token);
                c.detok.finalize();
                pieces.extend(c.router.feed(&c.detok.last_segment()));
                pieces.extend(c.router.flush());
            }
            None => {
                c.detok.add_token(out.token);
                pieces.extend(c.router.feed(&c.detok.last_segment()));
            }
        }
        let mut delta = Delta::default();
        if let Some(lp) = lp {
            delta.logprobs.push(lp);
        }
        let mut text_stop = false;
        let mut stop_word = out
            .stop_index
            .and_then(|i| i.checked_sub(self.spec.n_eos))
            .and_then(|i| self.spec.markers.stop_words.get(i).cloned());
        for p in pieces {
            match p {
                Piece::Text(Channel::Normal, t) => self.push_content(choice, &mut delta, &t),
                Piece::Text(Channel::Reasoning, t) => delta.reasoning.push_str(&t),
                Piece::Text(Channel::Tool, t) => self.choices[choice].tool_text.push_str(&t),
                Piece::ToolEnd => self.close_tool(choice, &mut delta),
                Piece::Stop(w) => {
                    text_stop = true;
                    stop_word = Some(w);
                }
            }
        }
        let finish = if text_stop {
            Some(Finish::Stop)
        } else {
            out.finish
        };
        if let Some(f) = finish {
            self.close_tool(choice, &mut delta);
            if let Some(held) = self.choices[choice].json_candidate.take() {
                self.resolve_json_candidate(choice, &mut delta, held);
            }
            let c = &mut self.choices[choice];
            c.finished = true;
            let reason = if f == Finish::Stop && c.made_tool_call {
                "tool_calls"
            } else {
                f.as_str()
            };
            if text_stop {
                // The engine would go on to EOS or the token budget: stop this choice.
                self.sub.cancel_choice(choice);
            }
            if !delta.is_empty() {
                self.queued.push_back(Update::Delta { choice, delta });
            }
            self.queued.push_back(Update::Finished {
                choice,
                reason,
                stop_word,
            });
        } else if !delta.is_empty() {
            self.queued.push_back(Update::Delta { choice, delta });
        }
    }

    fn push_content(&mut self, choice: usize, delta: &mut Delta, text: &str) {
        let llama = self.spec.tool_format == Some(ToolFormat::Llama3Json);
        let c = &mut self.choices[choice];
        if let Some(held) = c.json_candidate.as_mut() {
            held.push_str(text);
            return;
        }
        if llama && !c.content_seen && text.trim_start().starts_with('{') {
            c.json_candidate = Some(text.to_string());
            c.content_seen = true;
            return;
        }
        if !text.trim().is_empty() {
            c.content_seen = true;
        }
        delta.content.push_str(text);
    }

    fn resolve_json_candidate(&mut self, choice: usize, delta: &mut Delta, held: String) {
        match ToolFormat::Llama3Json.parse(&held, self.spec.tools.as_deref()) {
            Ok(calls) => self.add_calls(choice, delta, calls),
            Err(_) => delta.content.push_str(&held),
        }
    }

    fn add_calls(&mut self, choice: usize, delta: &mut Delta, calls: Vec<ParsedCall>) {
        for call in calls {
            let id = call.id.unwrap_or_else(new_call_id);
            delta.tool_calls.push(ToolCallOut {
                id,
                name: call.name,
                arguments: call.arguments,
            });
        }
        self.choices[choice].made_tool_call = true;
    }

    /// Parses the collected tool-call text; unreadable text becomes content.
    fn close_tool(&mut self, choice: usize, delta: &mut Delta) {
        let text = std::mem::take(&mut self.choices[choice].tool_text);
        if text.trim().is_empty() {
            return;
        }
        let Some(format) = self.spec.tool_format else {
            delta.content.push_str(&text);
            return;
        };
        match format.parse(&text, self.spec.tools.as_deref()) {
            Ok(calls) => self.add_calls(choice, delta, calls),
            Err(e) => {
                tracing::warn!("could not parse a tool call ({e}); returning it as text");
                let (start, end) = format.markers();
                delta.content.push_str(&format!("{start}{text}{end}"));
            }
        }
    }
}

/// Where the answer starts: inside reasoning when the prompt's last think-start comes
/// after its last think-end (mlx-lm's `rfind_think_start > rfind_think_end`).
pub fn initial_channel(tokenizer: &Tokenizer, prompt: &[u32]) -> Channel {
    let Some(m) = tokenizer.think_markers() else {
        return Channel::Normal;
    };
    let rfind = |pat: &[u32]| -> Option<usize> {
        if pat.is_empty() || pat.len() > prompt.len() {
            return None;
        }
        (0..=prompt.len() - pat.len())
            .rev()
            .find(|&i| prompt[i..].starts_with(pat))
    };
    match (rfind(&m.start_tokens), rfind(&m.end_tokens)) {
        (Some(s), Some(e)) if s > e => Channel::Reasoning,
        (Some(_), None) => Channel::Reasoning,
        _ => Channel::Normal,
    }
}

/// What a streaming handler does with an update: the SSE frames to send, and whether
/// the stream ends after them.
pub type Frames = (Vec<bytes::Bytes>, bool);

/// Streams a generation: each update (and `None` at the end) goes through `on`, its
/// frames to `tx`; keep-alive comments go out every `keepalive` and on prefill
/// progress. Returns when done or when the client is gone (dropping `gen` cancels it).
pub async fn pump(
    mut gen: Generation,
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    keepalive: std::time::Duration,
    mut on: impl FnMut(Option<Update>, &Generation) -> Frames + Send,
) {
    let mut tick = tokio::time::interval(keepalive);
    tick.tick().await;
    loop {
        let update = tokio::select! {
            u = gen.next() => u,
            _ = tick.tick() => {
                if tx.send(crate::http::sse_comment("keepalive")).await.is_err() {
                    return;
                }
                continue;
            }
            _ = tx.closed() => return,
        };
        if let Some(Update::Progress { processed, total }) = &update {
            let c = crate::http::sse_comment(&format!("keepalive {processed}/{total}"));
            if tx.send(c).await.is_err() {
                return;
            }
            continue;
        }
        let end = update.is_none();
        let (frames, stop) = on(update, &gen);
        for f in frames {
            if tx.send(f).await.is_err() {
                return;
            }
        }
        if stop || end {
            gen.release();
            return;
        }
    }
}

//! OpenAI endpoints: `/v1/chat/completions`, `/v1/models`, in mlx-lm's response shapes
//! (plus `reasoning_content`, `n`, OpenAI-style logprobs); `/v1/completions` is in
//! [`crate::completions`].
use crate::error::ApiError;
use crate::http::{json_response, random_hex, sse_data, sse_response, AppState, Body};
use crate::output::{pump, Delta, Generation, LogprobOut, ToolCallOut, Update};
use crate::params::{self, apply_tool_choice, check_tools, Body as Req, Flavor};
use crate::prompt::{chat_prompt, finish_request};
use crate::structured;
use hyper::{Response, StatusCode};
use mlx_engine::batch::DraftFrom;
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;

/// Runs blocking tokenizer work off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("tokenization task failed: {e}")))?
}

/// The chat usage of `gen`: [`usage_json`], with the speculative counts when the
/// request speculated: OpenAI's `completion_tokens_details.accepted_prediction_tokens`
/// / `rejected_prediction_tokens` for a predicted output of `prediction` tokens (the
/// prediction's tokens that did not make it into the answer count as rejected), and
/// ours, `draft_tokens` / `accepted_draft_tokens`, for a draft model.
fn chat_usage(prompt: usize, gen: &Generation, prediction: Option<usize>, drafting: bool) -> Json {
    let mut u = usage_json(prompt, gen.completion_tokens(), gen.cached_tokens());
    let (drafted, accepted) = gen.draft_counts();
    if let Some(len) = prediction {
        u["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": len.saturating_sub(accepted),
        });
    } else if drafting {
        u["completion_tokens_details"] =
            json!({"draft_tokens": drafted, "accepted_draft_tokens": accepted});
    }
    u
}

/// Usage object (with `prompt_tokens_details.cached_tokens`).
pub fn usage_json(prompt: usize, completion: usize, cached: usize) -> Json {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

fn tool_call_json(c: &ToolCallOut, index: Option<usize>) -> Json {
    let mut v = json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments_string()},
    });
    if let (Some(i), Some(o)) = (index, v.as_object_mut()) {
        o.insert("index".into(), json!(i));
    }
    v
}

/// Everything one choice produced.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    /// Visible text.
    pub content: String,
    /// Reasoning.
    pub reasoning: String,
    /// Tool calls.
    pub tool_calls: Vec<ToolCallOut>,
    /// Log-probabilities.
    pub logprobs: Vec<LogprobOut>,
    /// Log-probabilities of the prompt's tokens after the first (completions' `echo`).
    pub prompt_logprobs: Vec<LogprobOut>,
    /// Finish reason.
    pub finish: Option<&'static str>,
    /// The stop word that ended the answer.
    pub stop_word: Option<String>,
}

impl Collected {
    fn add(&mut self, d: Delta) {
        self.content.push_str(&d.content);
        self.reasoning.push_str(&d.reasoning);
        self.tool_calls.extend(d.tool_calls);
        self.logprobs.extend(d.logprobs);
    }
}

/// Waits for every choice to finish.
pub async fn collect(
    mut gen: Generation,
    n: usize,
) -> Result<(Vec<Collected>, Generation), ApiError> {
    let mut out = vec![Collected::default(); n.max(1)];
    while let Some(u) = gen.next().await {
        match u {
            Update::Delta { choice, delta } => {
                if let Some(c) = out.get_mut(choice) {
                    c.add(delta);
                }
            }
            Update::Finished {
                choice,
                reason,
                stop_word,
            } => {
                if let Some(c) = out.get_mut(choice) {
                    c.finish = Some(reason);
                    c.stop_word = stop_word;
                }
            }
            Update::Prompt { choice, logprobs } => {
                if let Some(c) = out.get_mut(choice) {
                    c.prompt_logprobs = logprobs;
                }
            }
            Update::Failed(e) => return Err(e),
            Update::Started { .. } | Update::Progress { .. } => {}
        }
    }
    Ok((out, gen))
}

/// What every response of one request carries.
pub(crate) struct Meta {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub fingerprint: String,
    pub prompt_tokens: usize,
}

impl Meta {
    /// The response object's common fields.
    pub fn head(&self, object: &str) -> Map<String, Json> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("system_fingerprint".into(), json!(self.fingerprint));
        m.insert("object".into(), json!(object));
        m.insert("model".into(), json!(self.model));
        m.insert("created".into(), json!(self.created));
        m
    }
}

fn chat_message(c: &Collected, stream: bool, tool_index: &mut usize) -> Json {
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    if !stream {
        m.insert(
            "content".into(),
            if c.content.is_empty() {
                Json::Null
            } else {
                json!(c.content)
            },
        );
    } else if !c.content.is_empty() {
        m.insert("content".into(), json!(c.content));
    }
    if !c.reasoning.is_empty() {
        m.insert("reasoning".into(), json!(c.reasoning));
        m.insert("reasoning_content".into(), json!(c.reasoning));
    }
    if !c.tool_calls.is_empty() {
        let calls: Vec<Json> = c
            .tool_calls
            .iter()
            .map(|t| {
                let idx = stream.then(|| {
                    *tool_index += 1;
                    *tool_index - 1
                });
                tool_call_json(t, idx)
            })
            .collect();
        m.insert("tool_calls".into(), Json::Array(calls));
    }
    Json::Object(m)
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    state: Arc<AppState>,
    body: Map<String, Json>,
) -> Result<Response<Body>, ApiError> {
    let b = Req(&body);
    let params = params::common(&b, &state.cfg, Flavor::Chat)?;
    let messages = b
        .array("messages")?
        .ok_or_else(|| ApiError::invalid_param("messages", "Request did not contain messages"))?
        .clone();
    let tools = b.array("tools")?.filter(|t| !t.is_empty()).cloned();
    if let Some(t) = &tools {
        check_tools(t)?;
    }
    let tools = apply_tool_choice(tools, b.get("tool_choice"))?;
    let parallel = b.bool("parallel_tool_calls")?.unwrap_or(true);
    let wanted = structured::combine(
        structured::output_constraint(&b, false)?,
        structured::forced_tool_calls(b.get("tool_choice"), tools.as_deref(), parallel)?,
    )?;
    let role_mapping = b.object("role_mapping")?.cloned();
    let kwargs = params.chat_template_kwargs.clone();
    let st = Arc::clone(&state);
    let prepared =
        blocking(move || chat_prompt(&st, &messages, tools, &kwargs, role_mapping.as_ref()))
            .await?;
    let (req, spec) = finish_request(&state, prepared, &params, true)?;
    let req = structured::constrain(&state, wanted, spec.initial, req).await?;
    let (prediction, drafting) = match &req.speculate {
        Some(s) => match &s.from {
            DraftFrom::Prediction(p) => (Some(p.len()), false),
            DraftFrom::DraftModel => (None, true),
        },
        None => (None, false),
    };
    let meta = Meta {
        id: format!("chatcmpl-{}", random_hex(32)),
        model: params.model.clone(),
        created: state.info.created,
        fingerprint: state.info.fingerprint.clone(),
        prompt_tokens: req.prompt.len(),
    };
    let sub = crate::http::submit(&state, req)?;
    let guard = sub.guard();
    let gen = Generation::new(sub, spec);
    if !params.stream {
        let (choices, gen) = collect(gen, params.n).await?;
        let mut resp = meta.head("chat.completion");
        let list: Vec<Json> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut choice = json!({"index": i, "finish_reason": c.finish, "message": chat_message(c, false, &mut 0)});
                if params.logprobs || params.top_logprobs > 0 {
                    let content: Vec<Json> = c.logprobs.iter().map(LogprobOut::chat_json).collect();
                    choice["logprobs"] = json!({"content": content});
                }
                choice
            })
            .collect();
        resp.insert("choices".into(), Json::Array(list));
        resp.insert(
            "usage".into(),
            chat_usage(meta.prompt_tokens, &gen, prediction, drafting),
        );
        return Ok(json_response(StatusCode::OK, &Json::Object(resp)));
    }
    let (response, tx) = sse_response(Some(guard));
    let want_lp = params.logprobs || params.top_logprobs > 0;
    let include_usage = params.include_usage;
    let mut tool_index = vec![0usize; params.n.max(1)];
    tokio::spawn(pump(
        gen,
        tx,
        state.cfg.keepalive_interval,
        move |u, gen| {
            let chunk = |choice: usize, delta: Json, finish: Option<&str>, lp: Option<Json>| {
                let mut c = json!({"index": choice, "finish_reason": finish, "delta": delta});
                if let Some(lp) = lp {
                    c["logprobs"] = lp;
                }
                let mut m = meta.head("chat.completion.chunk");
                m.insert("choices".into(), json!([c]));
                sse_data(&Json::Object(m))
            };
            match u {
                Some(Update::Delta { choice, delta }) => {
                    let lp = (want_lp && !delta.logprobs.is_empty()).then(|| {
                    json!({"content": delta.logprobs.iter().map(LogprobOut::chat_json).collect::<Vec<_>>()})
                });
                    let mut c = Collected::default();
                    c.add(delta);
                    let mut spare = 0;
                    let idx = match tool_index.get_mut(choice) {
                        Some(i) => i,
                        None => &mut spare,
                    };
                    (
                        vec![chunk(choice, chat_message(&c, true, idx), None, lp)],
                        false,
                    )
                }
                Some(Update::Finished { choice, reason, .. }) => (
                    vec![chunk(
                        choice,
                        json!({"role": "assistant"}),
                        Some(reason),
                        None,
                    )],
                    false,
                ),
                Some(Update::Failed(e)) => (vec![sse_data(&e.openai_body()), sse_done()], true),
                Some(_) => (Vec::new(), false),
                None => {
                    let mut frames = Vec::new();
                    if include_usage {
                        let mut m = meta.head("chat.completion.chunk");
                        m.insert("choices".into(), json!([]));
                        m.insert(
                            "usage".into(),
                            chat_usage(meta.prompt_tokens, gen, prediction, drafting),
                        );
                        frames.push(sse_data(&Json::Object(m)));
                    }
                    frames.push(sse_done());
                    (frames, true)
                }
            }
        },
    ));
    Ok(response)
}

/// The end of an OpenAI stream.
pub(crate) fn sse_done() -> bytes::Bytes {
    bytes::Bytes::from_static(b"data: [DONE]\n\n")
}

/// `GET /v1/models` (and `/v1/models/{id}`): the served model.
pub fn models(state: &AppState, path: &str) -> Response<Body> {
    let entry = |id: &str| json!({"id": id, "object": "model", "created": state.info.created, "owned_by": "mlx-server"});
    let wanted = path
        .trim_end_matches('/')
        .strip_prefix("/v1/models/")
        .filter(|s| !s.is_empty());
    match wanted {
        Some(id) if state.cfg.serves_model(id) => json_response(StatusCode::OK, &entry(id)),
        Some(id) => crate::http::error_response(
            crate::error::Dialect::OpenAi,
            &ApiError::not_found(format!("The model `{id}` does not exist")),
        ),
        None => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [entry(&state.cfg.model_id)]}),
        ),
    }
}

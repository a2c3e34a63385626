//! OpenAI endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, in
//! mlx-lm's response shapes (plus `reasoning_content`, `n`, OpenAI-style logprobs).
use crate::error::ApiError;
use crate::http::{json_response, random_hex, sse_data, sse_response, AppState, Body};
use crate::output::{pump, Delta, Generation, LogprobOut, ToolCallOut, Update};
use crate::params::{self, apply_tool_choice, check_tools, Body as Req, Flavor};
use crate::prompt::{chat_prompt, finish_request, text_prompt};
use crate::structured;
use hyper::{Response, StatusCode};
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
            Update::Failed(e) => return Err(e),
            Update::Started { .. } | Update::Progress { .. } => {}
        }
    }
    Ok((out, gen))
}

struct Meta {
    id: String,
    model: String,
    created: u64,
    fingerprint: String,
    prompt_tokens: usize,
}

impl Meta {
    fn head(&self, object: &str) -> Map<String, Json> {
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
            usage_json(
                meta.prompt_tokens,
                gen.completion_tokens(),
                gen.cached_tokens(),
            ),
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
                            usage_json(
                                meta.prompt_tokens,
                                gen.completion_tokens(),
                                gen.cached_tokens(),
                            ),
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

fn sse_done() -> bytes::Bytes {
    bytes::Bytes::from_static(b"data: [DONE]\n\n")
}

/// OpenAI's legacy completion logprobs.
fn legacy_logprobs(lps: &[LogprobOut], offset0: usize, want_top: bool) -> Json {
    let mut offset = offset0;
    let mut offsets = Vec::new();
    for l in lps {
        offsets.push(offset);
        offset += l.token.len();
    }
    let top: Json = if want_top {
        Json::Array(
            lps.iter()
                .map(|l| {
                    let m: Map<String, Json> = l
                        .top
                        .iter()
                        .map(|(_, t, lp)| (t.clone(), json!(lp)))
                        .collect();
                    Json::Object(m)
                })
                .collect(),
        )
    } else {
        Json::Null
    };
    json!({
        "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

/// `POST /v1/completions`.
pub async fn completions(
    state: Arc<AppState>,
    body: Map<String, Json>,
) -> Result<Response<Body>, ApiError> {
    let b = Req(&body);
    let params = params::common(&b, &state.cfg, Flavor::Completions)?;
    let prompt = b
        .get("prompt")
        .ok_or_else(|| ApiError::invalid_param("prompt", "Request did not contain a prompt"))?
        .clone();
    let echo = b.bool("echo")?.unwrap_or(false);
    let wanted = structured::output_constraint(&b, false)?;
    let st = Arc::clone(&state);
    let vocab = state.info.vocab_size;
    let ids = blocking(move || text_prompt(&st.tokenizer, vocab, &prompt)).await?;
    let prepared = crate::prompt::Prepared {
        prompt: ids,
        initial: crate::text::Channel::Normal,
        tools: None,
    };
    let (req, spec) = finish_request(&state, prepared, &params, false)?;
    let req = structured::constrain(&state, wanted, spec.initial, req).await?;
    let echo_text = if echo {
        state
            .tokenizer
            .decode(&req.prompt, false)
            .unwrap_or_default()
    } else {
        String::new()
    };
    let meta = Meta {
        id: format!("cmpl-{}", random_hex(32)),
        model: params.model.clone(),
        created: state.info.created,
        fingerprint: state.info.fingerprint.clone(),
        prompt_tokens: req.prompt.len(),
    };
    let sub = crate::http::submit(&state, req)?;
    let guard = sub.guard();
    let gen = Generation::new(sub, spec);
    let want_lp = params.logprobs;
    let want_top = params.top_logprobs > 0;
    if !params.stream {
        let (choices, gen) = collect(gen, params.n).await?;
        let list: Vec<Json> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let text = format!("{echo_text}{}", c.content);
                let lp = want_lp.then(|| legacy_logprobs(&c.logprobs, echo_text.len(), want_top));
                json!({"index": i, "text": text, "finish_reason": c.finish, "logprobs": lp})
            })
            .collect();
        let mut resp = meta.head("text_completion");
        resp.insert("choices".into(), Json::Array(list));
        resp.insert(
            "usage".into(),
            usage_json(
                meta.prompt_tokens,
                gen.completion_tokens(),
                gen.cached_tokens(),
            ),
        );
        return Ok(json_response(StatusCode::OK, &Json::Object(resp)));
    }
    let (response, tx) = sse_response(Some(guard));
    let include_usage = params.include_usage;
    let mut offsets = vec![echo_text.len(); params.n.max(1)];
    let mut echoed = vec![!echo; params.n.max(1)];
    tokio::spawn(pump(
        gen,
        tx,
        state.cfg.keepalive_interval,
        move |u, gen| {
            let chunk = |choice: usize, text: String, finish: Option<&str>, lp: Json| {
                let mut m = meta.head("text_completion");
                m.insert("choices".into(), json!([{"index": choice, "text": text, "finish_reason": finish, "logprobs": lp}]));
                sse_data(&Json::Object(m))
            };
            match u {
                Some(Update::Delta { choice, delta }) => {
                    let mut text = String::new();
                    if let Some(e) = echoed.get_mut(choice) {
                        if !*e {
                            text.push_str(&echo_text);
                            *e = true;
                        }
                    }
                    text.push_str(&delta.content);
                    let off = offsets.get(choice).copied().unwrap_or(0);
                    let lp = if want_lp {
                        legacy_logprobs(&delta.logprobs, off, want_top)
                    } else {
                        Json::Null
                    };
                    if let Some(o) = offsets.get_mut(choice) {
                        *o += delta.logprobs.iter().map(|l| l.token.len()).sum::<usize>();
                    }
                    if text.is_empty() && !want_lp {
                        return (Vec::new(), false);
                    }
                    (vec![chunk(choice, text, None, lp)], false)
                }
                Some(Update::Finished { choice, reason, .. }) => (
                    vec![chunk(choice, String::new(), Some(reason), Json::Null)],
                    false,
                ),
                Some(Update::Failed(e)) => (vec![sse_data(&e.openai_body()), sse_done()], true),
                Some(_) => (Vec::new(), false),
                None => {
                    let mut frames = Vec::new();
                    if include_usage {
                        let mut m = meta.head("text_completion");
                        m.insert("choices".into(), json!([]));
                        m.insert(
                            "usage".into(),
                            usage_json(
                                meta.prompt_tokens,
                                gen.completion_tokens(),
                                gen.cached_tokens(),
                            ),
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

//! Anthropic Messages API: `POST /v1/messages` (with streaming events) and
//! `POST /v1/messages/count_tokens`. Messages are turned into the OpenAI-style chat the
//! template expects; thinking, text and tool-use blocks come back.
use crate::error::ApiError;
use crate::http::{json_response, random_hex, sse_event, sse_response, AppState, Body};
use crate::openai::{blocking, collect};
use crate::output::{pump, Generation, ToolCallOut, Update};
use crate::params::{self, apply_tool_choice, Body as Req, Flavor};
use crate::prompt::{chat_prompt, content_text, finish_request};
use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;

fn block_text(block: &Json) -> Result<String, ApiError> {
    content_text(Some(block), "content")
}

/// Anthropic messages (+ system) to chat-template messages.
pub fn to_chat(body: &Req<'_>) -> Result<Vec<Json>, ApiError> {
    let mut out = Vec::new();
    match body.get("system") {
        None => {}
        Some(s @ (Json::String(_) | Json::Array(_))) => {
            let text = content_text(Some(s), "system")?;
            out.push(json!({"role": "system", "content": text}));
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "system",
                "system must be a string or a list of text blocks",
            ))
        }
    }
    let messages = body
        .array("messages")?
        .ok_or_else(|| ApiError::invalid_param("messages", "messages: Field required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Json::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                format!("messages[{i}].role must be \"user\" or \"assistant\""),
            ));
        }
        let blocks = match m.get("content") {
            Some(Json::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Json::Array(a)) => a.clone(),
            _ => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}].content must be a string or a list of blocks"),
                ))
            }
        };
        let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        for b in &blocks {
            let kind = b.get("type").and_then(Json::as_str).unwrap_or("");
            match kind {
                "text" => text.push_str(b.get("text").and_then(Json::as_str).unwrap_or("")),
                "thinking" => {
                    thinking.push_str(b.get("thinking").and_then(Json::as_str).unwrap_or(""))
                }
                "redacted_thinking" => {}
                "tool_use" if role == "assistant" => {
                    let name = b.get("name").and_then(Json::as_str).ok_or_else(|| {
                        ApiError::invalid_param(
                            "messages",
                            format!("messages[{i}]: tool_use needs a name"),
                        )
                    })?;
                    let input = b.get("input").cloned().unwrap_or(json!({}));
                    calls.push(
                        json!({"id": b.get("id").cloned().unwrap_or(Json::Null), "type": "function",
                                      "function": {"name": name, "arguments": input}}),
                    );
                }
                "tool_result" if role == "user" => {
                    let content = match b.get("content") {
                        None | Some(Json::Null) => String::new(),
                        Some(c) => block_text(c)?,
                    };
                    out.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Json::Null),
                                    "content": content}));
                }
                other => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!(
                            "messages[{i}]: content blocks of type {other:?} are not supported"
                        ),
                    ))
                }
            }
        }
        if role == "user"
            && text.is_empty()
            && blocks
                .iter()
                .all(|b| b.get("type").and_then(Json::as_str) == Some("tool_result"))
        {
            continue;
        }
        let mut msg = json!({"role": role, "content": text});
        if !thinking.is_empty() {
            msg["reasoning_content"] = json!(thinking);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = Json::Array(calls);
        }
        out.push(msg);
    }
    Ok(out)
}

/// Anthropic tools (`{name, description, input_schema}`) as OpenAI function tools.
fn to_openai_tools(body: &Req<'_>) -> Result<Option<Vec<Json>>, ApiError> {
    let Some(tools) = body.array("tools")? else {
        return Ok(None);
    };
    if tools.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let name = t.get("name").and_then(Json::as_str).ok_or_else(|| {
            ApiError::invalid_param("tools", format!("tools[{i}].name: Field required"))
        })?;
        let mut f = json!({"name": name, "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))});
        if let Some(d) = t.get("description") {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Some(out))
}

fn tool_choice(body: &Req<'_>) -> Result<Option<Json>, ApiError> {
    let Some(c) = body.object("tool_choice")? else {
        return Ok(None);
    };
    Ok(Some(match c.get("type").and_then(Json::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            json!({"type": "function", "function": {"name": c.get("name").cloned().unwrap_or(Json::Null)}})
        }
        _ => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice.type must be auto, any, tool or none",
            ))
        }
    }))
}

fn thinking_kwargs(body: &Req<'_>, kwargs: &mut Map<String, Json>) -> Result<(), ApiError> {
    if let Some(t) = body.object("thinking")? {
        match t.get("type").and_then(Json::as_str) {
            Some("enabled") => kwargs.insert("enable_thinking".into(), json!(true)),
            Some("disabled") => kwargs.insert("enable_thinking".into(), json!(false)),
            _ => {
                return Err(ApiError::invalid_param(
                    "thinking",
                    "thinking.type must be enabled or disabled",
                ))
            }
        };
    }
    Ok(())
}

fn stop_reason(reason: Option<&str>, stop_word: &Option<String>) -> &'static str {
    match reason {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        // The output constraint reached a dead end: the answer is incomplete.
        Some("error") => "error",
        _ if stop_word.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

fn tool_use_block(c: &ToolCallOut) -> Json {
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
}

/// `POST /v1/messages`.
pub async fn messages(
    state: Arc<AppState>,
    body: Map<String, Json>,
) -> Result<Response<Body>, ApiError> {
    let b = Req(&body);
    let mut params = params::common(&b, &state.cfg, Flavor::Anthropic)?;
    params.n = 1;
    let messages = to_chat(&b)?;
    let choice = tool_choice(&b)?;
    let tools = apply_tool_choice(to_openai_tools(&b)?, choice.as_ref())?;
    let parallel = !b
        .object("tool_choice")?
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let wanted = crate::structured::forced_tool_calls(choice.as_ref(), tools.as_deref(), parallel)?;
    let mut kwargs = params.chat_template_kwargs.clone();
    thinking_kwargs(&b, &mut kwargs)?;
    let st = Arc::clone(&state);
    let prepared = blocking(move || chat_prompt(&st, &messages, tools, &kwargs, None)).await?;
    let (req, spec) = finish_request(&state, prepared, &params, true)?;
    let req = crate::structured::constrain(&state, wanted, spec.initial, req).await?;
    let input_tokens = req.prompt.len();
    let id = format!("msg_{}", random_hex(24));
    let model = params.model.clone();
    let sub = crate::http::submit(&state, req)?;
    let guard = sub.guard();
    let gen = Generation::new(sub, spec);
    if !params.stream {
        let (choices, gen) = collect(gen, 1).await?;
        let c = choices.into_iter().next().unwrap_or_default();
        let mut content = Vec::new();
        if !c.reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}));
        }
        if !c.content.is_empty() || (c.tool_calls.is_empty() && c.reasoning.is_empty()) {
            content.push(json!({"type": "text", "text": c.content}));
        }
        content.extend(c.tool_calls.iter().map(tool_use_block));
        let resp = json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(c.finish, &c.stop_word), "stop_sequence": c.stop_word,
            "usage": {"input_tokens": input_tokens, "output_tokens": gen.completion_tokens(),
                      "cache_read_input_tokens": gen.cached_tokens(), "cache_creation_input_tokens": 0},
        });
        return Ok(json_response(StatusCode::OK, &resp));
    }
    let (response, tx) = sse_response(Some(guard));
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}});
    if tx.send(sse_event("message_start", &start)).await.is_err() {
        return Ok(response);
    }
    let _ = tx.send(sse_event("ping", &json!({"type": "ping"}))).await;
    let mut blocks = BlockWriter::default();
    let mut finish: (Option<&'static str>, Option<String>) = (None, None);
    tokio::spawn(pump(
        gen,
        tx,
        state.cfg.keepalive_interval,
        move |u, gen| match u {
            Some(Update::Delta { delta, .. }) => {
                let mut frames = Vec::new();
                if !delta.reasoning.is_empty() {
                    blocks.text(&mut frames, "thinking", &delta.reasoning);
                }
                if !delta.content.is_empty() {
                    blocks.text(&mut frames, "text", &delta.content);
                }
                for c in &delta.tool_calls {
                    blocks.tool(&mut frames, c);
                }
                (frames, false)
            }
            Some(Update::Finished {
                reason, stop_word, ..
            }) => {
                finish = (Some(reason), stop_word);
                (Vec::new(), false)
            }
            Some(Update::Failed(e)) => (vec![sse_event("error", &e.anthropic_body())], true),
            Some(_) => (Vec::new(), false),
            None => {
                let mut frames = Vec::new();
                blocks.close(&mut frames);
                let delta = json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(finish.0, &finish.1), "stop_sequence": finish.1},
                "usage": {"output_tokens": gen.completion_tokens(), "input_tokens": input_tokens,
                          "cache_read_input_tokens": gen.cached_tokens()}});
                frames.push(sse_event("message_delta", &delta));
                frames.push(sse_event("message_stop", &json!({"type": "message_stop"})));
                (frames, true)
            }
        },
    ));
    Ok(response)
}

/// Opens and closes content blocks as the kind of output changes.
#[derive(Default)]
struct BlockWriter {
    open: Option<&'static str>,
    index: usize,
}

impl BlockWriter {
    fn close(&mut self, frames: &mut Vec<bytes::Bytes>) {
        if let Some(kind) = self.open.take() {
            if kind == "thinking" {
                let d = json!({"type": "content_block_delta", "index": self.index,
                               "delta": {"type": "signature_delta", "signature": ""}});
                frames.push(sse_event("content_block_delta", &d));
            }
            frames.push(sse_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    fn text(&mut self, frames: &mut Vec<bytes::Bytes>, kind: &'static str, text: &str) {
        if self.open != Some(kind) {
            self.close(frames);
            let block = if kind == "thinking" {
                json!({"type": "thinking", "thinking": "", "signature": ""})
            } else {
                json!({"type": "text", "text": ""})
            };
            let s =
                json!({"type": "content_block_start", "index": self.index, "content_block": block});
            frames.push(sse_event("content_block_start", &s));
            self.open = Some(kind);
        }
        let delta = if kind == "thinking" {
            json!({"type": "thinking_delta", "thinking": text})
        } else {
            json!({"type": "text_delta", "text": text})
        };
        let d = json!({"type": "content_block_delta", "index": self.index, "delta": delta});
        frames.push(sse_event("content_block_delta", &d));
    }

    fn tool(&mut self, frames: &mut Vec<bytes::Bytes>, c: &ToolCallOut) {
        self.close(frames);
        let s = json!({"type": "content_block_start", "index": self.index,
                       "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}});
        frames.push(sse_event("content_block_start", &s));
        let d = json!({"type": "content_block_delta", "index": self.index,
                       "delta": {"type": "input_json_delta", "partial_json": c.arguments.to_string()}});
        frames.push(sse_event("content_block_delta", &d));
        frames.push(sse_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.index}),
        ));
        self.index += 1;
    }
}

/// `POST /v1/messages/count_tokens`: the prompt length the request would have.
pub async fn count_tokens(
    state: Arc<AppState>,
    body: Map<String, Json>,
) -> Result<Response<Body>, ApiError> {
    let b = Req(&body);
    params::check_model(&b, &state.cfg)?;
    let messages = to_chat(&b)?;
    let tools = apply_tool_choice(to_openai_tools(&b)?, tool_choice(&b)?.as_ref())?;
    let mut kwargs = b
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    thinking_kwargs(&b, &mut kwargs)?;
    let st = Arc::clone(&state);
    let prepared = blocking(move || chat_prompt(&st, &messages, tools, &kwargs, None)).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"input_tokens": prepared.prompt.len()}),
    ))
}

//! OpenAI Responses API: `POST /v1/responses` with text, reasoning and function calls,
//! streamed as `response.*` events. State is not kept: `previous_response_id` is refused.
use crate::error::ApiError;
use crate::http::{json_response, random_hex, sse_event, sse_response, AppState, Body};
use crate::openai::{blocking, collect, Collected};
use crate::output::{pump, Generation, ToolCallOut, Update};
use crate::params::{self, apply_tool_choice, check_tools, Body as Req, Flavor};
use crate::prompt::{chat_prompt, content_text, finish_request};
use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;

/// `input` (a string or a list of items) plus `instructions` as chat messages.
fn to_chat(b: &Req<'_>) -> Result<Vec<Json>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = b.str("instructions")? {
        out.push(json!({"role": "system", "content": i}));
    }
    match b.get("input") {
        Some(Json::String(s)) => out.push(json!({"role": "user", "content": s})),
        Some(Json::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let kind = item.get("type").and_then(Json::as_str).unwrap_or("message");
                match kind {
                    "message" => {
                        let role = item.get("role").and_then(Json::as_str).ok_or_else(|| {
                            ApiError::invalid_param(
                                "input",
                                format!("input[{i}].role must be a string"),
                            )
                        })?;
                        let role = if role == "developer" { "system" } else { role };
                        let text =
                            content_text(item.get("content"), &format!("input[{i}].content"))?;
                        out.push(json!({"role": role, "content": text}));
                    }
                    "function_call" => {
                        let name = item.get("name").and_then(Json::as_str).ok_or_else(|| {
                            ApiError::invalid_param(
                                "input",
                                format!("input[{i}].name must be a string"),
                            )
                        })?;
                        let args = item.get("arguments").and_then(Json::as_str).unwrap_or("{}");
                        let args: Json = serde_json::from_str(args).map_err(|e| {
                            ApiError::invalid_param(
                                "input",
                                format!("input[{i}].arguments is not JSON: {e}"),
                            )
                        })?;
                        let call = json!({"id": item.get("call_id").cloned().unwrap_or(Json::Null), "type": "function",
                                          "function": {"name": name, "arguments": args}});
                        // Consecutive calls belong to one assistant turn.
                        let merged = out.last_mut().is_some_and(|last: &mut Json| {
                            let is_calls = last.get("role") == Some(&json!("assistant"))
                                && last.get("tool_calls").is_some();
                            if is_calls {
                                if let Some(Json::Array(calls)) = last.get_mut("tool_calls") {
                                    calls.push(call.clone());
                                }
                            }
                            is_calls
                        });
                        if !merged {
                            out.push(
                                json!({"role": "assistant", "content": "", "tool_calls": [call]}),
                            );
                        }
                    }
                    "function_call_output" => {
                        let output = match item.get("output") {
                            Some(Json::String(s)) => s.clone(),
                            Some(other) => {
                                content_text(Some(other), &format!("input[{i}].output"))?
                            }
                            None => String::new(),
                        };
                        out.push(json!({"role": "tool", "tool_call_id": item.get("call_id").cloned().unwrap_or(Json::Null),
                                        "content": output}));
                    }
                    "reasoning" => {}
                    other => {
                        return Err(ApiError::invalid_param(
                            "input",
                            format!("input items of type {other:?} are not supported"),
                        ))
                    }
                }
            }
        }
        None => return Err(ApiError::invalid_param("input", "input: Field required")),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "input",
                "input must be a string or a list of items",
            ))
        }
    }
    Ok(out)
}

/// Responses tools (`{type: function, name, parameters}`) as chat-completions tools.
fn to_openai_tools(b: &Req<'_>) -> Result<Option<Vec<Json>>, ApiError> {
    let Some(tools) = b.array("tools")? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Json::as_str) != Some("function") {
            return Err(ApiError::invalid_param(
                "tools",
                format!("tools[{i}]: only function tools are supported"),
            ));
        }
        if t.get("function").is_some() {
            out.push(t.clone());
            continue;
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(k) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    check_tools(&out)?;
    Ok((!out.is_empty()).then_some(out))
}

struct Ids {
    response: String,
    message: String,
    reasoning: String,
}

fn output_items(c: &Collected, ids: &Ids) -> Vec<Json> {
    let mut items = Vec::new();
    if !c.reasoning.is_empty() {
        items.push(reasoning_item(&ids.reasoning, &c.reasoning, "completed"));
    }
    if !c.content.is_empty() || c.tool_calls.is_empty() {
        items.push(message_item(&ids.message, &c.content, "completed"));
    }
    items.extend(c.tool_calls.iter().map(|t| call_item(t, "completed")));
    items
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Json {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Json {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([text_part(text)])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn text_part(text: &str) -> Json {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(t: &ToolCallOut, status: &str) -> Json {
    json!({"type": "function_call", "id": format!("fc_{}", t.id.trim_start_matches("call_")), "call_id": t.id,
           "name": t.name, "arguments": t.arguments_string(), "status": status})
}

struct Shell {
    model: String,
    created: u64,
    body: Map<String, Json>,
}

/// Why a response is incomplete: `max_output_tokens`, or `error` when the output
/// constraint reached a dead end (finish reason `error`); `None` when it completed.
fn incomplete_reason(finish: Option<&str>) -> Option<&'static str> {
    match finish {
        Some("length") => Some("max_output_tokens"),
        Some("error") => Some("error"),
        _ => None,
    }
}

impl Shell {
    fn response(
        &self,
        id: &str,
        status: &str,
        output: Vec<Json>,
        usage: Option<Json>,
        incomplete: Option<&str>,
    ) -> Json {
        let b = &self.body;
        json!({
            "id": id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "error": null,
            "incomplete_details": incomplete.map_or(Json::Null, |r| json!({"reason": r})),
            "instructions": b.get("instructions").cloned().unwrap_or(Json::Null),
            "max_output_tokens": b.get("max_output_tokens").cloned().unwrap_or(Json::Null),
            "temperature": b.get("temperature").cloned().unwrap_or(Json::Null),
            "top_p": b.get("top_p").cloned().unwrap_or(Json::Null),
            "tools": b.get("tools").cloned().unwrap_or(json!([])),
            "tool_choice": b.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "parallel_tool_calls": true, "metadata": b.get("metadata").cloned().unwrap_or(json!({})),
            "text": b.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
            "usage": usage,
        })
    }
}

fn usage(prompt: usize, output: usize, cached: usize) -> Json {
    json!({"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
           "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": prompt + output})
}

/// `POST /v1/responses`.
pub async fn responses(
    state: Arc<AppState>,
    body: Map<String, Json>,
) -> Result<Response<Body>, ApiError> {
    let b = Req(&body);
    if b.get("previous_response_id").is_some() {
        return Err(ApiError::invalid_param(
            "previous_response_id",
            "previous_response_id is not supported: this server keeps no response state; send the conversation in input",
        ));
    }
    let mut params = params::common(&b, &state.cfg, Flavor::Responses)?;
    params.n = 1;
    let messages = to_chat(&b)?;
    let tools = apply_tool_choice(to_openai_tools(&b)?, b.get("tool_choice"))?;
    let parallel = b.bool("parallel_tool_calls")?.unwrap_or(true);
    let wanted = crate::structured::combine(
        crate::structured::output_constraint(&b, true)?,
        crate::structured::forced_tool_calls(b.get("tool_choice"), tools.as_deref(), parallel)?,
    )?;
    let kwargs = params.chat_template_kwargs.clone();
    let st = Arc::clone(&state);
    let prepared = blocking(move || chat_prompt(&st, &messages, tools, &kwargs, None)).await?;
    let (req, spec) = finish_request(&state, prepared, &params, true)?;
    let req = crate::structured::constrain(&state, wanted, spec.initial, req).await?;
    let prompt_tokens = req.prompt.len();
    let ids = Ids {
        response: format!("resp_{}", random_hex(32)),
        message: format!("msg_{}", random_hex(32)),
        reasoning: format!("rs_{}", random_hex(32)),
    };
    let shell = Shell {
        model: params.model.clone(),
        created: state.info.created,
        body,
    };
    let sub = crate::http::submit(&state, req)?;
    let guard = sub.guard();
    let gen = Generation::new(sub, spec);
    if !params.stream {
        let (choices, gen) = collect(gen, 1).await?;
        let c = choices.into_iter().next().unwrap_or_default();
        let incomplete = incomplete_reason(c.finish);
        let u = usage(prompt_tokens, gen.completion_tokens(), gen.cached_tokens());
        let status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let resp = shell.response(
            &ids.response,
            status,
            output_items(&c, &ids),
            Some(u),
            incomplete,
        );
        return Ok(json_response(StatusCode::OK, &resp));
    }
    let (response, tx) = sse_response(Some(guard));
    let mut w = EventWriter {
        seq: 0,
        frames: Vec::new(),
    };
    let created = shell.response(&ids.response, "in_progress", Vec::new(), None, None);
    w.emit("response.created", json!({"response": created.clone()}));
    w.emit("response.in_progress", json!({"response": created}));
    for f in w.frames.drain(..) {
        if tx.send(f).await.is_err() {
            return Ok(response);
        }
    }
    let mut items = ItemState::default();
    let mut all = Collected::default();
    tokio::spawn(pump(
        gen,
        tx,
        state.cfg.keepalive_interval,
        move |u, gen| {
            match u {
                Some(Update::Delta { delta, .. }) => {
                    if !delta.reasoning.is_empty() {
                        items.text(&mut w, &ids, true, &delta.reasoning);
                        all.reasoning.push_str(&delta.reasoning);
                    }
                    if !delta.content.is_empty() {
                        items.text(&mut w, &ids, false, &delta.content);
                        all.content.push_str(&delta.content);
                    }
                    for c in &delta.tool_calls {
                        items.call(&mut w, &ids, c);
                        all.tool_calls.push(c.clone());
                    }
                }
                Some(Update::Finished { reason, .. }) => all.finish = Some(reason),
                Some(Update::Failed(e)) => {
                    w.emit("error", json!({"code": e.status.as_u16().to_string(), "message": e.message, "param": e.param}));
                    return (std::mem::take(&mut w.frames), true);
                }
                Some(_) => {}
                None => {
                    items.close(&mut w, &ids);
                    let incomplete = incomplete_reason(all.finish);
                    let u = usage(prompt_tokens, gen.completion_tokens(), gen.cached_tokens());
                    let status = if incomplete.is_some() {
                        "incomplete"
                    } else {
                        "completed"
                    };
                    let mut output = Vec::new();
                    if !all.reasoning.is_empty() {
                        output.push(reasoning_item(&ids.reasoning, &all.reasoning, "completed"));
                    }
                    if items.message_opened {
                        output.push(message_item(&ids.message, &all.content, "completed"));
                    }
                    output.extend(all.tool_calls.iter().map(|t| call_item(t, "completed")));
                    let resp = shell.response(&ids.response, status, output, Some(u), incomplete);
                    let name = if incomplete.is_some() {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    w.emit(name, json!({"response": resp}));
                    return (std::mem::take(&mut w.frames), true);
                }
            }
            (std::mem::take(&mut w.frames), false)
        },
    ));
    Ok(response)
}

struct EventWriter {
    seq: u64,
    frames: Vec<bytes::Bytes>,
}

impl EventWriter {
    fn emit(&mut self, kind: &str, mut data: Json) {
        if let Some(o) = data.as_object_mut() {
            o.insert("type".into(), json!(kind));
            o.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        self.frames.push(sse_event(kind, &data));
    }
}

/// Which output item is open, and the text each has so far.
#[derive(Default)]
struct ItemState {
    open: Option<bool>,
    next_index: usize,
    text: String,
    message_opened: bool,
}

impl ItemState {
    fn close(&mut self, w: &mut EventWriter, ids: &Ids) {
        let Some(reasoning) = self.open.take() else {
            return;
        };
        let index = self.next_index - 1;
        let text = std::mem::take(&mut self.text);
        if reasoning {
            let id = &ids.reasoning;
            w.emit(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            );
            w.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": reasoning_item(id, &text, "completed")}),
            );
        } else {
            let id = &ids.message;
            w.emit("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
            w.emit("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}));
            w.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": message_item(id, &text, "completed")}),
            );
        }
    }

    fn text(&mut self, w: &mut EventWriter, ids: &Ids, reasoning: bool, delta: &str) {
        if self.open != Some(reasoning) {
            self.close(w, ids);
            let index = self.next_index;
            self.next_index += 1;
            self.open = Some(reasoning);
            if reasoning {
                let item = json!({"type": "reasoning", "id": ids.reasoning, "status": "in_progress", "summary": [], "content": []});
                w.emit(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                );
            } else {
                self.message_opened = true;
                w.emit("response.output_item.added", json!({"output_index": index, "item": message_item(&ids.message, "", "in_progress")}));
                w.emit("response.content_part.added", json!({"item_id": ids.message, "output_index": index, "content_index": 0, "part": text_part("")}));
            }
        }
        self.text.push_str(delta);
        let index = self.next_index - 1;
        if reasoning {
            w.emit("response.reasoning_text.delta", json!({"item_id": ids.reasoning, "output_index": index, "content_index": 0, "delta": delta}));
        } else {
            w.emit("response.output_text.delta", json!({"item_id": ids.message, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}));
        }
    }

    fn call(&mut self, w: &mut EventWriter, ids: &Ids, c: &ToolCallOut) {
        self.close(w, ids);
        let index = self.next_index;
        self.next_index += 1;
        let item = call_item(c, "in_progress");
        let id = item["id"].clone();
        let mut added = item.clone();
        added["arguments"] = json!("");
        w.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        let args = c.arguments_string();
        w.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": args}),
        );
        w.emit(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": args}),
        );
        let mut done = item;
        done["status"] = json!("completed");
        w.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        );
    }
}

//! Structured output: the request fields that constrain an answer, read into one
//! [`Constraint`] and attached to the engine request as a logits processor
//! (`mlx_engine::constrain`, llguidance).
//!
//! - OpenAI chat / completions: `response_format` (`text`, `json_object`,
//!   `json_schema` with `strict`); chat `tool_choice` `required` / a named function
//!   (the answer is one or more tool calls in the model's own format, each valid against
//!   its tool's parameter schema; `parallel_tool_calls: false` allows one).
//! - Responses: `text.format`; `tool_choice` as in chat.
//! - Anthropic Messages: `tool_choice` `any` / `tool` (`disable_parallel_tool_use`).
//! - Extensions: llama.cpp's `grammar` (GBNF) and `json_schema`; vLLM's `guided_json`,
//!   `guided_regex`, `guided_choice`, `guided_grammar` and `structured_outputs`
//!   (`json`, `regex`, `choice`, `grammar`). A grammar with `::=` is GBNF, else Lark.
//!
//! At most one of them per request; an invalid schema or grammar, an unknown format
//! type or a tool-call format the engine cannot constrain is a 400 naming it. With a
//! reasoning model the constraint starts after the thinking section.
use crate::error::ApiError;
use crate::http::AppState;
use crate::params::{tool_name, Body};
use crate::text::Channel;
use mlx_engine::batch::GenerationRequest;
use mlx_engine::{Constraint, ConstraintVocab, EngineError};
use serde_json::Value as Json;
use std::sync::Arc;

/// What a request asks the answer to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Wanted {
    /// Text matching a constraint; `field` names where it came from.
    Output {
        /// The constraint.
        constraint: Constraint,
        /// The request field that asked for it.
        field: &'static str,
    },
    /// Tool calls only, to one of `tools` (OpenAI function tools).
    ToolCalls {
        /// The callable tools.
        tools: Vec<Json>,
        /// More than one call allowed.
        parallel: bool,
    },
}

fn invalid(field: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(field, msg.into())
}

/// A JSON schema given as an object or as JSON text.
fn schema_value(field: &'static str, v: &Json) -> Result<Json, ApiError> {
    let schema = match v {
        Json::String(s) => serde_json::from_str(s)
            .map_err(|e| invalid(field, format!("{field} is not valid JSON: {e}")))?,
        other => other.clone(),
    };
    if !schema.is_object() {
        return Err(invalid(
            field,
            format!("{field} must be a JSON schema object"),
        ));
    }
    Ok(schema)
}

fn grammar_of(field: &'static str, v: &Json) -> Result<Constraint, ApiError> {
    let g = v
        .as_str()
        .ok_or_else(|| invalid(field, format!("{field} must be a string")))?;
    if g.trim().is_empty() {
        return Err(invalid(field, format!("{field} is empty")));
    }
    Ok(if g.contains("::=") {
        Constraint::Gbnf(g.to_string())
    } else {
        Constraint::Lark(g.to_string())
    })
}

fn choice_of(field: &'static str, v: &Json) -> Result<Constraint, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| invalid(field, format!("{field} must be a list of strings")))?;
    let list: Vec<String> = list
        .iter()
        .map(|c| c.as_str().map(str::to_string))
        .collect::<Option<_>>()
        .ok_or_else(|| invalid(field, format!("{field} must be a list of strings")))?;
    if list.is_empty() {
        return Err(invalid(field, format!("{field} must not be empty")));
    }
    Ok(Constraint::Choice(list))
}

fn regex_of(field: &'static str, v: &Json) -> Result<Constraint, ApiError> {
    v.as_str()
        .map(|r| Constraint::Regex(r.to_string()))
        .ok_or_else(|| invalid(field, format!("{field} must be a string")))
}

/// OpenAI's `response_format` / the Responses API's `text.format` (`flat`: the schema
/// sits in the format object itself, not under `json_schema`).
fn response_format(
    field: &'static str,
    f: &Json,
    flat: bool,
) -> Result<Option<Constraint>, ApiError> {
    let Json::Object(o) = f else {
        return Err(invalid(field, format!("{field} must be an object")));
    };
    match o.get("type").and_then(Json::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let holder = if flat { Some(f) } else { o.get("json_schema") };
            let schema = holder.and_then(|h| h.get("schema")).ok_or_else(|| {
                let at = if flat { "schema" } else { "json_schema.schema" };
                invalid(
                    field,
                    format!("{field}.{at} is required for type json_schema"),
                )
            })?;
            Ok(Some(Constraint::JsonSchema(schema_value(field, schema)?)))
        }
        Some(other) => Err(invalid(
            field,
            format!(
                "{field}.type `{other}` is not supported: use text, json_object or json_schema"
            ),
        )),
        None => Err(invalid(field, format!("{field}.type is required"))),
    }
}

/// vLLM's `structured_outputs` object.
fn structured_outputs(o: &Json) -> Result<Vec<(Constraint, &'static str)>, ApiError> {
    const F: &str = "structured_outputs";
    let Json::Object(m) = o else {
        return Err(invalid(F, "structured_outputs must be an object"));
    };
    let mut out = Vec::new();
    for (k, v) in m {
        if v.is_null() {
            continue;
        }
        let c = match k.as_str() {
            "json" => Constraint::JsonSchema(schema_value(F, v)?),
            "regex" => regex_of(F, v)?,
            "choice" => choice_of(F, v)?,
            "grammar" => grammar_of(F, v)?,
            "json_object" if v.as_bool() == Some(true) => Constraint::JsonObject,
            "json_object" => continue,
            other => {
                return Err(invalid(
                    F,
                    format!("structured_outputs.{other} is not supported: use json, regex, choice or grammar"),
                ))
            }
        };
        out.push((c, F));
    }
    Ok(out)
}

/// The output constraints of the body (`response_format` for chat and completions,
/// `text.format` for responses, plus the extensions).
pub fn output_constraint(body: &Body<'_>, responses: bool) -> Result<Option<Wanted>, ApiError> {
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    if responses {
        if let Some(f) = body.object("text")?.and_then(|t| t.get("format")) {
            if let Some(c) = response_format("text.format", f, true)? {
                found.push((c, "text.format"));
            }
        }
    } else if let Some(f) = body.get("response_format") {
        if let Some(c) = response_format("response_format", f, false)? {
            found.push((c, "response_format"));
        }
    }
    if let Some(v) = body.get("grammar") {
        found.push((grammar_of("grammar", v)?, "grammar"));
    }
    if let Some(v) = body.get("json_schema") {
        found.push((
            Constraint::JsonSchema(schema_value("json_schema", v)?),
            "json_schema",
        ));
    }
    if let Some(v) = body.get("guided_json") {
        found.push((
            Constraint::JsonSchema(schema_value("guided_json", v)?),
            "guided_json",
        ));
    }
    if let Some(v) = body.get("guided_regex") {
        found.push((regex_of("guided_regex", v)?, "guided_regex"));
    }
    if let Some(v) = body.get("guided_choice") {
        found.push((choice_of("guided_choice", v)?, "guided_choice"));
    }
    if let Some(v) = body.get("guided_grammar") {
        found.push((grammar_of("guided_grammar", v)?, "guided_grammar"));
    }
    if let Some(v) = body.get("structured_outputs") {
        found.extend(structured_outputs(v)?);
    }
    match found.len() {
        0 => Ok(None),
        1 => {
            let (constraint, field) = found.remove(0);
            Ok(Some(Wanted::Output { constraint, field }))
        }
        _ => {
            let names: Vec<&str> = found.iter().map(|(_, f)| *f).collect();
            Err(invalid(
                names[1],
                format!(
                    "only one output constraint may be given, got {}",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// Whether `tool_choice` (OpenAI's shape, after mapping Anthropic's) forces a call:
/// `required` / `any`, or a named function. `tools` are those the template sees (only
/// the named one for a named choice).
pub fn forced_tool_calls(
    choice: Option<&Json>,
    tools: Option<&[Json]>,
    parallel: bool,
) -> Result<Option<Wanted>, ApiError> {
    let forced = match choice {
        Some(Json::String(s)) => s == "required" || s == "any",
        Some(Json::Object(o)) => {
            let kind = o.get("type").and_then(Json::as_str);
            matches!(kind, Some("any"))
                || (!matches!(kind, Some("auto" | "none"))
                    && tool_name(&Json::Object(o.clone())).is_some())
        }
        _ => false,
    };
    if !forced {
        return Ok(None);
    }
    let tools = tools.filter(|t| !t.is_empty()).ok_or_else(|| {
        invalid(
            "tool_choice",
            "tool_choice forces a tool call, but no tools were given",
        )
    })?;
    Ok(Some(Wanted::ToolCalls {
        tools: tools.to_vec(),
        parallel,
    }))
}

/// Checks that at most one of an output constraint and forced tool calls is asked for.
pub fn combine(output: Option<Wanted>, tools: Option<Wanted>) -> Result<Option<Wanted>, ApiError> {
    match (output, tools) {
        (Some(Wanted::Output { field, .. }), Some(_)) => Err(invalid(
            "tool_choice",
            format!("tool_choice forces a tool call, which cannot be combined with {field}"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// The server's constraint vocabulary, built on first use.
fn vocab(state: &AppState) -> Result<ConstraintVocab, ApiError> {
    state
        .constraints
        .get_or_init(|| ConstraintVocab::new(&state.tokenizer).map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| {
            ApiError::bad_request(format!(
                "structured output is not available for this model: {e}"
            ))
        })
}

/// Compiles `wanted` (or takes it from the vocabulary's cache of compiled constraints:
/// requests with the same schema or grammar compile it once) and adds it to `req`'s
/// processors (`initial`: where the answer starts; in a reasoning section the
/// constraint waits for its end). Blocking: call off the async workers.
pub fn attach(
    state: &AppState,
    wanted: &Wanted,
    initial: Channel,
    req: &mut GenerationRequest,
) -> Result<(), ApiError> {
    let vocab = vocab(state)?;
    let (constraint, field) = match wanted {
        Wanted::Output { constraint, field } => (constraint.clone(), *field),
        Wanted::ToolCalls { tools, parallel } => (
            Constraint::Lark(crate::tool_grammar::tool_grammar(
                state.info.tool_format,
                tools,
                *parallel,
                &vocab,
            )?),
            "tools",
        ),
    };
    let (compiled, now) = vocab.compile_cached(&constraint).map_err(|e| match e {
        EngineError::Invalid(m) => invalid(field, format!("{field}: {m}")),
        other => ApiError::from(other),
    })?;
    if now {
        state.metrics.constraint_compiles.add(1);
    } else {
        state.metrics.constraint_cache_hits.add(1);
    }
    let compiled = match (initial, state.tokenizer.think_markers()) {
        (Channel::Reasoning, Some(m)) => compiled.start_after(m.end_tokens.clone()),
        _ => compiled,
    };
    req.processors.push(Arc::new(compiled));
    Ok(())
}

/// [`attach`] off the async workers, when something is wanted.
pub async fn constrain(
    state: &Arc<AppState>,
    wanted: Option<Wanted>,
    initial: Channel,
    mut req: GenerationRequest,
) -> Result<GenerationRequest, ApiError> {
    let Some(w) = wanted else {
        return Ok(req);
    };
    let st = Arc::clone(state);
    crate::openai::blocking(move || {
        attach(&st, &w, initial, &mut req)?;
        Ok(req)
    })
    .await
}

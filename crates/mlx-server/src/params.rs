//! Request fields shared by the endpoints, read and checked like mlx-lm's
//! `validate_model_parameters` (types and ranges), with OpenAI's extras (`n`,
//! `tool_choice`, `max_completion_tokens`, integer `logprobs` on completions).
use crate::config::ServerConfig;
use crate::error::ApiError;
use mlx_engine::Sampling;
use mlx_sample::{LogitsParams, SamplerParams};
use serde_json::{Map, Value as Json};

/// Largest `max_tokens` accepted.
pub const MAX_TOKENS_LIMIT: i64 = 1 << 31;
/// Largest `n` accepted.
pub const MAX_N: i64 = 16;
/// Largest `top_logprobs` accepted (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Largest integer `logprobs` of `/v1/completions` (OpenAI's legacy bound).
pub const MAX_COMPLETION_LOGPROBS: i64 = 5;

/// A request body as a JSON object with typed getters that answer 400 on bad values.
pub struct Body<'a>(pub &'a Map<String, Json>);

fn type_err(name: &str, what: &str) -> ApiError {
    ApiError::invalid_param(name, format!("{name} must be {what}"))
}

impl<'a> Body<'a> {
    /// The raw value (`null` counts as absent).
    pub fn get(&self, name: &str) -> Option<&'a Json> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A boolean.
    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(type_err(name, "a boolean")),
        }
    }

    /// An integer within `[min, max]`.
    pub fn int(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let i = v.as_i64().ok_or_else(|| type_err(name, "an integer"))?;
        if i < min {
            return Err(ApiError::invalid_param(
                name,
                format!("{name} must be at least {min}"),
            ));
        }
        if i > max {
            return Err(ApiError::invalid_param(
                name,
                format!("{name} must be at most {max}"),
            ));
        }
        Ok(Some(i))
    }

    /// A number within `[min, max]`.
    pub fn num(&self, name: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let f = v
            .as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| type_err(name, "a number"))?;
        if f < min {
            return Err(ApiError::invalid_param(
                name,
                format!("{name} must be at least {min}"),
            ));
        }
        if f > max {
            return Err(ApiError::invalid_param(
                name,
                format!("{name} must be at most {max}"),
            ));
        }
        Ok(Some(f))
    }

    /// A string.
    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(_) => Err(type_err(name, "a string")),
        }
    }

    /// An object.
    pub fn object(&self, name: &str) -> Result<Option<&'a Map<String, Json>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Object(m)) => Ok(Some(m)),
            Some(_) => Err(type_err(name, "an object")),
        }
    }

    /// An array.
    pub fn array(&self, name: &str) -> Result<Option<&'a Vec<Json>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Array(a)) => Ok(Some(a)),
            Some(_) => Err(type_err(name, "an array")),
        }
    }
}

/// Generation settings common to all endpoints.
#[derive(Debug, Clone)]
pub struct CommonParams {
    /// The model name to echo.
    pub model: String,
    /// Stream the answer.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Token budget.
    pub max_tokens: usize,
    /// Sampler settings.
    pub sampling: Sampling,
    /// Logits processors.
    pub logits: LogitsParams,
    /// Stop words.
    pub stop: Vec<String>,
    /// Per-token log-probabilities.
    pub logprobs: bool,
    /// Alternatives per token.
    pub top_logprobs: usize,
    /// Choices.
    pub n: usize,
    /// Extra chat-template variables.
    pub chat_template_kwargs: Map<String, Json>,
    /// Speculative decoding asked for (see [`speculation`]).
    pub speculation: Speculation,
    /// vLLM's stopping extensions (see [`StopControl`]).
    pub stop_control: StopControl,
}

/// vLLM's request fields that change where an answer may stop (mlx-lm has none of
/// them): `min_tokens`, `ignore_eos`, `stop_token_ids`, `include_stop_str_in_output`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopControl {
    /// No end-of-sequence token, stop token or stop word ends a choice before it has
    /// this many tokens (the end-of-sequence and stop tokens are masked until then).
    pub min_tokens: usize,
    /// The model's end-of-sequence tokens do not end the answer.
    pub ignore_eos: bool,
    /// More tokens that end the answer as the end-of-sequence token does (not shown).
    pub stop_token_ids: Vec<u32>,
    /// The stop word that ended the answer is kept at the end of its text.
    pub include_stop_str_in_output: bool,
}

fn stop_control(body: &Body<'_>, max_tokens: i64) -> Result<StopControl, ApiError> {
    let min_tokens = body.int("min_tokens", 0, max_tokens)?.unwrap_or(0) as usize;
    let stop_token_ids = match body.array("stop_token_ids")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "stop_token_ids",
                    "stop_token_ids must be a list of non-negative token ids",
                )
            })?,
    };
    Ok(StopControl {
        min_tokens,
        ignore_eos: body.bool("ignore_eos")?.unwrap_or(false),
        stop_token_ids,
        include_stop_str_in_output: body.bool("include_stop_str_in_output")?.unwrap_or(false),
    })
}

/// The speculative-decoding fields of a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Speculation {
    /// Speculate with the server's draft model (one is loaded and the request did not
    /// name another).
    pub draft_model: bool,
    /// Tokens drafted per round (`num_draft_tokens`, else the server's default for the
    /// draft model and [`PREDICTION_DRAFT_TOKENS`] for a prediction).
    pub num_draft_tokens: Option<usize>,
    /// OpenAI's predicted output (`prediction.content`, chat completions).
    pub prediction: Option<String>,
}

/// Tokens drafted per round from an OpenAI predicted output when the request does not
/// say (prompt lookup: a long draft costs one wider verification).
pub const PREDICTION_DRAFT_TOKENS: usize = 10;

/// Which names the endpoint uses for a few fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions` (`logprobs` may be an integer).
    Completions,
    /// `/v1/messages` (`stop_sequences`, `max_tokens` required).
    Anthropic,
    /// `/v1/responses` (`max_output_tokens`).
    Responses,
}

/// Top-level request fields every endpoint reads (sampling, logits processors,
/// stopping, speculation, structured output, adapters).
const COMMON_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "xtc_probability",
    "xtc_threshold",
    "seed",
    "logit_bias",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "presence_context_size",
    "frequency_penalty",
    "frequency_context_size",
    "logprobs",
    "top_logprobs",
    "n",
    "chat_template_kwargs",
    "draft_model",
    "num_draft_tokens",
    "adapters",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
    "grammar",
    "json_schema",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "role_mapping",
    // Bookkeeping that does not change the answer (OpenAI's and Anthropic's).
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
];

/// The further fields of each endpoint.
fn endpoint_fields(flavor: Flavor) -> &'static [&'static str] {
    match flavor {
        Flavor::Chat => &[
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "stop",
            "response_format",
            "prediction",
            "reasoning_effort",
        ],
        Flavor::Completions => &[
            "prompt",
            "max_tokens",
            "stop",
            "response_format",
            "echo",
            "best_of",
            "suffix",
        ],
        Flavor::Anthropic => &[
            "messages",
            "max_tokens",
            "stop_sequences",
            "system",
            "thinking",
        ],
        Flavor::Responses => &[
            "input",
            "instructions",
            "max_output_tokens",
            "text",
            "previous_response_id",
            "reasoning",
            "include",
            "truncation",
        ],
    }
}

/// Fields a client may send that would change the answer in a way this server cannot
/// give: a 400 naming them, never a silently different answer. Fields outside every
/// known list are logged as ignored (vLLM's behaviour; mlx-lm ignores them silently).
fn check_fields(body: &Body<'_>, flavor: Flavor) -> Result<(), ApiError> {
    let refuse = |name: &str, why: &str| Err(ApiError::invalid_param(name, why.to_string()));
    if let Some(name) = ["functions", "function_call"]
        .into_iter()
        .find(|f| body.get(f).is_some())
    {
        return refuse(
            name,
            "the deprecated `functions` / `function_call` fields are not supported: send \
             `tools` and `tool_choice`",
        );
    }
    if body.bool("use_beam_search")? == Some(true) {
        return refuse("use_beam_search", "beam search is not supported");
    }
    if body.get("prompt_logprobs").is_some() {
        return refuse(
            "prompt_logprobs",
            "prompt_logprobs is not supported: send `echo: true` with `logprobs` to \
             /v1/completions for the prompt's log-probabilities",
        );
    }
    if let Some(m) = body.array("modalities")? {
        if m.iter().any(|v| v.as_str() != Some("text")) {
            return refuse("modalities", "only the `text` modality is supported");
        }
    }
    if body.get("audio").is_some() {
        return refuse("audio", "audio output is not supported");
    }
    if flavor == Flavor::Completions {
        if body.str("suffix")?.is_some_and(|s| !s.is_empty()) {
            return refuse("suffix", "suffix (text insertion) is not supported");
        }
        let n = body.int("n", 1, MAX_N)?.unwrap_or(1);
        if let Some(best_of) = body.int("best_of", 1, i64::MAX)? {
            if best_of != 1 && best_of != n {
                return refuse(
                    "best_of",
                    "best_of other than 1 or n is not supported (each choice is returned)",
                );
            }
        }
    }
    if flavor == Flavor::Responses {
        if body.bool("background")? == Some(true) {
            return refuse("background", "background responses are not supported");
        }
        if let Some(t) = body.str("truncation")?.filter(|t| *t != "disabled") {
            return refuse(
                "truncation",
                &format!("truncation `{t}` is not supported: the prompt is never truncated"),
            );
        }
    }
    let known = endpoint_fields(flavor);
    let ignored: Vec<&str> = body
        .0
        .keys()
        .map(String::as_str)
        .filter(|k| !COMMON_FIELDS.contains(k) && !known.contains(k))
        .collect();
    if !ignored.is_empty() {
        tracing::warn!(
            "request fields not supported, ignored: {}",
            ignored.join(", ")
        );
    }
    Ok(())
}

/// Checks the request's `model` against the served one (404 when unknown).
pub fn check_model(body: &Body<'_>, cfg: &ServerConfig) -> Result<String, ApiError> {
    let model = body.str("model")?.unwrap_or("default_model");
    // mlx-lm's server loads a request's `adapters` on the fly; the model pool routes
    // such a request to the model loaded with them, so any other is a bug, refused.
    if let Some(a) = body.str("adapters")? {
        if cfg.adapter_path.as_deref() != Some(a) {
            return Err(ApiError::invalid_param(
                "adapters",
                format!(
                    "the model `{}` is not served with the adapters `{a}`",
                    cfg.model_id
                ),
            ));
        }
    }
    if !cfg.serves_model(model) {
        return Err(ApiError {
            param: Some("model".into()),
            ..ApiError::not_found(format!(
                "The model `{model}` does not exist; this server serves `{}`",
                cfg.model_id
            ))
        });
    }
    Ok(model.to_string())
}

/// mlx-lm's per-request `draft_model` / `num_draft_tokens` and OpenAI's `prediction`.
/// A request speculates with the server's draft model when one is loaded (mlx-lm's
/// `"default_model"`, its name or none given); naming a draft model that is not the
/// loaded one is refused (mlx-lm would load it in place of the model; the pool does not
/// swap drafts per request). `num_draft_tokens` must be 1 to 64. `prediction` (chat
/// completions only, as OpenAI) drafts by prompt lookup against its text.
pub fn speculation(
    body: &Body<'_>,
    cfg: &ServerConfig,
    flavor: Flavor,
) -> Result<Speculation, ApiError> {
    let requested = body.str("draft_model")?;
    let draft_model = match (requested, &cfg.draft_model) {
        (None | Some("default_model"), loaded) => loaded.is_some(),
        (Some(d), Some(loaded)) if d == loaded => true,
        (Some(d), Some(loaded)) => {
            return Err(ApiError::invalid_param(
                "draft_model",
                format!(
                    "the draft model `{d}` is not loaded: the model `{}` is served with the \
                     draft model `{loaded}`",
                    cfg.model_id
                ),
            ))
        }
        (Some(d), None) => {
            return Err(ApiError::invalid_param(
                "draft_model",
                format!(
                    "the draft model `{d}` is not loaded: the model `{}` is served without a \
                     draft model (start the server with --draft-model, or give the model a \
                     `draft_model` in --models-config)",
                    cfg.model_id
                ),
            ))
        }
    };
    let max = mlx_engine::speculative::MAX_NUM_DRAFT_TOKENS as i64;
    let num_draft_tokens = body.int("num_draft_tokens", 1, max)?.map(|n| n as usize);
    let prediction = match body.get("prediction") {
        None => None,
        Some(_) if flavor != Flavor::Chat => {
            return Err(ApiError::invalid_param(
                "prediction",
                "predicted outputs (`prediction`) are for chat completions only",
            ))
        }
        Some(p) => Some(prediction_text(p)?),
    };
    Ok(Speculation {
        draft_model,
        num_draft_tokens,
        prediction,
    })
}

/// OpenAI's `prediction`: `{"type": "content", "content": str | [{"type": "text",
/// "text": str}, ...]}`, as its text.
fn prediction_text(p: &Json) -> Result<String, ApiError> {
    let bad = |why: &str| ApiError::invalid_param("prediction", format!("prediction {why}"));
    let Some(o) = p.as_object() else {
        return Err(bad("must be an object"));
    };
    match o.get("type") {
        Some(Json::String(t)) if t == "content" => {}
        Some(Json::String(t)) => {
            return Err(bad(&format!("type must be \"content\", got \"{t}\"")))
        }
        _ => return Err(bad("needs \"type\": \"content\"")),
    }
    match o.get("content") {
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Json::as_str), part.get("text")) {
                    (Some("text"), Some(Json::String(t))) => text.push_str(t),
                    _ => {
                        return Err(bad(
                            "content parts must be {\"type\": \"text\", \"text\": string}",
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(bad("content must be a string or a list of text parts")),
    }
}

fn stop_words(v: Option<&Json>, name: &str) -> Result<Vec<String>, ApiError> {
    match v {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::String(s)) => Ok(if s.is_empty() {
            Vec::new()
        } else {
            vec![s.clone()]
        }),
        Some(Json::Array(a)) => a
            .iter()
            .map(|w| {
                w.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| type_err(name, "a string or a list of strings"))
            })
            .filter(|w| !matches!(w, Ok(s) if s.is_empty()))
            .collect(),
        Some(_) => Err(type_err(name, "a string or a list of strings")),
    }
}

/// Reads the common fields with the server defaults.
pub fn common(
    body: &Body<'_>,
    cfg: &ServerConfig,
    flavor: Flavor,
) -> Result<CommonParams, ApiError> {
    let model = check_model(body, cfg)?;
    check_fields(body, flavor)?;
    let speculation = speculation(body, cfg, flavor)?;
    let stream = body.bool("stream")?.unwrap_or(false);
    let include_usage = match body.object("stream_options")? {
        Some(o) => Body(o).bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let max_tokens =
        match flavor {
            Flavor::Responses => body.int("max_output_tokens", 1, MAX_TOKENS_LIMIT)?,
            Flavor::Anthropic => Some(body.int("max_tokens", 1, MAX_TOKENS_LIMIT)?.ok_or_else(
                || ApiError::invalid_param("max_tokens", "max_tokens: Field required"),
            )?),
            // `max_tokens: 0` with `echo` scores a completions prompt (checked there).
            _ => {
                let min = i64::from(flavor != Flavor::Completions);
                match body.int("max_completion_tokens", min, MAX_TOKENS_LIMIT)? {
                    Some(m) => Some(m),
                    None => body.int("max_tokens", min, MAX_TOKENS_LIMIT)?,
                }
            }
        }
        .unwrap_or(cfg.max_tokens);
    let temp = body.num("temperature", 0.0, f64::MAX)?.unwrap_or(cfg.temp);
    let top_p = body.num("top_p", 0.0, 1.0)?.unwrap_or(cfg.top_p);
    let top_k = body.int("top_k", 0, i32::MAX as i64)?.unwrap_or(cfg.top_k);
    let min_p = body.num("min_p", 0.0, 1.0)?.unwrap_or(cfg.min_p);
    let xtc_probability = body.num("xtc_probability", 0.0, 1.0)?.unwrap_or(0.0);
    let xtc_threshold = body.num("xtc_threshold", 0.0, 0.5)?.unwrap_or(0.1);
    let seed = body.int("seed", 0, i64::MAX)?.map(|s| s as u64);
    let ctx_max = i32::MAX as i64;
    let logits = LogitsParams {
        logit_bias: logit_bias(body)?,
        repetition_penalty: body.num("repetition_penalty", 0.0, f64::MAX)?,
        repetition_context_size: body
            .int("repetition_context_size", 0, ctx_max)?
            .unwrap_or(20) as i32,
        presence_penalty: body.num("presence_penalty", f64::MIN, f64::MAX)?,
        presence_context_size: body.int("presence_context_size", 0, ctx_max)?.unwrap_or(20) as i32,
        frequency_penalty: body.num("frequency_penalty", f64::MIN, f64::MAX)?,
        frequency_context_size: body
            .int("frequency_context_size", 0, ctx_max)?
            .unwrap_or(20) as i32,
    };
    let (logprobs, top_logprobs) = match (flavor, body.get("logprobs")) {
        (Flavor::Completions, Some(Json::Number(_))) => {
            let k = body.int("logprobs", 0, i64::MAX)?.unwrap_or(0);
            if k > MAX_COMPLETION_LOGPROBS {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    format!(
                        "logprobs must be at most {MAX_COMPLETION_LOGPROBS} (OpenAI's limit for \
                         completions), got {k}"
                    ),
                ));
            }
            (true, k as usize)
        }
        _ => {
            let lp = body.bool("logprobs")?.unwrap_or(false);
            let top = body
                .int("top_logprobs", -1, MAX_TOP_LOGPROBS)?
                .unwrap_or(-1);
            (lp, top.max(0) as usize)
        }
    };
    let stop = match flavor {
        Flavor::Anthropic => stop_words(body.get("stop_sequences"), "stop_sequences")?,
        _ => stop_words(body.get("stop"), "stop")?,
    };
    let n = body.int("n", 1, MAX_N)?.unwrap_or(1) as usize;
    let stop_control = stop_control(body, max_tokens)?;
    let mut chat_template_kwargs = body
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    // OpenAI's reasoning effort (chat `reasoning_effort`, Responses `reasoning.effort`)
    // reaches the chat template as the variable templates read (gpt-oss's), as vLLM
    // passes it; an explicit `chat_template_kwargs` entry wins.
    let effort = match flavor {
        Flavor::Chat => body.str("reasoning_effort")?,
        Flavor::Responses => match body.object("reasoning")? {
            Some(r) => Body(r).str("effort")?,
            None => None,
        },
        _ => None,
    };
    if let Some(e) = effort {
        chat_template_kwargs
            .entry("reasoning_effort")
            .or_insert_with(|| Json::String(e.to_string()));
    }
    let sampling = Sampling {
        params: SamplerParams {
            temp,
            top_p,
            min_p,
            top_k: top_k as i32,
            xtc_probability,
            xtc_threshold,
            ..Default::default()
        },
        seed,
    };
    Ok(CommonParams {
        model,
        stream,
        include_usage,
        max_tokens: max_tokens as usize,
        sampling,
        logits,
        stop,
        logprobs,
        top_logprobs,
        n,
        chat_template_kwargs,
        speculation,
        stop_control,
    })
}

fn logit_bias(body: &Body<'_>) -> Result<Vec<(i32, f64)>, ApiError> {
    let Some(m) = body.object("logit_bias")? else {
        return Ok(Vec::new());
    };
    m.iter()
        .map(|(k, v)| {
            let id: i32 = k.trim().parse().ok().filter(|i| *i >= 0).ok_or_else(|| {
                ApiError::invalid_param("logit_bias", "logit_bias must be a dict of int to float")
            })?;
            let b = v.as_f64().filter(|b| b.is_finite()).ok_or_else(|| {
                ApiError::invalid_param("logit_bias", "logit_bias must be a dict of int to float")
            })?;
            Ok((id, b))
        })
        .collect()
}

/// OpenAI's `tool_choice`: which tools the template sees. `none` hides them; a named
/// function keeps only that one; `auto` and `required` keep all (`required` and a
/// named function are then enforced by `structured::forced_tool_calls`).
pub fn apply_tool_choice(
    tools: Option<Vec<Json>>,
    choice: Option<&Json>,
) -> Result<Option<Vec<Json>>, ApiError> {
    let bad = || {
        ApiError::invalid_param("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    };
    match choice {
        None | Some(Json::Null) => Ok(tools),
        Some(Json::String(s)) => match s.as_str() {
            "none" => Ok(None),
            "auto" | "required" | "any" => Ok(tools),
            _ => Err(bad()),
        },
        Some(Json::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Json::as_str);
            let kind = o.get("type").and_then(Json::as_str);
            match (kind, name) {
                (Some("auto" | "any"), _) => Ok(tools),
                (Some("none"), _) => Ok(None),
                (_, Some(name)) => {
                    let kept: Vec<Json> = tools
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|t| tool_name(t) == Some(name))
                        .collect();
                    if kept.is_empty() {
                        return Err(ApiError::invalid_param(
                            "tool_choice",
                            format!("tool_choice names `{name}`, which is not in tools"),
                        ));
                    }
                    Ok(Some(kept))
                }
                _ => Err(bad()),
            }
        }
        Some(_) => Err(bad()),
    }
}

/// The function name of an OpenAI tool (`{"function": {"name"}}`) or a flat one (`{"name"}`).
pub fn tool_name(t: &Json) -> Option<&str> {
    t.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| t.get("name"))
        .and_then(Json::as_str)
}

/// Checks that tools are objects with a function name.
pub fn check_tools(tools: &[Json]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        if !t.is_object() || tool_name(t).is_none() {
            return Err(ApiError::invalid_param(
                "tools",
                format!("tools[{i}] must be an object with a function name"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(body: Json, flavor: Flavor) -> Result<CommonParams, ApiError> {
        let Json::Object(m) = body else {
            panic!("not an object")
        };
        common(&Body(&m), &ServerConfig::default(), flavor)
    }

    #[test]
    fn reasoning_effort_reaches_the_chat_template() {
        let kw = |body: Json, flavor| params(body, flavor).expect("params").chat_template_kwargs;
        let chat = kw(json!({"reasoning_effort": "low"}), Flavor::Chat);
        assert_eq!(chat.get("reasoning_effort"), Some(&json!("low")));
        let resp = kw(json!({"reasoning": {"effort": "high"}}), Flavor::Responses);
        assert_eq!(resp.get("reasoning_effort"), Some(&json!("high")));
        // An explicit template variable wins; other endpoints leave it alone.
        let both = kw(
            json!({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "medium"}}),
            Flavor::Chat,
        );
        assert_eq!(both.get("reasoning_effort"), Some(&json!("medium")));
        let none = kw(json!({"reasoning_effort": "low"}), Flavor::Completions);
        assert_eq!(none.get("reasoning_effort"), None);
        assert!(params(json!({"reasoning_effort": 3}), Flavor::Chat).is_err());
    }
}

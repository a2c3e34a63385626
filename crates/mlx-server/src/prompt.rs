//! Prompts: chat messages through the chat template (mlx-lm's
//! `process_message_content` + `apply_chat_template`), plain text, and the assembly of
//! an engine request with its stop sequences.
use crate::error::ApiError;
use crate::http::AppState;
use crate::output::{initial_channel, OutputSpec};
use crate::params::{CommonParams, Speculation, PREDICTION_DRAFT_TOKENS};
use crate::text::{Channel, Markers};
use crate::tools::ToolFormat;
use mlx_engine::batch::{CacheKind, DraftFrom, GenerationRequest, Speculate};
use mlx_tokenizer::{ChatOptions, Tokenizer, TokenizerError};
use serde_json::{Map, Value as Json};

/// A tokenized prompt ready to submit.
pub struct Prepared {
    /// Token ids.
    pub prompt: Vec<u32>,
    /// Where the answer starts.
    pub initial: Channel,
    /// Tools given to the template.
    pub tools: Option<Vec<Json>>,
    /// mlx-lm's segments of a chat prompt (see [`chat_segments`]); empty for others.
    pub segments: Vec<(usize, CacheKind)>,
}

/// The text of a message `content`: a string, `null`, or a list of text parts.
pub fn content_text(content: Option<&Json>, field: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Json::Null) => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                let kind = p.get("type").and_then(Json::as_str).unwrap_or("");
                match (kind, p.get("text").and_then(Json::as_str)) {
                    ("text" | "input_text" | "output_text", Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            field,
                            "Only 'text' content type is supported.",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid_param(
            field,
            format!("{field} must be a string or a list of content parts"),
        )),
    }
}

/// mlx-lm's `process_message_content`: text parts joined, `null` content as `""`, tool
/// call arguments given as JSON strings parsed to objects.
pub fn normalize_messages(messages: &[Json]) -> Result<Vec<Json>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Json::Object(obj) = m else {
            return Err(ApiError::invalid_param(
                "messages",
                format!("messages[{i}] must be an object"),
            ));
        };
        if !obj.get("role").is_some_and(Json::is_string) {
            return Err(ApiError::invalid_param(
                "messages",
                format!("messages[{i}].role must be a string"),
            ));
        }
        let mut obj = obj.clone();
        let text = content_text(obj.get("content"), &format!("messages[{i}].content"))?;
        obj.insert("content".into(), Json::String(text));
        if let Some(Json::Array(calls)) = obj.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                if let Some(Json::String(args)) = c.get("function").and_then(|f| f.get("arguments"))
                {
                    let parsed: Json = serde_json::from_str(args).map_err(|e| {
                        ApiError::invalid_param(
                            "messages",
                            format!("messages[{i}]: tool call arguments are not JSON: {e}"),
                        )
                    })?;
                    if let Some(f) = c.get_mut("function").and_then(Json::as_object_mut) {
                        f.insert("arguments".into(), parsed);
                    }
                }
            }
        }
        out.push(Json::Object(obj));
    }
    Ok(out)
}

/// mlx-lm's `convert_chat`: the fallback prompt for tokenizers without a template.
fn convert_chat(messages: &[Json], role_mapping: Option<&Map<String, Json>>) -> String {
    let default = |k: &str| -> &'static str {
        match k {
            "system_prompt" => "A chat between a curious user and an artificial intelligence assistant. The assistant follows the given rules no matter what.",
            "system" => "ASSISTANT's RULE: ",
            "user" => "USER: ",
            "assistant" => "ASSISTANT: ",
            "stop" => "\n",
            _ => "",
        }
    };
    let get = |k: &str| -> String {
        match role_mapping {
            Some(m) => m.get(k).and_then(Json::as_str).unwrap_or("").to_string(),
            None => default(k).to_string(),
        }
    };
    let mut prompt = String::new();
    for m in messages {
        let role = m.get("role").and_then(Json::as_str).unwrap_or("");
        let content = m.get("content").and_then(Json::as_str).unwrap_or("");
        prompt.push_str(&format!("{}{}{}", get(role), content, get("stop")));
    }
    prompt.push_str(&get("assistant"));
    prompt.trim_end().to_string()
}

fn template_error(e: TokenizerError) -> ApiError {
    ApiError::bad_request(format!("the chat template failed: {e}"))
}

/// Renders and tokenizes a chat.
pub fn chat_prompt(
    state: &AppState,
    messages: &[Json],
    tools: Option<Vec<Json>>,
    kwargs: &Map<String, Json>,
    role_mapping: Option<&Map<String, Json>>,
) -> Result<Prepared, ApiError> {
    let tok = &state.tokenizer;
    let messages = normalize_messages(messages)?;
    if !tok.has_chat_template() {
        let text = convert_chat(&messages, role_mapping);
        let prompt = tok
            .encode(&text, true)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        return Ok(Prepared {
            prompt,
            initial: Channel::Normal,
            tools: None,
            segments: Vec::new(),
        });
    }
    if tools.is_some() && state.info.tool_format.is_none() {
        tracing::warn!("received tools but the model's tool-call format is not supported; calls will be returned as text");
    }
    let mut all_kwargs = state.cfg.chat_template_args.clone();
    all_kwargs.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
    let opts = ChatOptions {
        add_generation_prompt: true,
        tools: tools.clone(),
        kwargs: all_kwargs,
        ..Default::default()
    };
    let prompt = tok
        .apply_chat_template_ids(&messages, &opts)
        .map_err(template_error)?;
    let initial = initial_channel(tok, &prompt);
    let segments = chat_segments(tok, &messages, &opts, &prompt);
    Ok(Prepared {
        prompt,
        initial,
        tools,
        segments,
    })
}

/// mlx-lm's segments of a chat prompt (`_tokenize` in its server), for prompt-cache
/// checkpoints at message boundaries: when the last message is the user's, the system
/// prompt (the leading system messages, where the prompt stops matching those messages
/// rendered before an empty user turn), then the conversation up to the thinking tail
/// (a think-start among the last 11 tokens, where a template opens the reasoning), then
/// that tail. Otherwise one segment. The second turn of a conversation whose template
/// drops earlier reasoning then still finds the first turn's system prompt and user
/// message in the cache.
pub fn chat_segments(
    tok: &Tokenizer,
    messages: &[Json],
    opts: &ChatOptions,
    prompt: &[u32],
) -> Vec<(usize, CacheKind)> {
    let role = |m: &Json| {
        m.get("role")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_string()
    };
    let n = prompt.len();
    if messages.last().map(role).as_deref() != Some("user") {
        return Vec::new();
    }
    let num_system = messages.iter().take_while(|m| role(m) == "system").count();
    let mut sys_end = 0;
    if num_system > 0 {
        let mut head = messages[..num_system].to_vec();
        head.push(serde_json::json!({"role": "user", "content": ""}));
        let head_opts = ChatOptions {
            add_generation_prompt: false,
            ..opts.clone()
        };
        if let Ok(sys) = tok.apply_chat_template_ids(&head, &head_opts) {
            if let Some(i) = sys.iter().zip(prompt).position(|(a, b)| a != b) {
                sys_end = i;
            }
        }
    }
    let mut segments = Vec::new();
    if sys_end > 0 && sys_end < n {
        segments.push((sys_end, CacheKind::System));
    }
    let mut tail_start = n;
    if let Some(m) = tok.think_markers() {
        let pat = &m.start_tokens;
        let from = n.saturating_sub(11);
        if !pat.is_empty() && pat.len() <= n {
            if let Some(i) = (from..=n - pat.len())
                .rev()
                .find(|&i| prompt[i..].starts_with(pat))
            {
                tail_start = i;
            }
        }
    }
    if sys_end < tail_start {
        segments.push((tail_start, CacheKind::User));
    }
    if tail_start < n {
        segments.push((n, CacheKind::Assistant));
    }
    if segments.is_empty() {
        segments.push((n, CacheKind::Assistant));
    }
    segments
}

/// Checks the prompt length and assembles the engine request and output settings.
pub fn finish_request(
    state: &AppState,
    prepared: Prepared,
    params: &CommonParams,
    chat: bool,
) -> Result<(GenerationRequest, OutputSpec), ApiError> {
    let Prepared {
        prompt,
        initial,
        tools,
        segments,
    } = prepared;
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    if let Some(ctx) = state.cfg.context_length {
        if prompt.len() >= ctx {
            return Err(ApiError::invalid_param(
                "messages",
                format!(
                    "the prompt has {} tokens but the model's context length is {ctx}",
                    prompt.len()
                ),
            ));
        }
    }
    let tok = &state.tokenizer;
    let ctl = &params.stop_control;
    // The tokens that end the answer unseen: the model's end-of-sequence tokens (unless
    // `ignore_eos`) and the request's `stop_token_ids`; then the stop words.
    let mut stop_ids: Vec<u32> = Vec::new();
    if !ctl.ignore_eos {
        stop_ids.extend(tok.eos_token_ids().iter().copied());
    }
    let vocab = state.info.vocab_size;
    for &id in &ctl.stop_token_ids {
        if vocab > 0 && id as usize >= vocab {
            return Err(ApiError::invalid_param(
                "stop_token_ids",
                format!("stop token id {id} is outside the model's vocabulary of {vocab}"),
            ));
        }
        if !stop_ids.contains(&id) {
            stop_ids.push(id);
        }
    }
    let mut stop_sequences: Vec<Vec<u32>> = stop_ids.iter().map(|&id| vec![id]).collect();
    let n_eos = stop_sequences.len();
    // Stop words also end the answer as token sequences in the engine, unless they may
    // not end it yet (`min_tokens`) or their text is kept: then the text router alone
    // finds them, once the answer is long enough.
    if ctl.min_tokens == 0 && !ctl.include_stop_str_in_output {
        for w in &params.stop {
            let ids = tok
                .encode(w, false)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            stop_sequences.push(ids);
        }
    }
    let mut processors: Vec<std::sync::Arc<dyn mlx_sample::BuildProcessor>> = Vec::new();
    if ctl.min_tokens > 0 && !stop_ids.is_empty() {
        processors.push(std::sync::Arc::new(mlx_sample::MinTokens::new(
            stop_ids,
            ctl.min_tokens,
            prompt.len(),
        )));
    }
    let mut sampling = params.sampling.clone();
    sampling.params.xtc_special_tokens = state.info.xtc_special_tokens.clone();
    let req = GenerationRequest {
        prompt,
        max_tokens: params.max_tokens,
        sampling,
        logits: params.logits.clone(),
        processors,
        stop_sequences,
        logprobs: params.logprobs,
        top_logprobs: params.top_logprobs,
        n: params.n,
        segments,
        prompt_logprobs: false,
        adapter: state.cfg.resident_adapter,
        speculate: speculate(state, &params.speculation)?,
    };
    let tool_format = if chat && tools.is_some() {
        state.info.tool_format
    } else {
        None
    };
    let markers = Markers {
        think: if chat {
            tok.think_markers()
                .map(|m| (m.start.clone(), m.end.clone()))
        } else {
            None
        },
        tool: tool_format.map(|f| {
            let (s, e) = f.markers();
            (s.to_string(), e.to_string())
        }),
        stop_words: params.stop.clone(),
        include_stop: ctl.include_stop_str_in_output,
    };
    let spec = OutputSpec {
        tokenizer: std::sync::Arc::clone(&state.tokenizer),
        markers,
        initial: if chat { initial } else { Channel::Normal },
        tool_format,
        tools,
        n: params.n,
        n_eos,
        min_tokens: ctl.min_tokens,
    };
    Ok((req, spec))
}

/// The engine's speculation of a request: a prediction (tokenized here) drafts by
/// prompt lookup; else the draft model when one is loaded and asked for.
fn speculate(state: &AppState, s: &Speculation) -> Result<Option<Speculate>, ApiError> {
    if let Some(text) = &s.prediction {
        let tokens = state
            .tokenizer
            .encode(text, false)
            .map_err(|e| ApiError::invalid_param("prediction", e.to_string()))?;
        if tokens.is_empty() {
            return Ok(None);
        }
        return Ok(Some(Speculate {
            from: DraftFrom::Prediction(tokens),
            num_draft_tokens: s.num_draft_tokens.unwrap_or(PREDICTION_DRAFT_TOKENS),
        }));
    }
    Ok(s.draft_model.then(|| Speculate {
        from: DraftFrom::DraftModel,
        num_draft_tokens: s.num_draft_tokens.unwrap_or(state.cfg.num_draft_tokens),
    }))
}

/// The tool-call format of a tokenizer (mlx-lm's inference, plus Llama 3 JSON).
pub fn detect_tool_format(tok: &Tokenizer) -> Option<ToolFormat> {
    ToolFormat::detect(tok.tool_parser_type(), tok.chat_template())
}

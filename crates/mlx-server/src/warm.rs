//! Filling the prompt cache at startup: `--prompt-cache-file` (a file of
//! `mlx-cache-prompt`, put in the cache by the engine) and `--warm-prompt` files,
//! prefilled before the first request is served.
use crate::completions::text_prompts;
use crate::error::ServerError;
use crate::http::AppState;
use crate::prompt::chat_prompt;
use mlx_engine::batch::{EngineEvent, GenerationRequest};
use serde_json::{Map, Value as Json};
use std::path::{Path, PathBuf};

/// Checks that `--prompt-cache-file` was made for the served model (mlx-lm's
/// `generate` refuses a file of another model the same way); the engine loads it.
pub fn check_prompt_cache_file(
    cfg: &crate::ServerConfig,
    path: &Path,
) -> Result<PathBuf, ServerError> {
    let metadata = mlx_engine::batch::file_metadata(path)
        .map_err(|e| ServerError::Config(format!("--prompt-cache-file: {e}")))?;
    if let Some(m) = metadata.get("model") {
        if m != "default" && !cfg.serves_model(m) {
            return Err(ServerError::Config(format!(
                "--prompt-cache-file {}: it was made for model {m}, this server serves {}",
                path.display(),
                cfg.model_id
            )));
        }
    }
    Ok(path.to_path_buf())
}

/// The tokens of a warm prompt: chat JSON (`{"messages": [...], "tools": [...]}` or a
/// list of messages) through the chat template with the generation prompt, like a chat
/// request; anything else is text, tokenized like a completion prompt.
pub fn warm_prompt_tokens(state: &AppState, text: &str) -> Result<Vec<u32>, String> {
    let json: Option<Json> = match text.trim_start().chars().next() {
        Some('{') | Some('[') => Some(
            serde_json::from_str(text)
                .map_err(|e| format!("it looks like JSON but is not: {e}"))?,
        ),
        _ => None,
    };
    let chat = |messages: &[Json], tools: Option<Vec<Json>>| {
        chat_prompt(state, messages, tools, &Map::new(), None)
            .map(|p| p.prompt)
            .map_err(|e| e.to_string())
    };
    match json {
        Some(Json::Array(messages)) => chat(&messages, None),
        Some(Json::Object(o)) => {
            let messages = o
                .get("messages")
                .and_then(Json::as_array)
                .ok_or("a JSON warm prompt needs a `messages` list")?;
            let tools = o.get("tools").and_then(Json::as_array).cloned();
            chat(messages, tools)
        }
        Some(_) => Err("a JSON warm prompt must be an object or a list of messages".into()),
        None => text_prompts(
            &state.tokenizer,
            state.info.vocab_size,
            &Json::String(text.into()),
        )
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or_else(|| "the prompt is empty".to_string()),
    }
}

/// Prefills every `--warm-prompt` (one token generated, the prompt's cache kept in the
/// prompt cache, and on disk with `--prompt-cache-dir`). A file that cannot be read or
/// rendered is an error; a failed generation is logged.
pub async fn prefill(state: &AppState) -> Result<(), ServerError> {
    for path in &state.cfg.warm_prompts {
        let bad = |m: String| ServerError::Config(format!("--warm-prompt {}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let tokens = warm_prompt_tokens(state, &text).map_err(bad)?;
        let n = tokens.len();
        let tic = std::time::Instant::now();
        let mut sub = state
            .engine
            .submit(GenerationRequest::new(tokens, 1))
            .map_err(|e| bad(e.message))?;
        let mut cached = 0;
        while let Some(ev) = sub.events.recv().await {
            match ev {
                EngineEvent::Started { cached_tokens, .. } => cached = cached_tokens,
                EngineEvent::Token { out, .. } if out.finish.is_some() => break,
                EngineEvent::Failed { error, .. } => {
                    tracing::warn!("--warm-prompt {}: {error}", path.display());
                    break;
                }
                _ => {}
            }
        }
        sub.release();
        tracing::info!(
            "warm prompt {}: {n} tokens ({cached} already cached) in {:.2} s",
            path.display(),
            tic.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

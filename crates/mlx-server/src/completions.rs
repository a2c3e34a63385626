//! `POST /v1/completions`: OpenAI's legacy completions. `prompt` is a string, a list of
//! strings, a list of token ids or a list of lists of token ids; every prompt is its own
//! engine request (the engine batches them) with `n` choices each, answered as choices
//! `prompt_index * n + choice` in order. `echo` returns the prompt before the
//! completion, and with `logprobs` the log-probability of every prompt token after the
//! first (the first is `null`, as OpenAI's legacy API has it), computed from the
//! prefill's logits; `max_tokens: 0` with `echo` scores the prompt and generates nothing
//! (lm-evaluation-harness's `local-completions` scores this way).
use crate::error::ApiError;
use crate::http::{json_response, random_hex, sse_data, sse_response, AppState, Body};
use crate::openai::{blocking, collect, sse_done, usage_json, Meta};
use crate::output::{pump, Generation, LogprobOut, Update};
use crate::params::{self, Body as Req, Flavor};
use crate::prompt::{finish_request, Prepared};
use hyper::{Response, StatusCode};
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;

const PROMPT_FORMS: &str =
    "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids";

fn token_ids(a: &[Json], vocab: usize, name: &str) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .filter(|i| (*i as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "prompt",
                        format!("{name}: token ids must be valid vocabulary ids (below {vocab})"),
                    )
                })
        })
        .collect()
}

fn encode(tok: &Tokenizer, s: &str) -> Result<Vec<u32>, ApiError> {
    tok.encode(s, true)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The prompts of a request, as token ids (strings encoded with special tokens, as
/// mlx-lm's server does). An empty list, a mix of forms or an empty prompt is refused.
pub fn text_prompts(
    tok: &Tokenizer,
    vocab: usize,
    prompt: &Json,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let prompts = match prompt {
        Json::String(s) => vec![encode(tok, s)?],
        Json::Array(a) if a.is_empty() => {
            return Err(ApiError::invalid_param(
                "prompt",
                "prompt must not be an empty list",
            ))
        }
        Json::Array(a) if a.iter().all(Json::is_number) => vec![token_ids(a, vocab, "prompt")?],
        Json::Array(a) if a.iter().all(Json::is_string) => a
            .iter()
            .map(|s| encode(tok, s.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        Json::Array(a) if a.iter().all(Json::is_array) => a
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ids = p.as_array().map(Vec::as_slice).unwrap_or_default();
                if ids.iter().any(|v| !v.is_number()) {
                    return Err(ApiError::invalid_param("prompt", PROMPT_FORMS));
                }
                token_ids(ids, vocab, &format!("prompt[{i}]"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::invalid_param("prompt", PROMPT_FORMS)),
    };
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        let what = if prompts.len() == 1 {
            "the prompt is empty".to_string()
        } else {
            format!("prompt[{i}] is empty")
        };
        return Err(ApiError::invalid_param("prompt", what));
    }
    Ok(prompts)
}

/// One entry of a legacy `logprobs` object.
struct Entry<'a> {
    token: &'a str,
    logprob: Option<f32>,
    top: Option<&'a [(u32, String, f32)]>,
}

impl<'a> Entry<'a> {
    fn of(l: &'a LogprobOut) -> Entry<'a> {
        Entry {
            token: &l.token,
            logprob: Some(l.logprob),
            top: Some(&l.top),
        }
    }
}

/// OpenAI's legacy completion `logprobs`: `tokens`, `token_logprobs`, `top_logprobs`
/// (a token-to-log-probability map per position, `null` where there is none; the
/// whole field `null` unless alternatives were asked for) and `text_offset` (the
/// character offset of each token in the choice's `text`, from `offset`). Values are
/// the float32 log-probabilities written as the doubles they are (as mlx-lm's server
/// writes Python floats), so a client summing them gets `_score_fn`'s values exactly.
/// Returns the object and the offset after the last token.
fn legacy_logprobs(entries: &[Entry<'_>], offset: usize, want_top: bool) -> (Json, usize) {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        offsets.push(at);
        at += e.token.chars().count();
    }
    let top = if want_top {
        Json::Array(
            entries
                .iter()
                .map(|e| match e.top {
                    Some(top) => Json::Object(
                        top.iter()
                            .map(|(_, t, lp)| (t.clone(), json!(f64::from(*lp))))
                            .collect::<Map<String, Json>>(),
                    ),
                    None => Json::Null,
                })
                .collect(),
        )
    } else {
        Json::Null
    };
    let v = json!({
        "tokens": entries.iter().map(|e| e.token).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob.map(f64::from)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    });
    (v, at)
}

/// One prompt's generation and what its choices echo.
struct Run {
    gen: Generation,
    /// The prompt's text (with `echo`; else empty).
    echo_text: String,
    /// The first prompt token's text (with `echo`: its log-probability is `null`).
    first_token: String,
    prompt_tokens: usize,
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
    if params.max_tokens == 0 && !echo {
        return Err(ApiError::invalid_param(
            "max_tokens",
            "max_tokens 0 generates nothing: it is for scoring a prompt with echo: true",
        ));
    }
    let wanted = crate::structured::output_constraint(&b, false)?;
    let st = Arc::clone(&state);
    let vocab = state.info.vocab_size;
    let prompts = blocking(move || text_prompts(&st.tokenizer, vocab, &prompt)).await?;
    if params.stream && prompts.len() > 1 {
        return Err(ApiError::invalid_param(
            "prompt",
            "streaming takes one prompt: send a request per prompt, or stream: false",
        ));
    }
    let want_lp = params.logprobs;
    let want_top = params.top_logprobs > 0;
    let n = params.n.max(1);
    let mut runs = Vec::with_capacity(prompts.len());
    let mut guards = Vec::with_capacity(prompts.len());
    for ids in prompts {
        let prepared = Prepared {
            prompt: ids,
            initial: crate::text::Channel::Normal,
            tools: None,
            segments: Vec::new(),
        };
        let (mut req, spec) = finish_request(&state, prepared, &params, false)?;
        req.prompt_logprobs = echo && want_lp;
        let req = crate::structured::constrain(&state, wanted.clone(), spec.initial, req).await?;
        let (echo_text, first_token) = if echo {
            let tok = &state.tokenizer;
            (
                tok.decode(&req.prompt, false).unwrap_or_default(),
                tok.decode(&req.prompt[..1], false).unwrap_or_default(),
            )
        } else {
            (String::new(), String::new())
        };
        let prompt_tokens = req.prompt.len();
        let sub = crate::http::submit(&state, req)?;
        guards.push(sub.guard());
        runs.push(Run {
            gen: Generation::new(sub, spec),
            echo_text,
            first_token,
            prompt_tokens,
        });
    }
    let meta = Meta {
        id: format!("cmpl-{}", random_hex(32)),
        model: params.model.clone(),
        created: state.info.created,
        fingerprint: state.info.fingerprint.clone(),
        prompt_tokens: runs.iter().map(|r| r.prompt_tokens).sum(),
    };
    if !params.stream {
        let mut list = Vec::with_capacity(runs.len() * n);
        let (mut completion, mut cached) = (0, 0);
        for (p, run) in runs.into_iter().enumerate() {
            let (choices, gen) = collect(run.gen, n).await?;
            completion += gen.completion_tokens();
            cached += gen.cached_tokens();
            for (c, ch) in choices.iter().enumerate() {
                let text = format!("{}{}", run.echo_text, ch.content);
                let lp = want_lp.then(|| {
                    let mut entries = Vec::new();
                    if echo {
                        entries.push(Entry {
                            token: &run.first_token,
                            logprob: None,
                            top: None,
                        });
                        entries.extend(ch.prompt_logprobs.iter().map(Entry::of));
                    }
                    entries.extend(ch.logprobs.iter().map(Entry::of));
                    legacy_logprobs(&entries, 0, want_top).0
                });
                list.push(json!({"index": p * n + c, "text": text, "finish_reason": ch.finish, "logprobs": lp}));
            }
        }
        let mut resp = meta.head("text_completion");
        resp.insert("choices".into(), Json::Array(list));
        resp.insert(
            "usage".into(),
            usage_json(meta.prompt_tokens, completion, cached),
        );
        return Ok(json_response(StatusCode::OK, &Json::Object(resp)));
    }
    let Some(run) = runs.pop() else {
        return Err(ApiError::internal("no prompt to stream"));
    };
    let (response, tx) = sse_response(guards.pop());
    let include_usage = params.include_usage;
    let echo_offset = run.echo_text.chars().count();
    // Per choice: whether the prompt went out, and the text offset of the next token.
    let mut echoed = vec![!echo; n];
    let mut offsets = vec![0usize; n];
    let (echo_text, first_token) = (run.echo_text, run.first_token);
    tokio::spawn(pump(
        run.gen,
        tx,
        state.cfg.keepalive_interval,
        move |u, gen| {
            let chunk = |choice: usize, text: String, finish: Option<&str>, lp: Json| {
                let mut m = meta.head("text_completion");
                m.insert("choices".into(), json!([{"index": choice, "text": text, "finish_reason": finish, "logprobs": lp}]));
                sse_data(&Json::Object(m))
            };
            // The echoed prompt goes out in a choice's first chunk (with the prompt's
            // log-probabilities when the engine sent them).
            let mut take_echo = |choice: usize| -> bool {
                match echoed.get_mut(choice) {
                    Some(e) if !*e => {
                        *e = true;
                        true
                    }
                    _ => false,
                }
            };
            match u {
                Some(Update::Prompt { choice, logprobs }) => {
                    let first = take_echo(choice);
                    let mut entries = Vec::new();
                    if first {
                        entries.push(Entry {
                            token: &first_token,
                            logprob: None,
                            top: None,
                        });
                    }
                    entries.extend(logprobs.iter().map(Entry::of));
                    let off = offsets.get(choice).copied().unwrap_or(0);
                    let (lp, _) = legacy_logprobs(&entries, off, want_top);
                    if let Some(o) = offsets.get_mut(choice) {
                        *o = echo_offset;
                    }
                    let text = if first {
                        echo_text.clone()
                    } else {
                        String::new()
                    };
                    (
                        vec![chunk(
                            choice,
                            text,
                            None,
                            if want_lp { lp } else { Json::Null },
                        )],
                        false,
                    )
                }
                Some(Update::Delta { choice, delta }) => {
                    let mut text = String::new();
                    if take_echo(choice) {
                        text.push_str(&echo_text);
                        if let Some(o) = offsets.get_mut(choice) {
                            *o = echo_offset;
                        }
                    }
                    text.push_str(&delta.content);
                    let entries: Vec<Entry<'_>> = delta.logprobs.iter().map(Entry::of).collect();
                    let off = offsets.get(choice).copied().unwrap_or(0);
                    let (lp, end) = legacy_logprobs(&entries, off, want_top);
                    if let Some(o) = offsets.get_mut(choice) {
                        *o = end;
                    }
                    if text.is_empty() && !want_lp {
                        return (Vec::new(), false);
                    }
                    (
                        vec![chunk(
                            choice,
                            text,
                            None,
                            if want_lp { lp } else { Json::Null },
                        )],
                        false,
                    )
                }
                Some(Update::Finished { choice, reason, .. }) => {
                    let text = if take_echo(choice) {
                        echo_text.clone()
                    } else {
                        String::new()
                    };
                    (vec![chunk(choice, text, Some(reason), Json::Null)], false)
                }
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

#[cfg(test)]
mod tests {
    use super::{legacy_logprobs, Entry};
    use serde_json::json;

    #[test]
    fn legacy_logprobs_put_null_first_and_count_characters() {
        let top = vec![(5u32, "é".to_string(), -0.5f32)];
        let entries = [
            Entry {
                token: "ab",
                logprob: None,
                top: None,
            },
            Entry {
                token: "é",
                logprob: Some(-0.5),
                top: Some(&top),
            },
            Entry {
                token: "c",
                logprob: Some(-1.0),
                top: Some(&top),
            },
        ];
        let (v, end) = legacy_logprobs(&entries, 0, true);
        assert_eq!(v["tokens"], json!(["ab", "é", "c"]));
        assert_eq!(v["token_logprobs"], json!([null, -0.5, -1.0]));
        assert_eq!(v["top_logprobs"], json!([null, {"é": -0.5}, {"é": -0.5}]));
        assert_eq!(v["text_offset"], json!([0, 2, 3]));
        assert_eq!(end, 4);
        let (v, _) = legacy_logprobs(&entries, 7, false);
        assert_eq!(v["top_logprobs"], json!(null));
        assert_eq!(v["text_offset"], json!([7, 9, 10]));
    }
}

//! Output routing with real tokenizers: token ids of a model answer go through the
//! detokenizer, the think/tool state machine and the tool parsers of each format.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use mlx_engine::batch::{EngineEvent, Finish, TokenOut};
use mlx_server::output::{Generation, OutputSpec, Update};
use mlx_server::text::{Channel, Markers};
use mlx_server::tools::ToolFormat;
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Value as Json};
use std::sync::Arc;

fn npm_tokenizer(name: &str) -> Tokenizer {
    let dir = common::tokenizer_dir().join(format!("../../tokenizer-{name}/models"));
    Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

struct Outcome {
    content: String,
    reasoning: String,
    calls: Vec<(String, Json)>,
    finish: String,
}

/// Feeds `answer` (encoded) token by token, then `last` with its finish reason.
async fn route(
    tok: &Tokenizer,
    answer: &str,
    last: (u32, Finish),
    think: bool,
    stop: &[&str],
) -> Outcome {
    let format = mlx_server::prompt::detect_tool_format(tok);
    let markers = Markers {
        think: if think {
            tok.think_markers()
                .map(|m| (m.start.clone(), m.end.clone()))
        } else {
            None
        },
        tool: format.map(|f| (f.markers().0.to_string(), f.markers().1.to_string())),
        stop_words: stop.iter().map(|s| s.to_string()).collect(),
        include_stop: false,
    };
    let spec = OutputSpec {
        tokenizer: Arc::new(tok.clone()),
        markers,
        initial: Channel::Normal,
        tool_format: format,
        tools: Some(vec![
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ]),
        n: 1,
        n_eos: 1,
        min_tokens: 0,
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut ids = tok.encode(answer, false).unwrap();
    ids.push(last.0);
    let n = ids.len();
    for (i, token) in ids.into_iter().enumerate() {
        let finish = (i + 1 == n).then_some(last.1);
        let out = TokenOut {
            token,
            logprob: None,
            top: Vec::new(),
            finish,
            stop_index: finish.map(|_| 0),
            from_draft: false,
            drafted: 0,
        };
        tx.send(EngineEvent::Token { choice: 0, out }).unwrap();
    }
    let mut gen = Generation::new(mlx_server::engine::Submission::from_events(rx), spec);
    let mut o = Outcome {
        content: String::new(),
        reasoning: String::new(),
        calls: Vec::new(),
        finish: String::new(),
    };
    while let Some(u) = gen.next().await {
        match u {
            Update::Delta { delta, .. } => {
                o.content.push_str(&delta.content);
                o.reasoning.push_str(&delta.reasoning);
                o.calls
                    .extend(delta.tool_calls.into_iter().map(|c| (c.name, c.arguments)));
            }
            Update::Finished { reason, .. } => o.finish = reason.to_string(),
            other => panic!("unexpected {other:?}"),
        }
    }
    o
}

fn eos(tok: &Tokenizer) -> u32 {
    tok.eos_token_id().expect("an EOS id")
}

#[tokio::test]
async fn qwen3_think_and_tool_call_are_routed() {
    let tok = npm_tokenizer("qwen3");
    let answer = "<think>\nweather needed\n</think>\n\nChecking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let o = route(&tok, answer, (eos(&tok), Finish::Stop), true, &[]).await;
    assert_eq!(o.reasoning, "\nweather needed\n");
    assert_eq!(o.content, "\n\nChecking.");
    assert_eq!(
        o.calls,
        vec![("get_weather".to_string(), json!({"city": "Oslo"}))]
    );
    assert_eq!(o.finish, "tool_calls");
}

#[tokio::test]
async fn mistral_tool_calls_run_to_the_end_of_the_answer() {
    let tok = npm_tokenizer("mistral_nemo");
    assert_eq!(
        mlx_server::prompt::detect_tool_format(&tok),
        Some(ToolFormat::Mistral)
    );
    let answer = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]";
    let o = route(&tok, answer, (eos(&tok), Finish::Stop), false, &[]).await;
    assert_eq!(
        o.calls,
        vec![("get_weather".to_string(), json!({"city": "Rome"}))]
    );
    assert_eq!(o.content, "");
    assert_eq!(o.finish, "tool_calls");
}

#[tokio::test]
async fn llama3_json_answer_becomes_a_call_and_plain_json_text_stays_text() {
    let tok = npm_tokenizer("llama3_2");
    assert_eq!(
        mlx_server::prompt::detect_tool_format(&tok),
        Some(ToolFormat::Llama3Json)
    );
    let answer = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}";
    let o = route(&tok, answer, (eos(&tok), Finish::Stop), false, &[]).await;
    assert_eq!(
        o.calls,
        vec![("get_weather".to_string(), json!({"city": "Lima"}))]
    );
    assert_eq!(o.finish, "tool_calls");
    let o = route(
        &tok,
        "{not a call} but text",
        (eos(&tok), Finish::Stop),
        false,
        &[],
    )
    .await;
    assert!(o.calls.is_empty());
    assert_eq!(o.content, "{not a call} but text");
    assert_eq!(o.finish, "stop");
}

#[tokio::test]
async fn unfinished_tool_call_cut_by_length_is_returned_as_text() {
    let tok = npm_tokenizer("qwen2_5");
    let answer = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"argu";
    let last = tok.encode("ments", false).unwrap()[0];
    let o = route(&tok, answer, (last, Finish::Length), false, &[]).await;
    assert!(o.calls.is_empty());
    assert!(
        o.content.starts_with("Sure.<tool_call>\n{\"name\""),
        "{}",
        o.content
    );
    assert_eq!(o.finish, "length");
}

#[tokio::test]
async fn text_stop_word_ends_the_answer_before_the_stop_token() {
    let tok = npm_tokenizer("qwen2_5");
    let o = route(
        &tok,
        "one two three four",
        (eos(&tok), Finish::Stop),
        false,
        &["three"],
    )
    .await;
    assert_eq!(o.content, "one two ");
    assert_eq!(o.finish, "stop");
}

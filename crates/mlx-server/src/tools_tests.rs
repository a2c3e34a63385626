//! Parser cases; expected values are what mlx-lm 0.32.2's parsers return for the same
//! text (checked with `mlx_lm.tool_parsers.*.parse_tool_call`).
use super::*;
use serde_json::json;

fn one(f: ToolFormat, text: &str, tools: Option<&[Json]>) -> (String, Json) {
    let calls = f
        .parse(text, tools)
        .unwrap_or_else(|e| panic!("{f:?} {text:?}: {e}"));
    assert_eq!(calls.len(), 1, "{calls:?}");
    (calls[0].name.clone(), calls[0].arguments.clone())
}

fn names_args(calls: Vec<ParsedCall>) -> Vec<(String, Json)> {
    calls.into_iter().map(|c| (c.name, c.arguments)).collect()
}

#[test]
fn json_tools_reads_hermes_objects() {
    let (n, a) = one(
        ToolFormat::JsonTools,
        "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n",
        None,
    );
    assert_eq!(n, "get_weather");
    assert_eq!(a, json!({"city": "Paris", "unit": "c"}));
    assert!(ToolFormat::JsonTools
        .parse("{\"name\": \"f\", \"arguments\": {\"x\"", None)
        .is_err());
    assert!(ToolFormat::JsonTools
        .parse("{\"arguments\": {}}", None)
        .is_err());
}

#[test]
fn qwen3_coder_converts_values_by_schema() {
    let tools = vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}}),
    ];
    let text = "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n";
    let (n, a) = one(ToolFormat::Qwen3Coder, text, Some(&tools));
    assert_eq!(n, "get_weather");
    assert_eq!(
        a,
        json!({"city": "Paris", "days": 3, "opts": {"a": [1, 2]}})
    );
    // Without a schema values stay strings.
    let (_, a) = one(
        ToolFormat::Qwen3Coder,
        "<function=f>\n<parameter=x>\n1.5\n</parameter>\n</function>",
        None,
    );
    assert_eq!(a, json!({"x": "1.5"}));
    assert!(ToolFormat::Qwen3Coder
        .parse("<function=f>\n<parameter=x>\n1", None)
        .is_err());
}

#[test]
fn mistral_reads_headers_and_json_lists() {
    let (n, a) = one(
        ToolFormat::Mistral,
        "get_weather[ARGS]{\"city\": \"Paris\"}",
        None,
    );
    assert_eq!((n.as_str(), a), ("get_weather", json!({"city": "Paris"})));
    let calls = ToolFormat::Mistral
        .parse("a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{\"y\": [2]}", None)
        .unwrap();
    assert_eq!(
        names_args(calls),
        vec![
            ("a".into(), json!({"x": 1})),
            ("b".into(), json!({"y": [2]}))
        ]
    );
    let calls = ToolFormat::Mistral
        .parse(
            "[{\"name\": \"f\", \"arguments\": {\"q\": 1}, \"id\": \"abc123456\"}]",
            None,
        )
        .unwrap();
    assert_eq!(calls[0].id.as_deref(), Some("abc123456"));
    assert!(ToolFormat::Mistral.parse("f[ARGS]{\"x\": ", None).is_err());
    assert!(ToolFormat::Mistral.parse("just text", None).is_err());
}

#[test]
fn pythonic_reads_call_lists_with_a_lenient_fallback() {
    let calls = ToolFormat::Pythonic
        .parse(
            "[get_weather(city=\"Paris\", days=3), search(q='x', flags=[true, null])]",
            None,
        )
        .unwrap();
    assert_eq!(
        names_args(calls),
        vec![
            ("get_weather".into(), json!({"city": "Paris", "days": 3})),
            ("search".into(), json!({"q": "x", "flags": [true, null]})),
        ]
    );
    let (n, a) = one(ToolFormat::Pythonic, "[f(a=1, b=foo bar)]", None);
    assert_eq!((n.as_str(), a), ("f", json!({"a": 1, "b": "foo bar"})));
    assert!(ToolFormat::Pythonic.parse("no call here", None).is_err());
}

#[test]
fn gemma_formats_read_their_string_delimiters() {
    let (n, a) = one(
        ToolFormat::FunctionGemma,
        "call:get_weather{city:<escape>Paris, FR<escape>,days:3}",
        None,
    );
    assert_eq!(
        (n.as_str(), a),
        ("get_weather", json!({"city": "Paris, FR", "days": 3}))
    );
    let (n, a) = one(
        ToolFormat::Gemma4,
        "call:get_weather{city:<|\"|>Paris {FR}<|\"|>,days:3,nested:{a:[1,2]}}",
        None,
    );
    assert_eq!(
        (n.as_str(), a),
        (
            "get_weather",
            json!({"city": "Paris {FR}", "days": 3, "nested": {"a": [1, 2]}})
        )
    );
    let calls = ToolFormat::Gemma4
        .parse("call:a{x:1}call:b{y:<|\"|>z<|\"|>}", None)
        .unwrap();
    assert_eq!(
        names_args(calls),
        vec![
            ("a".into(), json!({"x": 1})),
            ("b".into(), json!({"y": "z"}))
        ]
    );
    assert!(ToolFormat::FunctionGemma
        .parse("call:f{x<escape>", None)
        .is_err());
    assert!(ToolFormat::Gemma4.parse("call:f{x:", None).is_err());
}

#[test]
fn llama3_json_reads_parameters_objects() {
    let calls = ToolFormat::Llama3Json
        .parse(
            "{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {}}",
            None,
        )
        .unwrap();
    assert_eq!(
        names_args(calls),
        vec![("f".into(), json!({"a": 1})), ("g".into(), json!({}))]
    );
    assert!(ToolFormat::Llama3Json.parse("Hello there", None).is_err());
}

#[test]
fn formats_are_detected_from_parser_names_and_templates() {
    assert_eq!(
        ToolFormat::detect(Some("json_tools"), None),
        Some(ToolFormat::JsonTools)
    );
    for (name, format) in [
        ("glm47", ToolFormat::Glm47),
        ("laguna", ToolFormat::Glm47),
        ("kimi_k2", ToolFormat::KimiK2),
        ("minimax_m2", ToolFormat::MinimaxM2),
        ("longcat", ToolFormat::Longcat),
        ("minicpm5", ToolFormat::Minicpm5),
        ("muse_spark", ToolFormat::MuseSpark),
        ("kimi_k3", ToolFormat::KimiK3),
    ] {
        assert_eq!(ToolFormat::detect(Some(name), None), Some(format), "{name}");
    }
    // A parser name we do not know is no format (not a template guess).
    assert_eq!(
        ToolFormat::detect(Some("hermes_2"), Some("... <|python_tag|> ...")),
        None
    );
    assert_eq!(
        ToolFormat::detect(None, Some("... <|python_tag|> ...")),
        Some(ToolFormat::Llama3Json)
    );
    assert_eq!(ToolFormat::detect(None, Some("plain")), None);
}

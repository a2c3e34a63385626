#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Our ports of mlx-lm's tool-call parsers against mlx-lm's own (the oracle,
//! `xtask/py/tool_parse_oracle.py` run with `MLX_PYTHON`): samples of each format —
//! valid calls, several in one section, each file's fallbacks and malformed text — must
//! give the same calls (name, arguments with the same JSON types, and the id where
//! mlx-lm's parser returns one), and text mlx-lm's parser raises on must be an error
//! for ours (the server returns it as content).
mod common;
use common::tool_parse_oracle;
use mlx_server::tools::ToolFormat;
use serde_json::{json, Value as Json};

fn tools() -> Json {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "flag": {"type": "boolean"},
                "ratio": {"type": "number"},
                "opts": {"type": "object"},
                "tags": {"type": "array"},
                "maybe": {"type": ["integer", "null"]},
                "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]}
            }, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string"}}}}}
    ])
}

/// Compares ours with mlx-lm on each sample of `module`; returns how many parsed.
fn compare(module: &str, samples: &[&str]) -> usize {
    let format = ToolFormat::from_name(module).unwrap();
    let tools = tools();
    let tool_list = tools.as_array().unwrap().clone();
    let mut cases = Vec::new();
    for (with_tools, list) in [(true, tools.clone()), (false, json!([]))] {
        for s in samples {
            cases.push(json!({"module": module, "sections": [s], "tools": list,
                              "check": false, "with_tools": with_tools}));
        }
    }
    let got = tool_parse_oracle(&Json::Array(cases.clone()));
    let mut parsed = 0;
    for (case, theirs) in cases.iter().zip(&got) {
        let text = case["sections"][0].as_str().unwrap();
        let t = case["with_tools"]
            .as_bool()
            .unwrap()
            .then_some(&tool_list[..]);
        let ours = format.parse(text, t);
        let what = format!("{module} on {text:?} (tools: {})", t.is_some());
        match (&theirs["calls"], ours) {
            (Json::Null, Err(_)) => {}
            (Json::Null, Ok(c)) => panic!(
                "{what}: mlx-lm raised {} but ours read {c:?}",
                theirs["error"]
            ),
            (calls, Err(e)) => panic!("{what}: mlx-lm read {calls} but ours failed: {e}"),
            (calls, Ok(c)) => {
                let mine: Vec<Json> = c
                    .into_iter()
                    .map(|c| {
                        let mut o = json!({"name": c.name, "arguments": c.arguments});
                        if let Some(id) = c.id {
                            o["id"] = json!(id);
                        }
                        o
                    })
                    .collect();
                assert_eq!(calls, &Json::Array(mine), "{what}");
                parsed += 1;
            }
        }
    }
    parsed
}

#[test]
fn glm47_and_laguna_match_mlx_lm() {
    let samples = [
        // Valid calls, GLM-4.5 and 4.7 layouts.
        "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n",
        "get_weather<arg_key>city</arg_key><arg_value>123</arg_value><arg_key>opts</arg_key><arg_value>{\"a\": [1, 2.5, null]}</arg_value><arg_key>flag</arg_key><arg_value>true</arg_value>",
        // Python literals, the literal `\n` between key and value, repeated keys.
        "get_weather<arg_key>opts</arg_key>\\n<arg_value>{'a': (1, 2), 'b': True, 'c': None}</arg_value><arg_key> days </arg_key> <arg_value> 007 </arg_value><arg_key>city</arg_key><arg_value>  x  </arg_value><arg_key>days</arg_key><arg_value>-0x1f</arg_value>",
        "f<arg_key>a</arg_key>junk<arg_key>b</arg_key><arg_value>1</arg_value><arg_key>c</arg_key><arg_value>1e3</arg_value><arg_key>d</arg_key><arg_value>'q' </arg_value>",
        // Malformed argument tags.
        "f<arg_key>x</arg_key><arg_value>1",
        "f <arg_key>x</arg_key>oops<arg_value>1</arg_value>",
        // JSON fallbacks, normalized by the schema.
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": 5, \"days\": \"3\", \"opts\": \"{'k': [1]}\"}}",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": [1.5, \"a\", null, true, {\"k\": \"it's\"}, 1e16, 1e-5]}}",
        "[{\"function\": {\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}, \"arguments\": {}}]",
        "{\"tool\": {\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": 1}\"}}",
        "{\"name\": \"get_time\", \"arguments\": null}",
        "{\"name\": \"get_time\", \"arguments\": [1]}",
        "[1, 2]",
        // Plain-text fallbacks.
        "get_weather\n{\"city\": \"Paris\", \"days\": \"2\"}",
        "get_weather {'city': 'Rome', 'days': '4'}",
        "get_weather city=Paris days=3 note='hello world' opts=\"{\\\"a\\\": 1}\"",
        "get_weather a=1 b",
        "get_weather a='unclosed",
        "f path=C:\\\\dir q=a\\ b r=\"x\\y\"",
        "get_weather something free",
        "get_time",
        "  get_time  \n",
        "get_weather\nnot json here",
        "",
    ];
    assert!(compare("glm47", &samples) > 20);
    assert!(compare("laguna", &samples[..3]) == 6);
}

#[test]
fn kimi_k2_matches_mlx_lm() {
    let samples = [
        "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 3}<|tool_call_end|>",
        "<|tool_call_begin|> functions.get_weather:0 <|tool_call_argument_begin|> {\"city\": \"Paris\"} <|tool_call_end|>\n<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "functions.get_time:3 <|tool_call_argument_begin|> {\"zone\": \"UTC\"} ",
        "get_time:12<|tool_call_argument_begin|>{}",
        "functions.a:b:12<|tool_call_argument_begin|>{\"x\": [1, 2]}",
        "functions.f:0<|tool_call_argument_begin|>{'a': True, 'b': (1,)}",
        "functions.f:0<|tool_call_argument_begin|>hello there",
        "functions.f:0<|tool_call_argument_begin|>[1, 2]",
        // Malformed.
        "<|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>",
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_call_begin|>broken<|tool_call_end|>",
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}",
        "functions.f:<|tool_call_argument_begin|>{}",
        "just text",
    ];
    assert!(compare("kimi_k2", &samples) > 10);
}

#[test]
fn minimax_m2_matches_mlx_lm() {
    let samples = [
        "\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter name=\"flag\">yes</parameter>\n<parameter name=\"ratio\">2.0</parameter>\n<parameter name=\"opts\">{\"a\": [1, 2]}</parameter>\n</invoke>\n",
        "<invoke name=\"get_weather\"><parameter name=\"city\">  123  </parameter><parameter name=\"days\">1_000</parameter><parameter name=\"ratio\">1e3</parameter><parameter name=\"tags\">['a', None]</parameter><parameter name=\"unit\">null</parameter></invoke><invoke name='get_time'><parameter name='zone'>UTC</parameter></invoke>",
        "<invoke name=\"get_weather\"><parameter name=\"days\">abc</parameter><parameter name=\"ratio\">nan</parameter><parameter name=\"flag\">On</parameter><parameter name=\"maybe\">None</parameter><parameter name=\"either\">12</parameter></invoke>",
        "<invoke name=\"get_weather\"><parameter name=\"either\">x</parameter><parameter name=\"ratio\">-2.50</parameter><parameter name=\"days\"> 007 </parameter><parameter name=\"opts\">{\"a\": \"x\ty\"}</parameter><parameter name=\"extra\">[1]</parameter><parameter name=\"flag\">maybe</parameter></invoke>",
        "<invoke name=get_time><parameter name=zone>\n  CET\n</parameter><parameter name=\"bad\"no close<parameter name=\">x</parameter></invoke>",
        "<invoke name=\"f\"></invoke><invoke name=>x</invoke>",
        // Malformed.
        "<invoke name=\"f\"><parameter name=\"x\">1</parameter>",
        "no call",
    ];
    assert!(compare("minimax_m2", &samples) > 8);
}

#[test]
fn longcat_matches_mlx_lm() {
    let samples = [
        "get_weather<longcat_arg_key>city</longcat_arg_key><longcat_arg_value>Paris</longcat_arg_value><longcat_arg_key>days</longcat_arg_key>\n<longcat_arg_value>4</longcat_arg_value>",
        "\n get_weather\n<longcat_arg_key>city</longcat_arg_key>\\n<longcat_arg_value>42</longcat_arg_value><longcat_arg_key>opts</longcat_arg_key><longcat_arg_value>{'x': [1]}</longcat_arg_value>\n",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}, \"id\": \"call_1\"}",
        "{x<longcat_arg_key>a</longcat_arg_key><longcat_arg_value>1</longcat_arg_value>",
        // mlx-lm fails on a call without arguments.
        "get_time",
        "",
    ];
    assert!(compare("longcat", &samples) >= 6);
}

#[test]
fn minicpm5_matches_mlx_lm() {
    let samples = [
        "\"get_weather\"><param name=\"city\">Paris</param><param name=\"days\">3</param>",
        "<function name=\"get_weather\"><param name=\"city\"><![CDATA[a < b & c\n]]></param><param name=\"opts\"> <![CDATA[{\"k\": \"<v>\"}]]>\n</param></function>",
        "<function name=\"get_time\"><param name=\"zone\">UTC</param></function>\n<function name=\"get_weather\"><param name=\"days\">2</param></function>",
        "'get_time'><param name='zone'>  CET </param>",
        "get_time><param name=zone>x</param>",
        "<function  name = \"get_weather\" ><param  name = 'days' >2</param><param name=\"city\"><![CDATA[x]]> y]]></param></function>",
        "\"get_weather\"><param name=\"ratio\">2.0</param>\n",
        "\"f\">",
        "hello",
        "",
    ];
    assert!(compare("minicpm5", &samples) > 10);
}

#[test]
fn muse_spark_matches_mlx_lm() {
    let samples = [
        "<atem:invoke name=\"get_weather\"><atem:parameter name=\"city\">Paris</atem:parameter><atem:parameter name=\"days\">3</atem:parameter></atem:invoke>",
        "\n<atem:invoke id=\"1\" name=\"get_time\">\n<atem:parameter name=\"zone\" type=\"string\"> \"UTC\" </atem:parameter>\n</atem:invoke>\n<atem:invoke name=\"get_weather\"><atem:parameter name=\"opts\">{\"a\": [1, null]}</atem:parameter><atem:parameter name=\"city\">  two words </atem:parameter></atem:invoke>",
        "<atem:invoke name=\"f\"><atem:parameter name=\"x\">a</atem:invoke>b</atem:parameter><atem:parameter name=\"x\">2</atem:parameter></atem:invoke>",
        "<atem:invoke name=\"f\"><atem:parameter name=\"x\">1</atem:parameter>\n",
        "<atem:invoke name=\"a\" x name=\"b\"><atem:parameter name=\"y\">true</atem:parameter></atem:invoke>",
        "<atem:invokes name=\"f\"></atem:invokes><atem:invoke name=\"\"></atem:invoke>",
        "no call",
    ];
    assert!(compare("muse_spark", &samples) > 6);
}

#[test]
fn kimi_k3_matches_mlx_lm() {
    let samples = [
        "\n  <|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\n    <|open|>argument key=\"city\" type=\"string\"<|sep|>Tokyo<|close|>argument<|sep|>\n    <|open|>argument key=\"days\" type=\"integer\"<|sep|>3<|close|>argument<|sep|>\n  <|close|>call<|sep|>\n",
        "<|open|>call tool=\"get_time\"<|sep|><|open|>json type=\"object\"<|sep|>{\"zone\": \"UTC\"}<|close|>json<|sep|><|close|>call<|sep|><|open|>call tool=\"a&amp;b&quot;\"<|sep|><|open|>argument key=\"x\"<|sep|> 3 <|close|>argument<|sep|><|open|>argument key=\"y\" type=\"object\"<|sep|>{bad<|close|>argument<|sep|><|close|>call<|sep|>",
        "<|open|>call tool=\"f\"<|sep|><|open|>json<|sep|>[1]<|close|>json<|sep|><|close|>call<|sep|><|open|>call tool=\"g\"<|sep|><|close|>call<|sep|>",
        "<|open|>call tool=\"f\"<|sep|><|open|>argument type=\"string\"<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|>",
        "<|open|>call index=\"1\"<|sep|><|close|>call<|sep|>",
        "<|open|>call tool=\"f\"<|sep|><|open|>json<|sep|>{bad}<|close|>json<|sep|><|close|>call<|sep|>",
        "<|open|>call tool=\"f\"<|sep|>",
        "nothing",
    ];
    assert!(compare("kimi_k3", &samples) > 4);
}

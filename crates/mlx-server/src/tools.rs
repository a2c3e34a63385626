//! Tool-call parsers for the formats of the supported chat templates, following
//! `mlx_lm/tool_parsers/*.py`: Hermes/Qwen `<tool_call>` JSON (`json_tools`), Qwen3-coder
//! XML (`qwen3_coder`), Mistral `[TOOL_CALLS]`, Gemma (`function_gemma`, `gemma4`),
//! pythonic (`[f(x=1)]`), GLM (`glm47`, also `laguna`), Kimi (`kimi_k2`, `kimi_k3`),
//! MiniMax (`minimax_m2`), `longcat`, `minicpm5`, `muse_spark` (in
//! `tool_parsers`), plus Llama 3 JSON (`{"name": .., "parameters": ..}`), which
//! mlx-lm does not parse.
//!
//! A parser never panics: text it cannot read is an `Err` and the caller passes it on
//! as plain content.
use crate::pylit;
use crate::tool_parsers as tp;
use serde_json::{Map, Value as Json};

/// A parsed call: the function name, its arguments (a JSON object) and the model's own
/// id when the format carries one.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// Function name.
    pub name: String,
    /// Arguments.
    pub arguments: Json,
    /// The model-provided id, if any.
    pub id: Option<String>,
}

/// A tool-call text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": .., "arguments": ..}</tool_call>` (Hermes, Qwen 2.5/3).
    JsonTools,
    /// `<tool_call><function=name><parameter=x>..</parameter></function></tool_call>`.
    Qwen3Coder,
    /// `[TOOL_CALLS]name[ARGS]{..}` or `[TOOL_CALLS][{"name": ..}]` to the end.
    Mistral,
    /// `<|tool_call_start|>[f(x=1)]<|tool_call_end|>`.
    Pythonic,
    /// `<start_function_call>call:f{x:<escape>..<escape>}<end_function_call>`.
    FunctionGemma,
    /// `<|tool_call>call:f{x:<|"|>..<|"|>}<tool_call|>`.
    Gemma4,
    /// Llama 3.x: a JSON object `{"name", "parameters"}`, optionally after `<|python_tag|>`.
    Llama3Json,
    /// GLM 4.5 / 4.7 (and Laguna): `<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`.
    Glm47,
    /// Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{..}<|tool_call_end|>..`.
    KimiK2,
    /// MiniMax M2: `<minimax:tool_call><invoke name="f"><parameter name="k">v</parameter></invoke>..`.
    MinimaxM2,
    /// LongCat: `<longcat_tool_call>f<longcat_arg_key>k</longcat_arg_key><longcat_arg_value>v</longcat_arg_value>..`.
    Longcat,
    /// MiniCPM 5: `<function name="f"><param name="k">v</param></function>`.
    Minicpm5,
    /// Muse Spark: `<atem:function_calls><atem:invoke name="f"><atem:parameter name="k">v</atem:parameter>..`.
    MuseSpark,
    /// Kimi K3 (XTML): `<|open|>tools<|sep|><|open|>call tool="f"<|sep|>..<|close|>call<|sep|>..`.
    KimiK3,
}

impl ToolFormat {
    /// The format of a tokenizer's `tool_parser_type` (mlx-lm's module names), or for
    /// templates mlx-lm does not recognise, one inferred from the template text.
    pub fn detect(parser_type: Option<&str>, template: Option<&str>) -> Option<ToolFormat> {
        if let Some(t) = parser_type {
            return ToolFormat::from_name(t);
        }
        let t = template?;
        (t.contains("<|python_tag|>") || t.contains("\"parameters\": dictionary of argument name"))
            .then_some(ToolFormat::Llama3Json)
    }

    /// The format named like mlx-lm's parser module; `None` for unsupported ones.
    pub fn from_name(name: &str) -> Option<ToolFormat> {
        Some(match name {
            "json_tools" => ToolFormat::JsonTools,
            "qwen3_coder" => ToolFormat::Qwen3Coder,
            "mistral" => ToolFormat::Mistral,
            "pythonic" => ToolFormat::Pythonic,
            "function_gemma" => ToolFormat::FunctionGemma,
            "gemma4" => ToolFormat::Gemma4,
            "llama3_json" => ToolFormat::Llama3Json,
            // mlx-lm's laguna module is glm47's parser and markers.
            "glm47" | "laguna" => ToolFormat::Glm47,
            "kimi_k2" => ToolFormat::KimiK2,
            "minimax_m2" => ToolFormat::MinimaxM2,
            "longcat" => ToolFormat::Longcat,
            "minicpm5" => ToolFormat::Minicpm5,
            "muse_spark" => ToolFormat::MuseSpark,
            "kimi_k3" => ToolFormat::KimiK3,
            _ => return None,
        })
    }

    /// Start and end markers of a tool-call section (an empty end runs to the end).
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::JsonTools | ToolFormat::Qwen3Coder | ToolFormat::Glm47 => {
                ("<tool_call>", "</tool_call>")
            }
            ToolFormat::Mistral => ("[TOOL_CALLS]", ""),
            ToolFormat::Pythonic => ("<|tool_call_start|>", "<|tool_call_end|>"),
            ToolFormat::FunctionGemma => ("<start_function_call>", "<end_function_call>"),
            ToolFormat::Gemma4 => ("<|tool_call>", "<tool_call|>"),
            ToolFormat::Llama3Json => ("<|python_tag|>", ""),
            ToolFormat::KimiK2 => ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
            ToolFormat::MinimaxM2 => ("<minimax:tool_call>", "</minimax:tool_call>"),
            ToolFormat::Longcat => ("<longcat_tool_call>", "</longcat_tool_call>"),
            ToolFormat::Minicpm5 => ("<function name=", "</function>"),
            ToolFormat::MuseSpark => ("<atem:function_calls>", "</atem:function_calls>"),
            ToolFormat::KimiK3 => ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>"),
        }
    }

    /// Parses the text of one tool-call section (markers removed).
    pub fn parse(self, text: &str, tools: Option<&[Json]>) -> Result<Vec<ParsedCall>, String> {
        let calls = match self {
            ToolFormat::JsonTools => parse_json_calls(text.trim(), &["arguments", "parameters"])?,
            ToolFormat::Llama3Json => parse_llama3(text)?,
            ToolFormat::Qwen3Coder => vec![parse_qwen3_coder(text, tools)?],
            ToolFormat::Mistral => parse_mistral(text)?,
            ToolFormat::Pythonic => parse_pythonic(text)?,
            ToolFormat::FunctionGemma => vec![parse_function_gemma(text)?],
            ToolFormat::Gemma4 => parse_gemma4(text)?,
            ToolFormat::Glm47 => tp::parse_glm47(text, tools)?,
            ToolFormat::KimiK2 => tp::parse_kimi_k2(text)?,
            ToolFormat::MinimaxM2 => tp::parse_minimax_m2(text, tools)?,
            ToolFormat::Longcat => tp::parse_longcat(text, tools)?,
            ToolFormat::Minicpm5 => tp::parse_minicpm5(text, tools)?,
            ToolFormat::MuseSpark => tp::parse_muse_spark(text)?,
            ToolFormat::KimiK3 => tp::parse_kimi_k3(text)?,
        };
        if calls.is_empty() {
            return Err(format!("no tool call found in {text:?}"));
        }
        Ok(calls)
    }
}

fn call_from_object(v: &Json, arg_keys: &[&str]) -> Result<ParsedCall, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("a tool call must be a JSON object, got {v}"))?;
    let name = obj
        .get("name")
        .and_then(Json::as_str)
        .ok_or("a tool call needs a string \"name\"")?
        .to_string();
    let mut arguments = arg_keys
        .iter()
        .find_map(|k| obj.get(*k))
        .cloned()
        .unwrap_or(Json::Object(Map::new()));
    if let Json::String(s) = &arguments {
        arguments =
            serde_json::from_str(s).map_err(|e| format!("tool arguments are not JSON: {e}"))?;
    }
    if !arguments.is_object() {
        return Err(format!("tool arguments must be an object, got {arguments}"));
    }
    let id = obj.get("id").and_then(Json::as_str).map(str::to_string);
    Ok(ParsedCall {
        name,
        arguments,
        id,
    })
}

fn parse_json_calls(text: &str, arg_keys: &[&str]) -> Result<Vec<ParsedCall>, String> {
    let v: Json = serde_json::from_str(text).map_err(|e| format!("tool call is not JSON: {e}"))?;
    match &v {
        Json::Array(items) => items
            .iter()
            .map(|i| call_from_object(i, arg_keys))
            .collect(),
        _ => Ok(vec![call_from_object(&v, arg_keys)?]),
    }
}

/// JSON values one after another, separated by whitespace or `;`.
fn json_sequence(text: &str) -> Result<Vec<Json>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if rest.is_empty() {
            return Ok(out);
        }
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Json>();
        match it.next() {
            Some(Ok(v)) => {
                out.push(v);
                rest = &rest[it.byte_offset()..];
            }
            Some(Err(e)) => return Err(format!("tool call is not JSON: {e}")),
            None => return Ok(out),
        }
    }
}

fn parse_llama3(text: &str) -> Result<Vec<ParsedCall>, String> {
    let text = text.trim().trim_start_matches("<|python_tag|>");
    json_sequence(text)?
        .iter()
        .map(|v| call_from_object(v, &["parameters", "arguments"]))
        .collect()
}

/// mlx-lm's `mistral.parse_tool_call`: a JSON list of calls, else `name[ARGS]{json}`
/// headers (several may follow each other).
fn parse_mistral(text: &str) -> Result<Vec<ParsedCall>, String> {
    if let Ok(Json::Array(items)) = serde_json::from_str::<Json>(text) {
        return items
            .iter()
            .map(|i| call_from_object(i, &["arguments"]))
            .collect();
    }
    let mut calls = Vec::new();
    let mut pos = 0;
    while let Some(found) = text[pos..].find("[ARGS]") {
        let header_end = pos + found;
        let name_part = text[pos..header_end].trim_end();
        let name: String = name_part
            .chars()
            .rev()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if name.is_empty() {
            return Err(format!("no function name before [ARGS] in {text:?}"));
        }
        let args_start = header_end + "[ARGS]".len();
        let args_text = text[args_start..].trim_start();
        let skipped = text[args_start..].len() - args_text.len();
        let mut it = serde_json::Deserializer::from_str(args_text).into_iter::<Json>();
        let arguments = match it.next() {
            Some(Ok(v)) => v,
            _ => return Err(format!("could not parse tool call from {text:?}")),
        };
        pos = args_start + skipped + it.byte_offset();
        calls.push(ParsedCall {
            name,
            arguments,
            id: None,
        });
    }
    Ok(calls)
}

fn word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// mlx-lm's `qwen3_coder` parser, with its schema-driven value conversion.
fn parse_qwen3_coder(text: &str, tools: Option<&[Json]>) -> Result<ParsedCall, String> {
    let start = text
        .find("<function=")
        .ok_or("no <function= in tool call")?;
    let body = text[start + "<function=".len()..].trim_end();
    let body = body
        .strip_suffix("</function>")
        .ok_or("tool call does not end with </function>")?;
    let (name, params) = split_name(body).ok_or("no function name provided")?;
    let config = tools.and_then(|t| argument_config(&name, t));
    let mut arguments = Map::new();
    let mut rest = params;
    while let Some(s) = rest.find("<parameter=") {
        let after = &rest[s + "<parameter=".len()..];
        let Some(e) = after.find("</parameter>") else {
            break;
        };
        let inner = &after[..e];
        rest = &after[e + "</parameter>".len()..];
        let Some((pname, value)) = split_name(inner) else {
            continue;
        };
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let converted = convert_param(value, config.as_ref().and_then(|c| c.get(&pname)))?;
        arguments.insert(pname, converted);
    }
    Ok(ParsedCall {
        name,
        arguments: Json::Object(arguments),
        id: None,
    })
}

/// `\s*([^\s<>]+)>?` then the rest.
fn split_name(s: &str) -> Option<(String, &str)> {
    let t = s.trim_start();
    let end = t
        .find(|c: char| c.is_whitespace() || c == '<' || c == '>')
        .unwrap_or(t.len());
    if end == 0 {
        return None;
    }
    let rest = &t[end..];
    Some((t[..end].to_string(), rest.strip_prefix('>').unwrap_or(rest)))
}

fn argument_config(name: &str, tools: &[Json]) -> Option<Map<String, Json>> {
    tools.iter().find_map(|t| {
        let f = t.get("function")?;
        (f.get("name")?.as_str()? == name)
            .then(|| {
                f.get("parameters")
                    .and_then(|p| p.get("properties"))
                    .and_then(Json::as_object)
                    .cloned()
            })
            .flatten()
    })
}

fn convert_param(value: &str, schema: Option<&Json>) -> Result<Json, String> {
    if value.eq_ignore_ascii_case("null") {
        return Ok(Json::Null);
    }
    let Some(schema) = schema.filter(|s| s.as_object().is_some_and(|o| !o.is_empty())) else {
        return Ok(Json::String(value.to_string()));
    };
    let Some(ty) = schema.get("type") else {
        return Ok(match serde_json::from_str::<Json>(value) {
            Ok(v @ (Json::Object(_) | Json::Array(_))) => v,
            _ => Json::String(value.to_string()),
        });
    };
    let ty = match ty {
        Json::String(s) => s.trim().to_lowercase(),
        other => other.to_string().to_lowercase(),
    };
    let int_like = ["int", "uint", "long", "short", "unsigned"]
        .iter()
        .any(|p| ty.starts_with(p));
    if ["string", "str", "text", "varchar", "char", "enum"].contains(&ty.as_str()) {
        Ok(Json::String(value.to_string()))
    } else if int_like || ty.starts_with("num") || ty.starts_with("float") {
        let f: f64 = value
            .trim()
            .parse()
            .map_err(|_| format!("invalid number {value:?}"))?;
        if f.fract() == 0.0 && f.abs() < 9.0e15 {
            Ok(Json::from(f as i64))
        } else if int_like {
            Err(format!("invalid integer literal {value:?}"))
        } else {
            Ok(serde_json::Number::from_f64(f)
                .map(Json::Number)
                .unwrap_or(Json::Null))
        }
    } else if ["boolean", "bool", "binary"].contains(&ty.as_str()) {
        Ok(Json::Bool(value.eq_ignore_ascii_case("true")))
    } else {
        let obj_like = ["object", "array", "arr"].contains(&ty.as_str())
            || ty.starts_with("dict")
            || ty.starts_with("list");
        if obj_like {
            if let Ok(v) = serde_json::from_str::<Json>(value) {
                return Ok(v);
            }
        }
        Ok(pylit::literal(value).unwrap_or_else(|_| Json::String(value.to_string())))
    }
}

/// mlx-lm's `pythonic` parser: a Python list of keyword-only calls, with a lenient
/// fallback for text that is not valid Python.
fn parse_pythonic(text: &str) -> Result<Vec<ParsedCall>, String> {
    if let (Some(s), Some(e)) = (text.find('['), text.rfind(']')) {
        if e > s {
            if let Ok(calls) = pylit::call_list(&text[s..=e]) {
                return Ok(calls
                    .into_iter()
                    .map(|(name, arguments)| ParsedCall {
                        name,
                        arguments: Json::Object(arguments),
                        id: None,
                    })
                    .collect());
            }
        }
    }
    pythonic_fallback(text).map(|c| vec![c])
}

fn pythonic_fallback(text: &str) -> Result<ParsedCall, String> {
    let mut search = 0;
    while let Some(b) = text[search..].find('[') {
        let open = search + b + 1;
        let name: String = text[open..]
            .chars()
            .take_while(|c| word_char(*c) || *c == '.')
            .collect();
        let after = open + name.len();
        if !name.is_empty() && text[after..].starts_with('(') {
            if let Some(close) = text[after + 1..].find(")]") {
                let args = &text[after + 1..after + 1 + close];
                return Ok(ParsedCall {
                    name,
                    arguments: Json::Object(fallback_args(args)),
                    id: None,
                });
            }
        }
        search = open;
    }
    Err("no function provided".into())
}

/// `key=value` pairs: quoted values up to the closing quote, bare ones up to a comma.
fn fallback_args(args: &str) -> Map<String, Json> {
    let mut out = Map::new();
    let mut rest = args.trim_start_matches([',', ' ', '\n', '\t']);
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().to_string();
        let v = &rest[eq + 1..];
        let (value, next) = match v.chars().next() {
            Some(q @ ('"' | '\'')) => match v[1..].find(q) {
                Some(end) => (Json::String(v[1..1 + end].to_string()), &v[2 + end..]),
                None => (Json::String(v[1..].to_string()), ""),
            },
            _ => {
                let end = v.find(',').unwrap_or(v.len());
                let bare = v[..end].trim();
                (
                    pylit::literal(bare).unwrap_or_else(|_| Json::String(bare.to_string())),
                    &v[end..],
                )
            }
        };
        if !key.is_empty() && key.chars().all(word_char) {
            out.insert(key, value);
        }
        rest = next.trim_start_matches([',', ' ', '\n', '\t']);
    }
    out
}

/// mlx-lm's `function_gemma` parser: the first `call:name{k:v,...}`.
fn parse_function_gemma(text: &str) -> Result<ParsedCall, String> {
    const ESC: &str = "<escape>";
    let mut search = 0;
    let (name, mut args) = loop {
        let at = text[search..].find("call:").ok_or("no function provided")? + search + 5;
        let name: String = text[at..].chars().take_while(|c| word_char(*c)).collect();
        let brace = at + name.len();
        if !name.is_empty() && text[brace..].starts_with('{') {
            if let Some(close) = text[brace + 1..].find('}') {
                break (name, &text[brace + 1..brace + 1 + close]);
            }
        }
        search = at;
    };
    let mut arguments = Map::new();
    while !args.is_empty() {
        let colon = args
            .find(':')
            .ok_or_else(|| format!("no ':' in tool arguments {args:?}"))?;
        let key = args[..colon].to_string();
        args = &args[colon + 1..];
        if let Some(s) = args.strip_prefix(ESC) {
            let end = s.find(ESC).ok_or("unterminated <escape> string")?;
            arguments.insert(key, Json::String(s[..end].to_string()));
            args = s.get(end + ESC.len() + 1..).unwrap_or("");
            continue;
        }
        let end = args.find(',').unwrap_or(args.len());
        let value = &args[..end];
        arguments.insert(
            key,
            serde_json::from_str(value).unwrap_or_else(|_| Json::String(value.to_string())),
        );
        args = args.get(end + 1..).unwrap_or("");
    }
    Ok(ParsedCall {
        name,
        arguments: Json::Object(arguments),
        id: None,
    })
}

const G4Q: &str = "<|\"|>";

/// The end (exclusive) of a balanced `{...}` at `s[0]`, skipping `<|"|>` strings.
fn balanced_braces(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(G4Q) {
            let end = s[i + G4Q.len()..].find(G4Q)?;
            i += 2 * G4Q.len() + end;
            continue;
        }
        let c = s[i..].chars().next()?;
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += c.len_utf8();
    }
    None
}

/// Gemma 4 arguments to JSON: `<|"|>` strings become JSON strings, bare keys after
/// `{` or `,` get quoted.
fn gemma4_args_to_json(s: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(G4Q) {
            let start = i + G4Q.len();
            let end = s[start..].find(G4Q).map_or(s.len(), |e| start + e);
            out.push_str(&Json::String(s[start..end].to_string()).to_string());
            i = (end + G4Q.len()).min(s.len());
            continue;
        }
        let Some(c) = s[i..].chars().next() else {
            break;
        };
        out.push(c);
        i += c.len_utf8();
        if c == '{' || c == ',' {
            let key: String = s[i..].chars().take_while(|c| word_char(*c)).collect();
            if !key.is_empty() && s[i + key.len()..].starts_with(':') {
                out.push_str(&format!("\"{key}\":"));
                i += key.len() + 1;
            }
        }
    }
    out
}

fn parse_gemma4(text: &str) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut search = 0;
    while let Some(f) = text[search..].find("call:") {
        let at = search + f + 5;
        let name: String = text[at..]
            .chars()
            .take_while(|c| word_char(*c) || *c == '-')
            .collect();
        let brace = at + name.len();
        search = at;
        if name.is_empty() || !text[brace..].starts_with('{') {
            continue;
        }
        let Some(len) = balanced_braces(&text[brace..]) else {
            continue;
        };
        let json = gemma4_args_to_json(&text[brace..brace + len]);
        let arguments: Json =
            serde_json::from_str(&json).map_err(|e| format!("gemma4 arguments: {e}"))?;
        calls.push(ParsedCall {
            name,
            arguments,
            id: None,
        });
        search = brace + len;
    }
    if calls.is_empty() {
        return Err("no function provided".into());
    }
    Ok(calls)
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;

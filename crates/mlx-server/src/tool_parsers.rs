//! Tool-call parsers of the XML-ish and section formats, following mlx-lm 0.32.2's
//! `mlx_lm/tool_parsers/{glm47,kimi_k2,minimax_m2,longcat,minicpm5,muse_spark,kimi_k3}.py`
//! (`laguna` is `glm47`). Their regular expressions are written out by hand with the
//! same match semantics (lazy bodies, the first closing tag that lets the rest match,
//! Python's `$` before a final newline), and values are converted as there: JSON, then
//! a Python literal, then the text itself, or by the tool's parameter schema where the
//! file does so.
//!
//! Where mlx-lm raises any exception (its server logs and drops the call, or for
//! exceptions it does not catch, fails the request) these return `Err`: the caller
//! passes the text on as content.
use crate::pylit;
use crate::tools::ParsedCall;
use serde_json::{Map, Number, Value as Json};

type R<T> = Result<T, String>;

// ---------------------------------------------------------------------------------
// Python helpers

/// Python's `str.isspace` (Unicode whitespace plus the information separators).
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(py_space)
}

/// Python regex `\s` (Unicode whitespace in `str` patterns).
fn re_space(c: char) -> bool {
    py_space(c)
}

/// Python regex `\w` for `str` patterns.
fn re_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `json.loads(s)`.
fn json_loads(s: &str) -> Option<Json> {
    serde_json::from_str(s).ok()
}

/// `json.loads(s, strict=False)`: control characters allowed inside strings.
fn json_loads_lenient(s: &str) -> Option<Json> {
    if let Some(v) = json_loads(s) {
        return Some(v);
    }
    let mut out = String::with_capacity(s.len());
    let (mut in_str, mut esc) = (false, false);
    for c in s.chars() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            } else if (c as u32) < 0x20 {
                out.push_str(&format!("\\u{:04x}", c as u32));
                continue;
            }
        } else if c == '"' {
            in_str = true;
        }
        out.push(c);
    }
    json_loads(&out)
}

/// `ast.literal_eval(s)` (which strips leading spaces and tabs).
fn literal_eval(s: &str) -> Option<Json> {
    pylit::literal(s.trim_start_matches([' ', '\t'])).ok()
}

/// The parsers' `_deserialize`: JSON, else a Python literal, else the text.
pub(crate) fn deserialize(s: &str) -> Json {
    json_loads(s)
        .or_else(|| literal_eval(s))
        .unwrap_or_else(|| Json::String(s.to_string()))
}

/// Python's `repr` of a string.
fn py_repr_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `repr` of a value read from JSON or a literal.
fn py_repr(v: &Json) -> String {
    match v {
        Json::Null => "None".into(),
        Json::Bool(b) => if *b { "True" } else { "False" }.into(),
        // json.dumps writes floats as float.__repr__.
        Json::Number(_) => mlx_tokenizer::py_json_dumps(v, false),
        Json::String(s) => py_repr_str(s),
        Json::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Json::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("{}: {}", py_repr_str(k), py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Python's `str` of a value.
fn py_str(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => py_repr(other),
    }
}

/// Python's truthiness of a JSON value.
fn truthy(v: &Json) -> bool {
    match v {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64() != Some(0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// Digits with single underscores between them (Python's numeric literal rule for
/// `int()` / `float()`), underscores removed; `None` if misplaced.
fn without_underscores(s: &str) -> Option<String> {
    let b: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in b.iter().enumerate() {
        if c == '_' {
            let ok =
                i > 0 && i + 1 < b.len() && b[i - 1].is_ascii_digit() && b[i + 1].is_ascii_digit();
            if !ok {
                return None;
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// An integer as JSON (an `i64` or `u64`, else a float: Python's ints are unbounded).
fn int_json(neg: bool, digits: &str) -> Option<Json> {
    let signed = if neg {
        format!("-{digits}")
    } else {
        digits.to_string()
    };
    if let Ok(i) = signed.parse::<i64>() {
        return Some(Json::from(i));
    }
    if let Ok(u) = signed.parse::<u64>() {
        return Some(Json::from(u));
    }
    signed
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map(Json::Number)
}

/// Python's `int(s)` for a string (ASCII digits).
fn py_int(s: &str) -> Option<Json> {
    let t = py_strip(s);
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits = without_underscores(body)?;
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    int_json(neg, if digits.is_empty() { "0" } else { digits })
}

/// Python's `float(s)` for a string.
fn py_float(s: &str) -> Option<f64> {
    let t = py_strip(s);
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if lower.len() - body.len() > 1 {
        return None;
    }
    if ["inf", "infinity", "nan"].contains(&body) {
        return lower.parse().ok();
    }
    if !body
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | '+' | '-' | '_'))
    {
        return None;
    }
    without_underscores(&lower)?.parse().ok()
}

/// Finds `pat` in `s` from byte `from`.
fn find_from(s: &str, from: usize, pat: &str) -> Option<usize> {
    s.get(from..)?.find(pat).map(|i| from + i)
}

// ---------------------------------------------------------------------------------
// Schemas

/// The tool named `name` (its `function` object), as mlx-lm looks tools up.
fn tool_function<'a>(tools: Option<&'a [Json]>, name: &str) -> Option<&'a Json> {
    tools?.iter().find_map(|t| {
        let f = t.get("function")?;
        (f.get("name").and_then(Json::as_str) == Some(name)).then_some(f)
    })
}

/// glm47's `_get_string_arg_names`: the properties whose `type` is `"string"`.
fn string_arg_names(name: &str, tools: Option<&[Json]>) -> Vec<String> {
    let Some(f) = tool_function(tools, name) else {
        return Vec::new();
    };
    f.get("parameters")
        .and_then(|p| p.get("properties"))
        .and_then(Json::as_object)
        .map(|props| {
            props
                .iter()
                .filter(|(_, s)| s.get("type").and_then(Json::as_str) == Some("string"))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// minimax_m2's `param_config_for[name]`: the tool's `properties` (tools whose function
/// or parameters are empty are skipped, as there).
fn param_config(name: &str, tools: Option<&[Json]>) -> Map<String, Json> {
    tools
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            let f = t.get("function").filter(|f| truthy(f))?;
            let p = f.get("parameters").filter(|p| truthy(p))?;
            (f.get("name").and_then(Json::as_str) == Some(name)).then(|| {
                p.get("properties")
                    .and_then(Json::as_object)
                    .cloned()
                    .unwrap_or_default()
            })
        })
        .next_back()
        .unwrap_or_default()
}

/// minimax_m2's `_extract_types_from_schema`.
pub(crate) fn schema_types(schema: Option<&Json>) -> Vec<String> {
    let Some(Json::Object(o)) = schema else {
        return vec!["string".into()];
    };
    let mut types: Vec<String> = Vec::new();
    let mut add = |t: &str| {
        if !types.iter().any(|x| x == t) {
            types.push(t.to_string());
        }
    };
    match o.get("type") {
        Some(Json::String(t)) => add(t),
        Some(Json::Array(ts)) => ts.iter().filter_map(Json::as_str).for_each(&mut add),
        _ => {}
    }
    if let Some(Json::Array(values)) = o.get("enum") {
        for v in values {
            add(match v {
                Json::Null => "null",
                Json::Bool(_) => "boolean",
                Json::Number(n) if n.is_f64() => "number",
                Json::Number(_) => "integer",
                Json::String(_) => "string",
                Json::Array(_) => "array",
                Json::Object(_) => "object",
            });
        }
    }
    for field in ["anyOf", "oneOf", "allOf"] {
        if let Some(Json::Array(choices)) = o.get(field) {
            for c in choices {
                schema_types(Some(c)).iter().for_each(|t| add(t));
            }
        }
    }
    if types.is_empty() {
        vec!["string".into()]
    } else {
        types
    }
}

/// minimax_m2's `_convert_param_value_with_types`.
pub(crate) fn convert_typed(value: &str, types: &[String]) -> R<Json> {
    let lower = value.to_lowercase();
    if lower == "null" {
        return Ok(Json::Null);
    }
    let types: Vec<String> = types.iter().map(|t| t.to_lowercase()).collect();
    let has = |t: &str| types.iter().any(|x| x == t);
    if has("null") && ["null", "none", "nil"].contains(&lower.as_str()) {
        return Ok(Json::Null);
    }
    for t in [
        "integer", "int", "number", "float", "boolean", "bool", "object", "array", "string", "str",
        "text",
    ] {
        if !has(t) {
            continue;
        }
        match t {
            "string" | "str" | "text" => return Ok(Json::String(value.to_string())),
            "integer" | "int" => {
                if let Some(v) = py_int(value) {
                    return Ok(v);
                }
            }
            "number" | "float" => {
                let Some(f) = py_float(value) else { continue };
                if f.is_nan() {
                    continue; // int(nan) is a ValueError
                }
                if f.is_infinite() {
                    // int(inf) is an OverflowError, which mlx-lm does not catch.
                    return Err(format!("cannot convert {value:?} to an integer"));
                }
                return Ok(if f.fract() != 0.0 {
                    Json::Number(Number::from_f64(f).ok_or("not a finite number")?)
                } else {
                    int_json(f < 0.0, &format!("{:.0}", f.abs())).ok_or("not a finite number")?
                });
            }
            "boolean" | "bool" => {
                let l = py_strip(&lower);
                if ["true", "1", "yes", "on"].contains(&l) {
                    return Ok(Json::Bool(true));
                }
                if ["false", "0", "no", "off"].contains(&l) {
                    return Ok(Json::Bool(false));
                }
            }
            _ => {
                if let Some(v) = json_loads_lenient(value).or_else(|| literal_eval(value)) {
                    return Ok(v);
                }
            }
        }
    }
    Ok(json_loads(value).unwrap_or_else(|| Json::String(value.to_string())))
}

/// minimax_m2's `_extract_name`: stripped, one pair of matching quotes removed.
fn extract_name(s: &str) -> String {
    let s = py_strip(s);
    let quoted =
        (s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\''));
    if quoted {
        s.get(1..s.len().saturating_sub(1).max(1))
            .unwrap_or_default()
            .to_string()
    } else {
        s.to_string()
    }
}

fn call(name: String, arguments: Json) -> ParsedCall {
    ParsedCall {
        name,
        arguments,
        id: None,
    }
}

// ---------------------------------------------------------------------------------
// glm47 (and laguna), longcat

/// `<K>(.*?)</K>(?:\\n|\s)*<V>(.*?)</V>` over `text`, all matches (`finditer`).
fn key_value_pairs<'a>(text: &'a str, k: &str, v: &str) -> Vec<(&'a str, &'a str)> {
    let (ko, kc) = (format!("<{k}>"), format!("</{k}>"));
    let (vo, vc) = (format!("<{v}>"), format!("</{v}>"));
    let mut out = Vec::new();
    let mut pos = 0;
    'starts: while let Some(s) = find_from(text, pos, &ko) {
        let key_start = s + ko.len();
        let mut close_from = key_start;
        // The lazy key: the first closing tag the rest matches after.
        while let Some(kce) = find_from(text, close_from, &kc) {
            let mut i = kce + kc.len();
            loop {
                let rest = &text[i..];
                if rest.starts_with("\\n") {
                    i += 2;
                } else if let Some(c) = rest.chars().next().filter(|c| re_space(*c)) {
                    i += c.len_utf8();
                } else {
                    break;
                }
            }
            if text[i..].starts_with(&vo) {
                let value_start = i + vo.len();
                if let Some(ve) = find_from(text, value_start, &vc) {
                    out.push((&text[key_start..kce], &text[value_start..ve]));
                    pos = ve + vc.len();
                    continue 'starts;
                }
            }
            close_from = kce + 1;
        }
        pos = s + 1;
    }
    out
}

/// glm47's `_normalize_arguments`.
fn normalize(arguments: &Map<String, Json>, string_args: &[String]) -> Json {
    let mut out = Map::new();
    for (k, v) in arguments {
        let v = if string_args.contains(k) {
            Json::String(py_str(v))
        } else if let Json::String(s) = v {
            deserialize(s)
        } else {
            v.clone()
        };
        out.insert(k.clone(), v);
    }
    Json::Object(out)
}

/// glm47's `_parse_json_tool_call`.
fn glm_json_call(text: &str, tools: Option<&[Json]>) -> Option<ParsedCall> {
    let mut parsed = json_loads(py_strip(text))?;
    if let Json::Array(a) = &parsed {
        if let Some(first @ Json::Object(_)) = a.first() {
            parsed = first.clone();
        }
    }
    let o = parsed.as_object()?;
    let (mut name, mut arguments) = if o.contains_key("name") && o.contains_key("arguments") {
        (o.get("name").cloned(), o.get("arguments").cloned())
    } else if o.contains_key("function") && o.contains_key("arguments") {
        (o.get("function").cloned(), o.get("arguments").cloned())
    } else if let Some(Json::Object(t)) = o.get("tool") {
        (t.get("name").cloned(), t.get("arguments").cloned())
    } else {
        (None, None)
    };
    if let Some(Json::Object(n)) = &name {
        if !arguments.as_ref().is_some_and(truthy) {
            arguments = n.get("arguments").cloned();
        }
        name = n.get("name").cloned();
    }
    if let Some(Json::String(s)) = &arguments {
        arguments = Some(deserialize(s));
    }
    let Some(Json::String(name)) = name else {
        return None;
    };
    match arguments {
        None | Some(Json::Null) => Some(call(name, Json::Object(Map::new()))),
        Some(Json::Object(a)) => {
            let sa = string_arg_names(&name, tools);
            Some(call(name, normalize(&a, &sa)))
        }
        _ => None,
    }
}

/// Python's `shlex.split(s)` (POSIX mode, no comments); `None` where it raises.
fn shlex_split(s: &str) -> Option<Vec<String>> {
    let ws = |c: char| matches!(c, ' ' | '\t' | '\r' | '\n');
    let mut tokens = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        // Skip whitespace; the end.
        while chars.peek().is_some_and(|c| ws(*c)) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(tokens);
        }
        let mut token = String::new();
        while let Some(c) = chars.next() {
            match c {
                c if ws(c) => break,
                '\\' => token.push(chars.next()?),
                '\'' => loop {
                    match chars.next()? {
                        '\'' => break,
                        c => token.push(c),
                    }
                },
                '"' => loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => {
                            let e = chars.next()?;
                            if e != '"' && e != '\\' {
                                token.push('\\');
                            }
                            token.push(e);
                        }
                        c => token.push(c),
                    }
                },
                c => token.push(c),
            }
        }
        tokens.push(token);
    }
}

/// glm47's `_parse_key_value_pairs`.
fn glm_key_values(text: &str, string_args: &[String]) -> Option<Map<String, Json>> {
    if !text.contains('=') {
        return None;
    }
    let tokens = shlex_split(text)?;
    if tokens.is_empty() {
        return None;
    }
    let mut out = Map::new();
    for t in tokens {
        let (k, v) = t.split_once('=')?;
        let k = py_strip(k);
        if k.is_empty() {
            return None;
        }
        let v = if string_args.iter().any(|s| s == k) {
            Json::String(v.to_string())
        } else {
            deserialize(v)
        };
        out.insert(k.to_string(), v);
    }
    Some(out)
}

/// glm47's `_parse_plain_text_tool_call`.
fn glm_plain_call(text: &str, tools: Option<&[Json]>) -> Option<ParsedCall> {
    let stripped = py_strip(text);
    if stripped.is_empty() {
        return None;
    }
    if let Some((first, rest)) = stripped.split_once('\n') {
        let (name, rest) = (py_strip(first), py_strip(rest));
        if !name.is_empty() && !rest.is_empty() {
            if let Json::Object(a) = deserialize(rest) {
                let sa = string_arg_names(name, tools);
                return Some(call(name.to_string(), normalize(&a, &sa)));
            }
        }
    }
    let (name, rest) = stripped.split_once(' ').unwrap_or((stripped, ""));
    if name.is_empty() {
        return None;
    }
    let rest = py_strip(rest);
    if rest.is_empty() {
        return Some(call(name.to_string(), Json::Object(Map::new())));
    }
    let sa = string_arg_names(name, tools);
    if let Json::Object(a) = deserialize(rest) {
        return Some(call(name.to_string(), normalize(&a, &sa)));
    }
    if let Some(kv) = glm_key_values(rest, &sa) {
        return Some(call(name.to_string(), Json::Object(kv)));
    }
    let mut raw = Map::new();
    raw.insert("raw".into(), Json::String(rest.to_string()));
    Some(call(name.to_string(), Json::Object(raw)))
}

/// mlx-lm's `glm47.parse_tool_call` (also `laguna`'s): `name<arg_key>k</arg_key>
/// <arg_value>v</arg_value>...`, values of string-typed parameters kept as text, others
/// deserialized; without `<arg_key>`, a JSON call object, `name {json}`, `name k=v ...`
/// or the name alone, and at last `unknown` with the raw text.
pub(crate) fn parse_glm47(text: &str, tools: Option<&[Json]>) -> R<Vec<ParsedCall>> {
    let Some(at) = text.find("<arg_key>") else {
        let c = glm_json_call(text, tools)
            .or_else(|| glm_plain_call(text, tools))
            .unwrap_or_else(|| {
                let mut raw = Map::new();
                raw.insert("raw".into(), Json::String(py_strip(text).to_string()));
                call("unknown".into(), Json::Object(raw))
            });
        return Ok(vec![c]);
    };
    let name = py_strip(&text[..at]).to_string();
    let sa = string_arg_names(&name, tools);
    let mut args = Map::new();
    for (k, v) in key_value_pairs(text, "arg_key", "arg_value") {
        let (k, v) = (py_strip(k), py_strip(v));
        let v = if sa.iter().any(|s| s == k) {
            Json::String(v.to_string())
        } else {
            deserialize(v)
        };
        args.insert(k.to_string(), v);
    }
    Ok(vec![call(name, Json::Object(args))])
}

/// mlx-lm's `longcat.parse_tool_call`: a JSON object as it is, else glm47's layout with
/// `longcat_`-prefixed tags and no other fallback (text without an argument key is an
/// error, as mlx-lm fails on it).
pub(crate) fn parse_longcat(text: &str, tools: Option<&[Json]>) -> R<Vec<ParsedCall>> {
    let text = py_strip(text);
    if text.starts_with('{') {
        if let Some(v) = json_loads(text) {
            let o = v.as_object().ok_or("not an object")?;
            let name = o
                .get("name")
                .and_then(Json::as_str)
                .ok_or("a JSON tool call needs a string \"name\"")?;
            let arguments = o
                .get("arguments")
                .cloned()
                .ok_or("a JSON tool call needs \"arguments\"")?;
            return Ok(vec![ParsedCall {
                name: name.to_string(),
                arguments,
                id: o.get("id").and_then(Json::as_str).map(str::to_string),
            }]);
        }
    }
    let at = text
        .find("<longcat_arg_key>")
        .ok_or("no <longcat_arg_key> in the tool call")?;
    let name = py_strip(&text[..at]).to_string();
    let string_type = |arg: &str| {
        tool_function(tools, &name)
            .and_then(|f| f.get("parameters"))
            .and_then(|p| p.get("properties"))
            .and_then(|p| p.get(arg))
            .and_then(|s| s.get("type"))
            .and_then(Json::as_str)
            == Some("string")
    };
    let mut args = Map::new();
    for (k, v) in key_value_pairs(text, "longcat_arg_key", "longcat_arg_value") {
        let (k, v) = (py_strip(k), py_strip(v));
        let v = if string_type(k) {
            Json::String(v.to_string())
        } else {
            deserialize(v)
        };
        args.insert(k.to_string(), v);
    }
    Ok(vec![call(name, Json::Object(args))])
}

// ---------------------------------------------------------------------------------
// kimi_k2

/// The end of `:\d+\s*<|tool_call_argument_begin|>` at `s`, and the end of the digits.
fn kimi_index_then_args(s: &str) -> Option<usize> {
    let rest = s.strip_prefix(':')?;
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_numeric()).len();
    if digits == 0 {
        return None;
    }
    let after = rest[digits..].trim_start_matches(re_space);
    after
        .starts_with("<|tool_call_argument_begin|>")
        .then_some(1 + digits)
}

/// One call: `functions.name:idx<|tool_call_argument_begin|>{json}`.
fn kimi_single(text: &str) -> R<ParsedCall> {
    const ARGS: &str = "<|tool_call_argument_begin|>";
    let start = text.len() - text.trim_start_matches(re_space).len();
    let mut found = None;
    // `(?:functions\.)?` is greedy: with the prefix first, then without.
    for name_start in [start + "functions.".len(), start] {
        if name_start > start && !text[start..].starts_with("functions.") {
            continue;
        }
        // `(.+?)` is lazy: the first end the rest matches after.
        let mut ends = text[name_start..].char_indices().skip(1).map(|(i, _)| i);
        let hit = ends
            .by_ref()
            .chain(std::iter::once(text.len() - name_start))
            .find_map(|e| {
                kimi_index_then_args(&text[name_start + e..]).map(|n| (name_start + e, n))
            });
        if let Some((name_end, n)) = hit {
            found = Some((name_start, name_end, name_end + n));
            break;
        }
    }
    let (ns, ne, id_end) = found.ok_or("No tool call found.")?;
    let a = text.find(ARGS).ok_or("No tool call arguments found.")?;
    let args = text[a + ARGS.len()..].trim_start_matches(re_space);
    Ok(ParsedCall {
        name: text[ns..ne].to_string(),
        arguments: deserialize(args),
        id: Some(text[start..id_end].to_string()),
    })
}

/// mlx-lm's `kimi_k2.parse_tool_call`: each `<|tool_call_begin|>..<|tool_call_end|>`
/// (or the whole text) one call, its id `functions.name:idx`; one bad call fails all.
pub(crate) fn parse_kimi_k2(text: &str) -> R<Vec<ParsedCall>> {
    const B: &str = "<|tool_call_begin|>";
    const E: &str = "<|tool_call_end|>";
    let mut parts = Vec::new();
    let mut pos = 0;
    while let Some(s) = find_from(text, pos, B) {
        let Some(e) = find_from(text, s + B.len(), E) else {
            break;
        };
        parts.push(&text[s + B.len()..e]);
        pos = e + E.len();
    }
    if parts.is_empty() {
        return Ok(vec![kimi_single(text)?]);
    }
    parts.into_iter().map(kimi_single).collect()
}

// ---------------------------------------------------------------------------------
// minimax_m2, minicpm5

/// `^([^>]+)`: the leading run without `>` (at least one character).
fn until_gt(s: &str) -> Option<(&str, &str)> {
    let n = s.find('>').unwrap_or(s.len());
    (n > 0).then(|| (&s[..n], &s[n..]))
}

/// All `open(.*?)close` matches (`findall`).
fn tagged<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(s) = find_from(text, pos, open) {
        let Some(e) = find_from(text, s + open.len(), close) else {
            break;
        };
        out.push(&text[s + open.len()..e]);
        pos = e + close.len();
    }
    out
}

/// mlx-lm's `minimax_m2.parse_tool_call`: `<invoke name="f"><parameter name="k">v
/// </parameter></invoke>`, values converted by the types of the tool's schema.
pub(crate) fn parse_minimax_m2(text: &str, tools: Option<&[Json]>) -> R<Vec<ParsedCall>> {
    let invokes = tagged(text, "<invoke name=", "</invoke>");
    if invokes.is_empty() {
        return Err("No tool call found".into());
    }
    let mut calls = Vec::new();
    for inv in invokes {
        let Some((name, _)) = until_gt(inv) else {
            continue;
        };
        let name = extract_name(name);
        let config = param_config(&name, tools);
        let mut args = Map::new();
        for p in tagged(inv, "<parameter name=", "</parameter>") {
            let Some((pname, rest)) = until_gt(p) else {
                continue;
            };
            let Some(value) = rest.strip_prefix('>') else {
                continue;
            };
            let pname = extract_name(pname);
            let value = py_strip(value);
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            let types = match config.get(&pname) {
                Some(schema) => schema_types(Some(schema)),
                None => vec!["string".into()],
            };
            args.insert(pname, convert_typed(value, &types)?);
        }
        calls.push(call(name, Json::Object(args)));
    }
    Ok(calls)
}

/// `"[^"]*"|'[^']*'|[^\s"'<>]+` at the start of `s`: the name and its length.
fn quoted_or_bare(s: &str) -> Option<usize> {
    let first = s.chars().next()?;
    if first == '"' || first == '\'' {
        return s[1..].find(first).map(|e| e + 2);
    }
    let n = s
        .find(|c: char| re_space(c) || matches!(c, '"' | '\'' | '<' | '>'))
        .unwrap_or(s.len());
    (n > 0).then_some(n)
}

fn skip_space(s: &str, i: usize) -> usize {
    s.len() - s[i..].trim_start_matches(re_space).len()
}

/// minicpm5's function pattern at byte `p`: (name, body, end of match).
fn minicpm_function_at(text: &str, p: usize) -> Option<(&str, &str, usize)> {
    let mut firsts = Vec::new();
    if text[p..].starts_with("<function") {
        let i = p + "<function".len();
        let j = skip_space(text, i);
        if j > i {
            firsts.push(j);
        }
    }
    firsts.push(p);
    for f in firsts {
        let mut names = Vec::new();
        if text[f..].starts_with("name") {
            let i = skip_space(text, f + 4);
            if text[i..].starts_with('=') {
                names.push(skip_space(text, i + 1));
            }
        }
        names.push(f);
        for n in names {
            let Some(len) = quoted_or_bare(&text[n..]) else {
                continue;
            };
            let g = skip_space(text, n + len);
            if !text[g..].starts_with('>') {
                continue;
            }
            let body_start = g + 1;
            // `(?:</function>|$)`: Python's `$` also matches before a final newline.
            let (body_end, end) = match find_from(text, body_start, "</function>") {
                Some(e) => (e, e + "</function>".len()),
                None if text.ends_with('\n') && text.len() > body_start => {
                    (text.len() - 1, text.len() - 1)
                }
                None => (text.len(), text.len()),
            };
            return Some((&text[n..n + len], &text[body_start..body_end], end));
        }
    }
    None
}

/// minicpm5's `<param\s+name\s*=\s*(NAME)\s*>(.*?)</param>` matches in `body`.
fn minicpm_params(body: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(p) = find_from(body, pos, "<param") {
        pos = p + 1;
        let i = p + "<param".len();
        let j = skip_space(body, i);
        if j == i || !body[j..].starts_with("name") {
            continue;
        }
        let k = skip_space(body, j + 4);
        if !body[k..].starts_with('=') {
            continue;
        }
        let n = skip_space(body, k + 1);
        let Some(len) = quoted_or_bare(&body[n..]) else {
            continue;
        };
        let g = skip_space(body, n + len);
        if !body[g..].starts_with('>') {
            continue;
        }
        let Some(e) = find_from(body, g + 1, "</param>") else {
            break;
        };
        out.push((&body[n..n + len], &body[g + 1..e]));
        pos = e + "</param>".len();
    }
    out
}

/// minicpm5's `_param_value`: the content of a CDATA block filling the value, else the
/// stripped text.
fn cdata_or_strip(raw: &str) -> &str {
    let t = raw.trim_start_matches(re_space);
    if let Some(inner) = t.strip_prefix("<![CDATA[") {
        let mut from = 0;
        while let Some(e) = find_from(inner, from, "]]>") {
            if inner[e + 3..].chars().all(re_space) {
                return &inner[..e];
            }
            from = e + 1;
        }
    }
    py_strip(raw)
}

/// mlx-lm's `minicpm5.parse_tool_call`: `"f"><param name="k">v</param>` (the server
/// strips `<function name=` and `</function>`; the full form is read too), values in
/// CDATA blocks or stripped, converted as `minimax_m2` does.
pub(crate) fn parse_minicpm5(text: &str, tools: Option<&[Json]>) -> R<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut pos = 0;
    while pos <= text.len() {
        let Some((p, (name, body, end))) = text[pos..]
            .char_indices()
            .map(|(i, _)| pos + i)
            .find_map(|p| minicpm_function_at(text, p).map(|m| (p, m)))
        else {
            break;
        };
        let name = extract_name(name);
        let config = param_config(&name, tools);
        let mut args = Map::new();
        for (pname, raw) in minicpm_params(body) {
            let pname = extract_name(pname);
            let types = match config.get(&pname) {
                Some(schema) => schema_types(Some(schema)),
                None => vec!["string".into()],
            };
            args.insert(pname, convert_typed(cdata_or_strip(raw), &types)?);
        }
        calls.push(call(name, Json::Object(args)));
        pos = end.max(p + 1);
    }
    if calls.is_empty() {
        return Err("No function provided.".into());
    }
    Ok(calls)
}

// ---------------------------------------------------------------------------------
// muse_spark

/// `<TAG\b[^>]*?\bname="([^"]+)"` at `p` (which starts with `<TAG`): the name's range
/// and the byte after its closing quote.
fn atem_name_at(text: &str, p: usize, tag: &str, need_gt: bool) -> Option<(usize, usize, usize)> {
    let i = p + tag.len();
    if text[i..].chars().next().is_some_and(re_word) {
        return None;
    }
    let limit = find_from(text, i, ">").unwrap_or(text.len());
    let mut j = i;
    while j <= limit {
        let before_is_word = text[..j].chars().next_back().is_some_and(re_word);
        if !before_is_word && text[j..].starts_with("name=\"") {
            let ns = j + "name=\"".len();
            if let Some(q) = find_from(text, ns, "\"") {
                if q > ns && (!need_gt || text[q + 1..].starts_with('>')) {
                    return Some((ns, q, q + 1));
                }
            }
        }
        match text[j..].chars().next() {
            Some(c) => j += c.len_utf8(),
            None => break,
        }
    }
    None
}

/// muse_spark's parameter pattern in `body`: (name, raw value).
fn atem_params(body: &str) -> Vec<(&str, &str)> {
    const TAG: &str = "<atem:parameter";
    const CLOSE: &str = "</atem:parameter>";
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(p) = find_from(body, pos, TAG) {
        pos = p + 1;
        let Some((ns, ne, after)) = atem_name_at(body, p, TAG, false) else {
            continue;
        };
        let Some(gt) = find_from(body, after, ">") else {
            continue;
        };
        let Some(e) = find_from(body, gt + 1, CLOSE) else {
            break;
        };
        out.push((&body[ns..ne], &body[gt + 1..e]));
        pos = e + CLOSE.len();
    }
    out
}

/// mlx-lm's `muse_spark.parse_tool_call`: `<atem:invoke name="f"><atem:parameter
/// name="k">v</atem:parameter></atem:invoke>`, each value JSON or the stripped text.
pub(crate) fn parse_muse_spark(text: &str) -> R<Vec<ParsedCall>> {
    const TAG: &str = "<atem:invoke";
    const CLOSE: &str = "</atem:invoke>";
    const PTAG: &str = "<atem:parameter";
    const PCLOSE: &str = "</atem:parameter>";
    let mut calls = Vec::new();
    let mut pos = 0;
    while let Some(p) = find_from(text, pos, TAG) {
        pos = p + 1;
        let Some((ns, ne, after)) = atem_name_at(text, p, TAG, true) else {
            continue;
        };
        // The body: parameter blocks whole, other characters one by one, up to the
        // first `</atem:invoke>` outside a block or the end.
        let body_start = after + 1;
        let mut i = body_start;
        let end = loop {
            if text[i..].starts_with(CLOSE) {
                break (i, i + CLOSE.len());
            }
            if i == text.len() || (i + 1 == text.len() && text.ends_with('\n')) {
                break (i, i);
            }
            if text[i..].starts_with(PTAG)
                && !text[i + PTAG.len()..].chars().next().is_some_and(re_word)
            {
                if let Some(e) = find_from(text, i + PTAG.len(), PCLOSE) {
                    i = e + PCLOSE.len();
                    continue;
                }
            }
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        };
        let body = &text[body_start..end.0];
        let mut args = Map::new();
        for (k, raw) in atem_params(body) {
            let v = json_loads(raw).unwrap_or_else(|| Json::String(py_strip(raw).to_string()));
            args.insert(k.to_string(), v);
        }
        calls.push(call(text[ns..ne].to_string(), Json::Object(args)));
        pos = end.1.max(p + 1);
    }
    if calls.is_empty() {
        return Err("No function provided.".into());
    }
    Ok(calls)
}

// ---------------------------------------------------------------------------------
// kimi_k3

const K3_SEP: &str = "<|sep|>";

/// `<|open|>TAG(attrs up to the first <|sep|>)<|sep|>(.*?)<|close|>TAG<|sep|>` from
/// byte `from`: (attrs, body, end of match).
fn k3_block<'a>(text: &'a str, from: usize, tag: &str) -> Option<(&'a str, &'a str, usize)> {
    let open = format!("<|open|>{tag}");
    let close = format!("<|close|>{tag}{K3_SEP}");
    let s = find_from(text, from, &open)?;
    let sep = find_from(text, s + open.len(), K3_SEP)?;
    let e = find_from(text, sep + K3_SEP.len(), &close)?;
    Some((
        &text[s + open.len()..sep],
        &text[sep + K3_SEP.len()..e],
        e + close.len(),
    ))
}

/// kimi_k3's `_parse_attrs`: `(\w+)="([^"]*)"` pairs, `&quot;` / `&amp;` unescaped.
fn k3_attrs(text: &str) -> Map<String, Json> {
    let mut out = Map::new();
    let mut i = 0;
    while i < text.len() {
        let c = text[i..].chars().next().unwrap_or(' ');
        if !re_word(c) {
            i += c.len_utf8();
            continue;
        }
        let run = text[i..].len() - text[i..].trim_start_matches(re_word).len();
        let after = i + run;
        if text[after..].starts_with("=\"") {
            if let Some(q) = find_from(text, after + 2, "\"") {
                let v = text[after + 2..q]
                    .replace("&quot;", "\"")
                    .replace("&amp;", "&");
                out.insert(text[i..after].to_string(), Json::String(v));
                i = q + 1;
                continue;
            }
        }
        i = after;
    }
    out
}

fn k3_call(attrs: &str, body: &str) -> R<ParsedCall> {
    let attrs = k3_attrs(attrs);
    let name = attrs
        .get("tool")
        .and_then(Json::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("Kimi K3 tool call is missing the tool name attribute.")?;
    let arguments = if let Some((_, raw, _)) = k3_block(body, 0, "json") {
        let v: Json = serde_json::from_str(raw).map_err(|e| e.to_string())?;
        if !v.is_object() {
            return Err("Kimi K3 tool call JSON block must be an object.".into());
        }
        v
    } else {
        let mut args = Map::new();
        let mut pos = 0;
        while let Some((a, value, end)) = k3_block(body, pos, "argument") {
            let a = k3_attrs(a);
            let key = a
                .get("key")
                .and_then(Json::as_str)
                .ok_or("Kimi K3 tool argument is missing its key.")?;
            let v = if a.get("type").and_then(Json::as_str).unwrap_or("string") == "string" {
                Json::String(value.to_string())
            } else {
                json_loads(value).unwrap_or_else(|| Json::String(value.to_string()))
            };
            args.insert(key.to_string(), v);
            pos = end;
        }
        Json::Object(args)
    };
    Ok(call(name.to_string(), arguments))
}

/// mlx-lm's `kimi_k3.parse_tool_call`: `<|open|>call tool="f"<|sep|>` blocks with a
/// JSON object block or typed argument blocks; calls that fail are skipped.
pub(crate) fn parse_kimi_k3(text: &str) -> R<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut pos = 0;
    while let Some((attrs, body, end)) = k3_block(text, pos, "call") {
        if let Ok(c) = k3_call(attrs, body) {
            calls.push(c);
        }
        pos = end;
    }
    if calls.is_empty() {
        return Err("No tool call found.".into());
    }
    Ok(calls)
}

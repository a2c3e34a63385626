//! Python-compatible text formatting of template values.
//!
//! Chat templates are written against Jinja2 running in Python, so values are
//! printed the way Python prints them: `json.dumps` for the `tojson` filter
//! (transformers overrides Jinja's filter with a plain `json.dumps` call) and
//! `str()`/`repr()` when a non-string value is interpolated.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Options of Python's `json.dumps` supported by the `tojson` filter.
#[derive(Debug, Clone, Default)]
pub(crate) struct DumpOptions {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// `None`: single line; `Some(s)`: newline and `s` per nesting level.
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; defaults depend on `indent`.
    pub separators: Option<(String, String)>,
    /// Sort object keys.
    pub sort_keys: bool,
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside
/// `1e-4 <= |x| < 1e16`, always with a `.0` or an exponent.
pub(crate) fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // `{:e}` yields the shortest round-trip digits, e.g. "-1.2345e-5".
    let sci = format!("{:e}", x);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        out.push('e');
        out.push(if e < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", e.abs()));
    } else if decpt <= 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-decpt) as usize));
        out.push_str(&digits);
    } else {
        let d = decpt as usize;
        if d >= digits.len() {
            out.push_str(&digits);
            out.push_str(&"0".repeat(d - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..d]);
            out.push('.');
            out.push_str(&digits[d..]);
        }
    }
    out
}

fn json_float(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        py_float_repr(x)
    }
}

fn json_escape_into(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Renders a number value as Python would print it (ints verbatim, floats by repr).
fn number_text(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(x) if json => json_float(x),
        Ok(x) => py_float_repr(x),
        Err(_) => value.to_string(),
    }
}

/// Key text for a JSON object key (Python converts scalar keys to strings).
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Ok(number_text(key, true)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        kind => Err(Error::new(
            ErrorKind::BadSerialization,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn map_pairs(value: &Value, sort_keys: bool) -> Result<Vec<(Value, Value)>, Error> {
    let mut pairs = Vec::new();
    for key in value.try_iter()? {
        let item = value.get_item(&key)?;
        pairs.push((key, item));
    }
    if sort_keys {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(pairs)
}

/// Python's `json.dumps(value, ...)` for a template value.
pub(crate) fn json_dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    dump_into(&mut out, value, opts, 0)?;
    Ok(out)
}

fn dump_into(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    level: usize,
) -> Result<(), Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    match value.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::BadSerialization,
                "Object of type Undefined is not JSON serializable",
            ))
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number_text(value, true)),
        ValueKind::String => {
            json_escape_into(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Map => {
            let pairs = map_pairs(value, opts.sort_keys)?;
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                json_escape_into(out, &json_key(k)?, opts.ensure_ascii);
                out.push_str(key_sep);
                dump_into(out, v, opts, level + 1)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                dump_into(out, v, opts, level + 1)?;
            }
            newline(out, level);
            out.push(']');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::BadSerialization,
                format!("Object of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// Python's `json.dumps(value)` (`", "` and `": "` separators, keys in their order,
/// floats by `repr`, so `1e-05` and `1e+16` as Python prints them) for a JSON value;
/// `ensure_ascii` escapes every character outside `' '..='~'` as `\uXXXX` (Python's
/// default), `false` keeps non-ASCII text as is (`ensure_ascii=False`).
pub fn py_json_dumps(value: &serde_json::Value, ensure_ascii: bool) -> String {
    let mut out = String::new();
    dump_json_into(&mut out, value, ensure_ascii);
    out
}

fn dump_json_into(out: &mut String, value: &serde_json::Value, ensure_ascii: bool) {
    use serde_json::Value as Json;
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (None, Some(u), _) => out.push_str(&u.to_string()),
            (None, None, Some(x)) => out.push_str(&json_float(x)),
            _ => out.push_str(&n.to_string()),
        },
        Json::String(s) => json_escape_into(out, s, ensure_ascii),
        Json::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dump_json_into(out, v, ensure_ascii);
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                json_escape_into(out, k, ensure_ascii);
                out.push_str(": ");
                dump_json_into(out, v, ensure_ascii);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
pub(crate) fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr()` of a template value (strings quoted).
pub(crate) fn py_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => py_str_repr(value.as_str().unwrap_or_default()),
        _ => py_str(value),
    }
}

/// Python's `str()` of a template value: `True`, `None`, `1.0`, `['a', 1]`, `{'k': 'v'}`.
pub(crate) fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number => number_text(value, false),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Map => match map_pairs(value, false) {
            Ok(pairs) => {
                let parts: Vec<String> = pairs
                    .iter()
                    .map(|(k, v)| format!("{}: {}", py_repr(k), py_repr(v)))
                    .collect();
                format!("{{{}}}", parts.join(", "))
            }
            Err(_) => value.to_string(),
        },
        ValueKind::Seq => match value.try_iter() {
            Ok(iter) => {
                let parts: Vec<String> = iter.map(|v| py_repr(&v)).collect();
                format!("[{}]", parts.join(", "))
            }
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123.456, "123.456"),
            (-2.5e-7, "-2.5e-07"),
            (1.5e300, "1.5e+300"),
            (-0.0, "-0.0"),
            (3.0e20, "3e+20"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "repr({x})");
        }
    }

    #[test]
    fn json_dumps_uses_python_separators_and_indent() {
        let v =
            Value::from_serialize(serde_json::json!({"b": [1, 2.0, "é\n"], "a": {}, "c": null}));
        let flat = json_dumps(&v, &DumpOptions::default()).unwrap();
        assert_eq!(flat, "{\"b\": [1, 2.0, \"é\\n\"], \"a\": {}, \"c\": null}");
        let opts = DumpOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ..Default::default()
        };
        let pretty = json_dumps(&v, &opts).unwrap();
        assert_eq!(
            pretty,
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.0,\n    \"é\\n\"\n  ],\n  \"c\": null\n}"
        );
        let ascii = DumpOptions {
            ensure_ascii: true,
            ..Default::default()
        };
        let v = Value::from("é😀");
        assert_eq!(json_dumps(&v, &ascii).unwrap(), "\"\\u00e9\\ud83d\\ude00\"");
    }

    /// The expected texts are Python 3's `json.dumps(v)` and
    /// `json.dumps(v, ensure_ascii=False)` of the same value.
    #[test]
    fn py_json_dumps_matches_python_floats_unicode_and_nesting() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"f": [1.0, 0.1, 1e-5, 1e16, 1e15, 123.456, -2.5e-7, 3e20, -0.0, 1e-4,
                5e-324, 1.7976931348623157e308], "i": [0, -7, 12345678901234567890],
                "s": "\u00e9\ud83d\ude00\n\t\"\\\u0001\u007f<",
                "n": {"a": [], "b": {}, "c": null, "d": true, "e": [{"x": false}]}}"#,
        )
        .unwrap();
        let floats = r#"{"f": [1.0, 0.1, 1e-05, 1e+16, 1000000000000000.0, 123.456, -2.5e-07, 3e+20, -0.0, 0.0001, 5e-324, 1.7976931348623157e+308], "i": [0, -7, 12345678901234567890], "s": "#;
        let nested = r#", "n": {"a": [], "b": {}, "c": null, "d": true, "e": [{"x": false}]}}"#;
        let ascii = format!(r#"{floats}"\u00e9\ud83d\ude00\n\t\"\\\u0001\u007f<"{nested}"#);
        let raw = format!("{floats}\"é😀\\n\\t\\\"\\\\\\u0001\u{7f}<\"{nested}");
        assert_eq!(py_json_dumps(&v, true), ascii);
        assert_eq!(py_json_dumps(&v, false), raw);
    }

    #[test]
    fn py_str_prints_python_literals() {
        let v = Value::from_serialize(serde_json::json!({"a": [true, null, 1.5, "it's"]}));
        assert_eq!(py_str(&v), "{'a': [True, None, 1.5, \"it's\"]}");
    }
}

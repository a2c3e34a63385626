//! Python values as `mlx_lm.lora` holds its arguments (argparse namespace merged with
//! the YAML config), kept in their order, written as Python's `json.dump(..., indent=4)`
//! writes them (float `repr`, ASCII escapes), and read from YAML as PyYAML with mlx-lm's
//! float resolver reads it.
use std::fmt::Write as _;
use yaml_rust2::Yaml;

/// A Python value.
#[derive(Debug, Clone, PartialEq)]
pub enum PyVal {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// A list.
    List(Vec<PyVal>),
    /// A dict in insertion order.
    Dict(Vec<(String, PyVal)>),
}

impl PyVal {
    /// The value of `key` in a dict.
    pub fn get(&self, key: &str) -> Option<&PyVal> {
        match self {
            PyVal::Dict(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Whether it is `None`.
    pub fn is_none(&self) -> bool {
        matches!(self, PyVal::None)
    }

    /// Python's type name, for errors.
    pub fn type_name(&self) -> &'static str {
        match self {
            PyVal::None => "None",
            PyVal::Bool(_) => "bool",
            PyVal::Int(_) => "int",
            PyVal::Float(_) => "float",
            PyVal::Str(_) => "str",
            PyVal::List(_) => "list",
            PyVal::Dict(_) => "dict",
        }
    }

    /// A JSON value (for the parts of the crate that read `serde_json`).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            PyVal::None => Value::Null,
            PyVal::Bool(b) => Value::Bool(*b),
            PyVal::Int(i) => Value::from(*i),
            PyVal::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            PyVal::Str(s) => Value::String(s.clone()),
            PyVal::List(l) => Value::Array(l.iter().map(PyVal::to_json).collect()),
            PyVal::Dict(d) => {
                Value::Object(d.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }

    /// From PyYAML-like YAML (mlx-lm's loader: `1e-5` is a float).
    pub fn from_yaml(y: &Yaml) -> Result<PyVal, String> {
        Ok(match y {
            Yaml::Null => PyVal::None,
            Yaml::Boolean(b) => PyVal::Bool(*b),
            Yaml::Integer(i) => PyVal::Int(*i),
            Yaml::Real(s) => {
                PyVal::Float(parse_yaml_float(s).ok_or_else(|| format!("bad float {s:?}"))?)
            }
            Yaml::String(s) => PyVal::Str(s.clone()),
            Yaml::Array(a) => {
                PyVal::List(a.iter().map(PyVal::from_yaml).collect::<Result<_, _>>()?)
            }
            Yaml::Hash(h) => {
                let mut items = Vec::new();
                for (k, v) in h {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => if *b { "True" } else { "False" }.to_string(),
                        other => return Err(format!("a mapping key {other:?} is not a string")),
                    };
                    items.push((key, PyVal::from_yaml(v)?));
                }
                PyVal::Dict(items)
            }
            Yaml::Alias(_) | Yaml::BadValue => return Err("an unsupported YAML value".into()),
        })
    }

    /// `json.dumps(self, indent=4)`.
    pub fn to_python_json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out, 0);
        out
    }

    fn write_json(&self, out: &mut String, level: usize) {
        let pad = |n: usize| " ".repeat(4 * n);
        match self {
            PyVal::None => out.push_str("null"),
            PyVal::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            PyVal::Int(i) => {
                let _ = write!(out, "{i}");
            }
            PyVal::Float(f) => out.push_str(&json_float(*f)),
            PyVal::Str(s) => write_json_str(out, s),
            PyVal::List(l) if l.is_empty() => out.push_str("[]"),
            PyVal::List(l) => {
                out.push_str("[\n");
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        out.push_str(",\n");
                    }
                    out.push_str(&pad(level + 1));
                    v.write_json(out, level + 1);
                }
                out.push('\n');
                out.push_str(&pad(level));
                out.push(']');
            }
            PyVal::Dict(d) if d.is_empty() => out.push_str("{}"),
            PyVal::Dict(d) => {
                out.push_str("{\n");
                for (i, (k, v)) in d.iter().enumerate() {
                    if i > 0 {
                        out.push_str(",\n");
                    }
                    out.push_str(&pad(level + 1));
                    write_json_str(out, k);
                    out.push_str(": ");
                    v.write_json(out, level + 1);
                }
                out.push('\n');
                out.push_str(&pad(level));
                out.push('}');
            }
        }
    }
}

fn parse_yaml_float(s: &str) -> Option<f64> {
    let t = s.replace('_', "");
    match t.to_ascii_lowercase().as_str() {
        ".inf" | "+.inf" => Some(f64::INFINITY),
        "-.inf" => Some(f64::NEG_INFINITY),
        ".nan" => Some(f64::NAN),
        _ => t.parse().ok(),
    }
}

fn write_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `float.__repr__` (what `json.dumps` writes; `Infinity` / `NaN` as json
/// writes them).
pub fn json_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    py_repr(f)
}

/// Python's `repr(float)`: the shortest round-trip digits, positional when the
/// exponent is in [-4, 16), else `d.ddde-XX`.
pub fn py_repr(f: f64) -> String {
    let sci = format!("{f:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let sign = if neg { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp >= n - 1 {
            format!("{digits}{}.0", "0".repeat((exp - n + 1) as usize))
        } else if exp >= 0 {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let es = if exp < 0 { "-" } else { "+" };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// Python's `f"{x:.{prec}e}"` (two-digit exponent with its sign).
pub fn py_exp(x: f64, prec: usize) -> String {
    let s = format!("{x:.prec$e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let e: i32 = e.parse().unwrap_or(0);
            format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
        }
        None => s,
    }
}

/// Python's `f"{x:.{prec}f}"` (`nan`, `inf` and `-inf` as Python writes them).
pub fn py_fixed(x: f64, prec: usize) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:.prec$}")
    }
}

/// Python's `f"{n:,}"` of an integer.
pub fn py_thousands(n: i64) -> String {
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        assert_eq!(py_repr(1e-5), "1e-05");
        assert_eq!(py_repr(20.0), "20.0");
        assert_eq!(py_repr(0.0001), "0.0001");
        assert_eq!(py_repr(2e-4), "0.0002");
        assert_eq!(py_repr(1e16), "1e+16");
        assert_eq!(py_repr(123456.5), "123456.5");
        assert_eq!(py_repr(-0.5), "-0.5");
        assert_eq!(py_repr(3.0e-5), "3e-05");
        assert_eq!(py_repr(1.5e-7), "1.5e-07");
        assert_eq!(py_exp(1e-5, 1), "1.0e-05");
        assert_eq!(py_thousands(1335), "1,335");
        assert_eq!(py_thousands(5), "5");
    }

    #[test]
    fn dicts_print_as_json_dumps_indent_4() {
        let v = PyVal::Dict(vec![
            (
                "a".into(),
                PyVal::List(vec![PyVal::Int(1), PyVal::Float(0.5)]),
            ),
            ("b".into(), PyVal::Dict(vec![])),
            ("c".into(), PyVal::Str("é\"".into())),
        ]);
        assert_eq!(
            v.to_python_json(),
            "{\n    \"a\": [\n        1,\n        0.5\n    ],\n    \"b\": {},\n    \"c\": \"\\u00e9\\\"\"\n}"
        );
    }
}

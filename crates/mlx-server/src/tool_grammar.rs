//! Forced tool calls as a Lark grammar (llguidance) in the model's own tool-call
//! format: the text the chat template teaches the model and mlx-lm's parser for that
//! format (`mlx_lm/tool_parsers/*.py`, ported in [`crate::tools`]) reads back, with each
//! call's arguments valid against its tool's `parameters`.
//!
//! - JSON formats (`json_tools`, `llama3_json`, `mistral`): the arguments are one JSON
//!   value (`%json` with the whole parameter schema).
//! - JSON formats (`kimi_k2`, `kimi_k3`): the arguments are one JSON object too, in
//!   the format's own call blocks.
//! - Keyword formats (`pythonic`, `qwen3_coder`, `function_gemma`, `gemma4`, `glm47`,
//!   `longcat`, `minimax_m2`, `minicpm5`, `muse_spark`): one entry per declared
//!   property, in the schema's order, the required ones always and the others
//!   optionally; each value in the format's own syntax. Python keyword values and
//!   `muse_spark`'s are JSON (mlx-lm reads `true` / `false` / `null` there, and
//!   `muse_spark` tries JSON first); a string value of the other formats is raw text
//!   between the format's delimiters (its `enum`, `const`, `minLength`, `maxLength` and
//!   `pattern` enforced, the delimiter's characters excluded; without surrounding
//!   whitespace where the parser strips values), numbers and booleans are JSON text;
//!   `glm47` / `longcat` write every property not typed `string` as JSON, which their
//!   parsers deserialize.
//!
//! A schema a format cannot carry faithfully (a nested object in `function_gemma`, a
//! string `format` outside JSON, a property without a type in `qwen3_coder`...) is a
//! 400 naming the tool, the property and the format.
use crate::error::ApiError;
use crate::params::tool_name;
use crate::tools::ToolFormat;
use mlx_engine::constrain::{json_options, lark_string};
use mlx_engine::ConstraintVocab;
use serde_json::{json, Value as Json};

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param("tool_choice", msg.into())
}

/// The Lark grammar of one or (`parallel`) several calls to `tools` in `format`.
pub fn tool_grammar(
    format: Option<ToolFormat>,
    tools: &[Json],
    parallel: bool,
    vocab: &ConstraintVocab,
) -> Result<String, ApiError> {
    let Some(format) = format else {
        return Err(invalid(
            "this model's tool-call format cannot be enforced: its chat template has no tool-call format this server reads; use tool_choice auto",
        ));
    };
    let mut g = Grammar {
        rules: vec!["%llguidance {}".to_string()],
        vocab,
        format,
    };
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let name = tool_name(t).unwrap_or_default().to_string();
        let params = t
            .get("function")
            .unwrap_or(t)
            .get("parameters")
            .cloned()
            .filter(|p| !p.is_null())
            .unwrap_or(json!({"type": "object"}));
        check_name(format, &name)?;
        let body = g.call(i, &name, &params)?;
        g.rules.push(format!("call_{i}: {body}"));
        alts.push(format!("call_{i}"));
    }
    g.rules.push(format!("call: {}", alts.join(" | ")));
    let lit = |s: &str| vocab.lark_literal(s);
    let (open, sep, close) = match format {
        ToolFormat::JsonTools => (String::new(), lark_string("\n"), String::new()),
        ToolFormat::Qwen3Coder => (String::new(), lark_string("\n"), String::new()),
        ToolFormat::Llama3Json => (String::new(), lark_string("; "), String::new()),
        ToolFormat::Mistral if mistral_header(vocab) => {
            (String::new(), String::new(), String::new())
        }
        ToolFormat::Mistral => (
            format!("{} \"[\"", lit("[TOOL_CALLS]")),
            lark_string(", "),
            "\"]\"".to_string(),
        ),
        ToolFormat::Pythonic => (
            format!("{} \"[\"", lit("<|tool_call_start|>")),
            lark_string(", "),
            format!("\"]\" {}", lit("<|tool_call_end|>")),
        ),
        ToolFormat::FunctionGemma | ToolFormat::Gemma4 => {
            (String::new(), String::new(), String::new())
        }
        ToolFormat::Glm47 | ToolFormat::Longcat | ToolFormat::Minicpm5 => {
            (String::new(), lark_string("\n"), String::new())
        }
        ToolFormat::KimiK2 => (
            lit("<|tool_calls_section_begin|>"),
            String::new(),
            lit("<|tool_calls_section_end|>"),
        ),
        ToolFormat::MinimaxM2 => (
            format!("{} \"\\n\"", lit("<minimax:tool_call>")),
            lark_string("\n"),
            format!("\"\\n\" {}", lit("</minimax:tool_call>")),
        ),
        ToolFormat::MuseSpark => (
            format!("{} \"\\n\"", lit("<atem:function_calls>")),
            lark_string("\n"),
            format!("\"\\n\" {}", lit("</atem:function_calls>")),
        ),
        ToolFormat::KimiK3 => (
            format!("{} \"tools\" {}", lit("<|open|>"), lit(K3_SEP)),
            String::new(),
            format!("{} \"tools\" {}", lit("<|close|>"), lit(K3_SEP)),
        ),
    };
    let calls = if parallel {
        format!("call ({sep} call)*")
    } else {
        "call".to_string()
    };
    g.rules.push(format!("start: {open} {calls} {close}"));
    Ok(g.rules.join("\n") + "\n")
}

const K3_SEP: &str = "<|sep|>";

/// Whether the vocabulary has Mistral's `[ARGS]` token: calls are then
/// `[TOOL_CALLS]name[ARGS]{..}`, else `[TOOL_CALLS][{"name": .., "arguments": ..}]`.
fn mistral_header(vocab: &ConstraintVocab) -> bool {
    vocab.special_token("[ARGS]").is_some()
}

/// Function names each format's parser reads back.
fn check_name(format: ToolFormat, name: &str) -> Result<(), ApiError> {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let ok = !name.is_empty()
        && match format {
            ToolFormat::JsonTools | ToolFormat::Llama3Json => true,
            ToolFormat::Mistral | ToolFormat::Gemma4 => name.chars().all(|c| word(c) || c == '-'),
            ToolFormat::Pythonic => name.chars().all(|c| word(c) || c == '.'),
            // Names the parsers read back whole: no tag, quote or separator characters
            // (nor, for kimi_k2, a `functions.` prefix of its own).
            ToolFormat::Glm47
            | ToolFormat::Longcat
            | ToolFormat::MinimaxM2
            | ToolFormat::Minicpm5
            | ToolFormat::MuseSpark
            | ToolFormat::KimiK3 => name.chars().all(|c| word(c) || c == '-' || c == '.'),
            ToolFormat::KimiK2 => {
                name.chars().all(|c| word(c) || c == '-' || c == '.')
                    && !name.starts_with("functions.")
            }
            ToolFormat::FunctionGemma => name.chars().all(word),
            ToolFormat::Qwen3Coder => !name
                .chars()
                .any(|c| c.is_whitespace() || c == '<' || c == '>'),
        };
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "tool `{name}`: the name cannot be written in this model's tool-call format ({})",
            format_name(format)
        )))
    }
}

/// mlx-lm's module name of a format.
fn format_name(format: ToolFormat) -> &'static str {
    match format {
        ToolFormat::JsonTools => "json_tools",
        ToolFormat::Qwen3Coder => "qwen3_coder",
        ToolFormat::Mistral => "mistral",
        ToolFormat::Pythonic => "pythonic",
        ToolFormat::FunctionGemma => "function_gemma",
        ToolFormat::Gemma4 => "gemma4",
        ToolFormat::Llama3Json => "llama3_json",
        ToolFormat::Glm47 => "glm47",
        ToolFormat::KimiK2 => "kimi_k2",
        ToolFormat::MinimaxM2 => "minimax_m2",
        ToolFormat::Longcat => "longcat",
        ToolFormat::Minicpm5 => "minicpm5",
        ToolFormat::MuseSpark => "muse_spark",
        ToolFormat::KimiK3 => "kimi_k3",
    }
}

struct Grammar<'a> {
    rules: Vec<String>,
    vocab: &'a ConstraintVocab,
    format: ToolFormat,
}

/// How a property's value is written in a keyword format.
enum Value {
    /// JSON text (`%json` with the property's schema).
    Json,
    /// A raw string.
    Str,
}

/// How a format reads a raw string value back.
struct RawRules {
    /// Characters the value cannot hold.
    forbid: &'static str,
    /// The parser strips the value (no whitespace at either end).
    stripped: bool,
    /// The parser reads `null` (any case) as JSON null.
    no_null: bool,
}

impl Grammar<'_> {
    fn lit(&self, s: &str) -> String {
        self.vocab.lark_literal(s)
    }

    fn refuse(&self, tool: &str, what: String) -> ApiError {
        invalid(format!(
            "tool `{tool}`: {what} cannot be enforced in this model's tool-call format ({}); use tool_choice auto",
            format_name(self.format)
        ))
    }

    /// `args_{i}: %json {schema}`; returns the rule name.
    fn json_rule(&mut self, name: String, tool: &str, schema: &Json) -> Result<String, ApiError> {
        let s = json_options(schema).map_err(|e| {
            ApiError::invalid_param("tools", format!("tool `{tool}`: parameters: {e}"))
        })?;
        self.rules.push(format!("{name}: %json {s}"));
        Ok(name)
    }

    /// The Lark body of one call of tool `i`.
    fn call(&mut self, i: usize, name: &str, params: &Json) -> Result<String, ApiError> {
        let n = |s: &str| lark_string(s);
        Ok(match self.format {
            ToolFormat::JsonTools => {
                let a = self.json_rule(format!("args_{i}"), name, params)?;
                let head = format!(
                    "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                    Json::String(name.into())
                );
                format!("{} {a} {}", n(&head), n("}\n</tool_call>"))
            }
            ToolFormat::Llama3Json => {
                let a = self.json_rule(format!("args_{i}"), name, params)?;
                let head = format!(
                    "{{\"name\": {}, \"parameters\": ",
                    Json::String(name.into())
                );
                format!("{} {a} \"}}\"", n(&head))
            }
            ToolFormat::Mistral if mistral_header(self.vocab) => {
                let a = self.json_rule(format!("args_{i}"), name, params)?;
                format!(
                    "{} {} {} {a}",
                    self.lit("[TOOL_CALLS]"),
                    n(name),
                    self.lit("[ARGS]")
                )
            }
            ToolFormat::Mistral => {
                let a = self.json_rule(format!("args_{i}"), name, params)?;
                let head = format!("{{\"name\": {}, \"arguments\": ", Json::String(name.into()));
                format!("{} {a} \"}}\"", n(&head))
            }
            ToolFormat::Pythonic => {
                let kw = self.keywords(i, name, params, ", ")?;
                format!("{} {kw} \")\"", n(&format!("{name}(")))
            }
            ToolFormat::FunctionGemma => {
                let kw = self.keywords(i, name, params, ",")?;
                format!(
                    "{} {} {kw} \"}}\" {}",
                    self.lit("<start_function_call>"),
                    n(&format!("call:{name}{{")),
                    self.lit("<end_function_call>")
                )
            }
            ToolFormat::Gemma4 => {
                let kw = self.keywords(i, name, params, ",")?;
                format!(
                    "{} {} {kw} \"}}\" {}",
                    self.lit("<|tool_call>"),
                    n(&format!("call:{name}{{")),
                    self.lit("<tool_call|>")
                )
            }
            ToolFormat::Qwen3Coder => {
                let kw = self.keywords(i, name, params, "")?;
                format!(
                    "{} {kw} {}",
                    n(&format!("<tool_call>\n<function={name}>\n")),
                    n("</function>\n</tool_call>")
                )
            }
            ToolFormat::Glm47 | ToolFormat::Longcat => {
                let params = if self.format == ToolFormat::Longcat {
                    longcat_params(params).map_err(|what| self.refuse(name, what))?
                } else {
                    params.clone()
                };
                let kw = self.keywords(i, name, &params, "")?;
                let (open, close) = if self.format == ToolFormat::Glm47 {
                    ("<tool_call>", "</tool_call>")
                } else {
                    ("<longcat_tool_call>", "</longcat_tool_call>")
                };
                format!(
                    "{} {} {kw} {}",
                    self.lit(open),
                    n(&format!("{name}\n")),
                    self.lit(close)
                )
            }
            ToolFormat::KimiK2 => {
                let a = self.json_rule(format!("args_{i}"), name, params)?;
                format!(
                    "{} {} /[0-9]{{1,3}}/ {} {a} {}",
                    self.lit("<|tool_call_begin|>"),
                    n(&format!("functions.{name}:")),
                    self.lit("<|tool_call_argument_begin|>"),
                    self.lit("<|tool_call_end|>")
                )
            }
            ToolFormat::MinimaxM2 => {
                let kw = self.keywords(i, name, params, "")?;
                format!(
                    "{} {kw} {}",
                    n(&format!("<invoke name=\"{name}\">\n")),
                    n("</invoke>")
                )
            }
            ToolFormat::Minicpm5 => {
                let kw = self.keywords(i, name, params, "")?;
                format!(
                    "{} {kw} {}",
                    n(&format!("<function name=\"{name}\">")),
                    n("</function>")
                )
            }
            ToolFormat::MuseSpark => {
                let kw = self.keywords(i, name, params, "")?;
                format!(
                    "{} {kw} {}",
                    n(&format!("<atem:invoke name=\"{name}\">")),
                    n("</atem:invoke>")
                )
            }
            ToolFormat::KimiK3 => {
                let a = self.json_rule(format!("args_{i}"), name, params)?;
                let (open, close, sep) = (
                    self.lit("<|open|>"),
                    self.lit("<|close|>"),
                    self.lit(K3_SEP),
                );
                format!(
                    "{open} {} {sep} {open} {} {sep} {a} {close} \"json\" {sep} {close} \"call\" {sep}",
                    n(&format!("call tool=\"{name}\"")),
                    n("json type=\"object\""),
                )
            }
        })
    }

    /// The entries of the declared properties, required ones always, in order, `sep`
    /// between them: a rule per position (`kw_{i}_{k}_{f|n}`: from property `k` on,
    /// first entry or not), so the grammar stays linear in the number of properties.
    fn keywords(
        &mut self,
        i: usize,
        tool: &str,
        params: &Json,
        sep: &str,
    ) -> Result<String, ApiError> {
        let props: Vec<(String, Json)> = params
            .get("properties")
            .and_then(Json::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let required: Vec<&str> = params
            .get("required")
            .and_then(Json::as_array)
            .map(|r| r.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        if let Some(r) = required
            .iter()
            .find(|r| !props.iter().any(|(k, _)| k == *r))
        {
            return Err(self.refuse(
                tool,
                format!("the required parameter `{r}` without a schema in `properties`"),
            ));
        }
        let mut items = Vec::new();
        for (k, (key, schema)) in props.iter().enumerate() {
            let value = self.value(i, k, tool, key, schema)?;
            let q = |s: String| lark_string(&s);
            let entry = match self.format {
                ToolFormat::Pythonic => format!("{} {value}", q(format!("{key}="))),
                ToolFormat::Glm47 | ToolFormat::Longcat => {
                    let t = if self.format == ToolFormat::Glm47 {
                        ""
                    } else {
                        "longcat_"
                    };
                    format!(
                        "{} {} {} \"\\n\" {} {value} {} \"\\n\"",
                        self.lit(&format!("<{t}arg_key>")),
                        q(key.clone()),
                        self.lit(&format!("</{t}arg_key>")),
                        self.lit(&format!("<{t}arg_value>")),
                        self.lit(&format!("</{t}arg_value>")),
                    )
                }
                ToolFormat::MinimaxM2 => format!(
                    "{} {value} {}",
                    q(format!("<parameter name=\"{key}\">")),
                    q("</parameter>\n".into())
                ),
                ToolFormat::Minicpm5 => format!(
                    "{} {value} {}",
                    q(format!("<param name=\"{key}\">")),
                    q("</param>".into())
                ),
                ToolFormat::MuseSpark => format!(
                    "{} {value} {}",
                    q(format!("<atem:parameter name=\"{key}\">")),
                    q("</atem:parameter>".into())
                ),
                ToolFormat::Qwen3Coder => format!(
                    "{} {value} {}",
                    q(format!("<parameter={key}>\n")),
                    q("\n</parameter>\n".into())
                ),
                _ => format!("{} {value}", q(format!("{key}:"))),
            };
            let rule = format!("kv_{i}_{k}");
            self.rules.push(format!("{rule}: {entry}"));
            items.push((rule, required.contains(&key.as_str())));
        }
        let sep = if sep.is_empty() {
            String::new()
        } else {
            lark_string(sep)
        };
        let rule = |k: usize, first: bool| format!("kw_{i}_{k}_{}", if first { "f" } else { "n" });
        let n = items.len();
        for k in (0..n).rev() {
            for first in [true, false] {
                let (item, req) = &items[k];
                let lead = if first { String::new() } else { sep.clone() };
                let rest_after = if k + 1 < n {
                    rule(k + 1, false)
                } else {
                    String::new()
                };
                let take = format!("{lead} {item} {rest_after}");
                let body = if *req {
                    take
                } else if k + 1 < n {
                    format!("({take}) | {}", rule(k + 1, first))
                } else {
                    format!("({take})?")
                };
                self.rules.push(format!("{}: {body}", rule(k, first)));
            }
        }
        Ok(if n == 0 { String::new() } else { rule(0, true) })
    }

    /// The value of property `key` (rule `v_{i}_{k}`).
    fn value(
        &mut self,
        i: usize,
        k: usize,
        tool: &str,
        key: &str,
        schema: &Json,
    ) -> Result<String, ApiError> {
        let key_ok = match self.format {
            ToolFormat::Qwen3Coder => {
                !key.is_empty()
                    && !key
                        .chars()
                        .any(|c| c.is_whitespace() || c == '<' || c == '>')
            }
            _ => !key.is_empty() && key.chars().all(|c| c.is_alphanumeric() || c == '_'),
        };
        if !key_ok {
            return Err(self.refuse(tool, format!("the parameter name `{key}`")));
        }
        let name = format!("v_{i}_{k}");
        if matches!(self.format, ToolFormat::Pythonic | ToolFormat::MuseSpark) {
            return self.json_rule(name, tool, schema);
        }
        match self.kind(schema) {
            Some(Value::Json) => self.json_rule(name, tool, schema),
            Some(Value::Str) => {
                let (open, close, forbid) = match self.format {
                    ToolFormat::FunctionGemma => ("<escape>", "<escape>", "}<"),
                    ToolFormat::Gemma4 => ("<|\"|>", "<|\"|>", "<"),
                    _ => ("", "", "<"),
                };
                let stripped = matches!(
                    self.format,
                    ToolFormat::Glm47
                        | ToolFormat::Longcat
                        | ToolFormat::MinimaxM2
                        | ToolFormat::Minicpm5
                );
                let rules = RawRules {
                    forbid,
                    stripped,
                    // glm47 / longcat keep string-typed values as they are.
                    no_null: !matches!(self.format, ToolFormat::Glm47 | ToolFormat::Longcat),
                };
                let body = self
                    .raw_string(schema, &rules)
                    .map_err(|what| self.refuse(tool, format!("parameter `{key}`: {what}")))?;
                let (o, c) = if open.is_empty() {
                    (String::new(), String::new())
                } else {
                    (self.lit(open), self.lit(close))
                };
                self.rules.push(format!("{name}: {o} {body} {c}"));
                Ok(name)
            }
            None => Err(self.refuse(
                tool,
                format!("parameter `{key}` (schema {schema}: only strings, numbers, integers, booleans{} are supported there)",
                    if self.format == ToolFormat::Qwen3Coder { ", objects and arrays with an explicit type" } else { "" }),
            )),
        }
    }

    /// How a property's value is written outside Python / JSON, if it can be.
    fn kind(&self, schema: &Json) -> Option<Value> {
        match self.format {
            // String-typed parameters are kept as text, everything else deserialized.
            ToolFormat::Glm47 | ToolFormat::Longcat => {
                return Some(
                    if schema.get("type").and_then(Json::as_str) == Some("string") {
                        Value::Str
                    } else {
                        Value::Json
                    },
                );
            }
            // Converted by the one type mlx-lm's `_extract_types_from_schema` finds.
            ToolFormat::MinimaxM2 | ToolFormat::Minicpm5 => {
                if ["anyOf", "oneOf", "allOf"]
                    .iter()
                    .any(|k| schema.get(k).is_some())
                {
                    return None;
                }
                let types = crate::tool_parsers::schema_types(Some(schema));
                return match types.as_slice() {
                    [t] if t == "string" => Some(Value::Str),
                    [t] if ["integer", "number", "boolean", "object", "array", "null"]
                        .contains(&t.as_str()) =>
                    {
                        Some(Value::Json)
                    }
                    _ => None,
                };
            }
            _ => {}
        }
        let ty = schema.get("type");
        let listed: Option<Vec<&Json>> = schema
            .get("enum")
            .and_then(Json::as_array)
            .map(|a| a.iter().collect())
            .or_else(|| schema.get("const").map(|c| vec![c]));
        let nested = self.format == ToolFormat::Qwen3Coder;
        match ty.and_then(Json::as_str) {
            Some("string") => Some(Value::Str),
            Some("integer" | "number" | "boolean") => Some(Value::Json),
            Some("null") if nested => Some(Value::Json),
            Some("object" | "array") if nested => Some(Value::Json),
            Some(_) => None,
            None if ty.is_some() => None,
            None => {
                let listed = listed?;
                if !listed.is_empty() && listed.iter().all(|v| v.is_string()) {
                    Some(Value::Str)
                } else if !nested
                    && !listed.is_empty()
                    && listed
                        .iter()
                        .all(|v| v.is_number() || v.is_boolean() || v.is_null())
                {
                    Some(Value::Json)
                } else {
                    None
                }
            }
        }
    }

    /// A raw string valid against `schema` (a string schema), none of `forbid`'s
    /// characters in it; `null` (read as JSON null by qwen3_coder's and minimax_m2's
    /// parsers) excluded where the rules say, and whitespace at either end where the
    /// parser strips values.
    fn raw_string(&mut self, schema: &Json, rules: &RawRules) -> Result<String, String> {
        if let Some(f) = schema.get("format") {
            return Err(format!("the string format {f}"));
        }
        let forbid = rules.forbid;
        let edge_space = |s: &str| {
            let sp = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
            s.starts_with(sp) || s.ends_with(sp)
        };
        let bad = |s: &str| {
            s.chars().any(|c| forbid.contains(c))
                || (rules.no_null && s.eq_ignore_ascii_case("null"))
                || (rules.stripped && edge_space(s))
        };
        let listed: Option<Vec<Json>> = schema
            .get("enum")
            .and_then(Json::as_array)
            .cloned()
            .or_else(|| schema.get("const").map(|c| vec![c.clone()]));
        if let Some(list) = listed {
            let mut alts = Vec::new();
            for v in list.iter().filter_map(Json::as_str) {
                if bad(v) {
                    return Err(format!(
                        "the value {v:?} (it holds a character the format reserves)"
                    ));
                }
                alts.push(lark_string(v));
            }
            if alts.is_empty() {
                return Err("an enum without a string".into());
            }
            return Ok(format!("({})", alts.join(" | ")));
        }
        let min = schema.get("minLength").and_then(Json::as_u64).unwrap_or(0);
        let max = schema.get("maxLength").and_then(Json::as_u64);
        let class: String = forbid
            .chars()
            .map(|c| format!("\\x{:02x}", c as u32))
            .collect();
        let reps = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        let term = format!("STR_{}", self.rules.len());
        let mut def = format!("{term}: /[^{class}]{reps}/");
        if rules.no_null {
            def.push_str(" & ~/[nN][uU][lL][lL]/");
        }
        if rules.stripped {
            def.push_str(r" & ~/(?s:[\s\x1c-\x1f].*|.*[\s\x1c-\x1f])/");
        }
        if let Some(p) = schema.get("pattern").and_then(Json::as_str) {
            let core = p
                .strip_prefix('^')
                .map_or(format!("(?s:.*)(?:{p}"), |r| format!("(?:{r}"));
            let core = match core.strip_suffix('$') {
                Some(c) if !c.ends_with('\\') => format!("{c})"),
                _ => format!("{core})(?s:.*)"),
            };
            def.push_str(&format!(" & /{}/", core.replace('/', "\\/")));
        }
        self.rules.push(def);
        Ok(term)
    }
}

/// longcat's parser cannot read a call without arguments (mlx-lm fails on it): a tool
/// whose parameters require none has its first declared property made required.
fn longcat_params(params: &Json) -> Result<Json, String> {
    let mut params = params.clone();
    let required = params
        .get("required")
        .and_then(Json::as_array)
        .is_some_and(|r| !r.is_empty());
    if required {
        return Ok(params);
    }
    let first = params
        .get("properties")
        .and_then(Json::as_object)
        .and_then(|p| p.keys().next().cloned())
        .ok_or("a call without arguments (mlx-lm's parser cannot read one)")?;
    params["required"] = json!([first]);
    Ok(params)
}

//! Jinja chat templates rendered the way transformers' `apply_chat_template` does.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde_json::{Map, Value as Json};

use crate::error::TemplateError;
use crate::pyfmt::{json_dumps, py_str, DumpOptions};

/// Default instruction budget of one render; a loop-forever template fails
/// with [`TemplateError::OutOfFuel`] instead of hanging.
pub const DEFAULT_TEMPLATE_FUEL: u64 = 50_000_000;

const TEMPLATE_NAME: &str = "chat_template";
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// Inputs of one chat-template render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// Append the header that starts a new assistant turn.
    pub add_generation_prompt: bool,
    /// Leave the final message open so the model continues it (prefill).
    /// Incompatible with `add_generation_prompt`.
    pub continue_final_message: bool,
    /// Tool JSON schemas, passed to the template as `tools` (`None` renders as `none`).
    pub tools: Option<Vec<Json>>,
    /// RAG documents, passed to the template as `documents`.
    pub documents: Option<Vec<Json>>,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    /// They override the special-token variables.
    pub kwargs: Map<String, Json>,
    /// Which named template to use when the model has several
    /// (default: `tool_use` when tools are given, else `default`).
    pub template_name: Option<String>,
}

/// Marks an error raised by the template's `raise_exception(...)`.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: Arc<str>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` with the default fuel budget.
    pub fn new(source: impl Into<String>) -> Result<Self, TemplateError> {
        Self::with_fuel(source, Some(DEFAULT_TEMPLATE_FUEL))
    }

    /// Compiles `source`; `fuel` caps the instructions of one render (`None`: unlimited).
    pub fn with_fuel(source: impl Into<String>, fuel: Option<u64>) -> Result<Self, TemplateError> {
        let source: String = source.into();
        let prepared = strip_generation_tags(&source).into_owned();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_fuel(fuel);
        env.set_unknown_method_callback(python_methods);
        env.set_formatter(|out, _state, value| {
            let text = match value.as_str() {
                Some(s) => Cow::Borrowed(s),
                None => Cow::Owned(py_str(value)),
            };
            out.write_str(&text).map_err(Error::from)
        });
        env.add_filter("tojson", tojson_filter);
        env.add_filter("string", |v: Value| -> Value {
            if v.kind() == ValueKind::String {
                v
            } else {
                Value::from(py_str(&v))
            }
        });
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, prepared)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env: Arc::new(env),
            source: source.into(),
        })
    }

    /// The template text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (a list of JSON objects with `role`/`content`...).
    ///
    /// `special_tokens` holds variables such as `bos_token`/`eos_token`; the
    /// options' `kwargs` override them. Mirrors transformers: messages are
    /// rejected when empty or not objects, `null` keys are dropped, reasoning
    /// fields are aliased, and `continue_final_message` cuts the output right
    /// after the final message's content.
    pub fn render(
        &self,
        messages: &[Json],
        opts: &ChatOptions,
        special_tokens: &Map<String, Json>,
    ) -> Result<String, TemplateError> {
        if messages.is_empty() {
            return Err(TemplateError::InvalidChat(
                "cannot apply chat template to an empty conversation".into(),
            ));
        }
        if opts.continue_final_message && opts.add_generation_prompt {
            return Err(TemplateError::InvalidChat(
                "continue_final_message and add_generation_prompt are not compatible".into(),
            ));
        }
        if let Some(docs) = &opts.documents {
            if docs.iter().any(|d| !d.is_object()) {
                return Err(TemplateError::InvalidChat(
                    "documents must be a list of objects".into(),
                ));
            }
        }
        let mut chat = normalize_messages(messages)?;
        let final_message = if opts.continue_final_message {
            Some(self.tag_final_message(&mut chat)?)
        } else {
            None
        };

        let mut ctx = special_tokens.clone();
        for (k, v) in &opts.kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), Json::Array(chat));
        ctx.insert(
            "tools".into(),
            opts.tools.clone().map(Json::Array).unwrap_or(Json::Null),
        );
        ctx.insert(
            "documents".into(),
            opts.documents
                .clone()
                .map(Json::Array)
                .unwrap_or(Json::Null),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(opts.add_generation_prompt),
        );

        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        let rendered = tmpl
            .render(Value::from_serialize(&ctx))
            .map_err(|e| classify(&e))?;

        match final_message {
            Some(final_text) => cut_after_final_message(rendered, &final_text),
            None => Ok(rendered),
        }
    }

    /// Appends the continuation tag to the final message's content and returns
    /// the original content text.
    fn tag_final_message(&self, chat: &mut [Json]) -> Result<String, TemplateError> {
        let no_content = || {
            TemplateError::InvalidChat("continue_final_message is set but the final message has no \"content\" to continue".into())
        };
        let last = chat
            .last_mut()
            .and_then(Json::as_object_mut)
            .ok_or_else(no_content)?;
        if !self.source.contains("content") {
            return Err(TemplateError::InvalidChat(
                "continue_final_message is set but the chat template does not use \"content\""
                    .into(),
            ));
        }
        match last.get_mut("content") {
            Some(Json::String(text)) => {
                let original = text.clone();
                text.push_str(CONTINUE_TAG);
                Ok(original)
            }
            Some(Json::Array(blocks)) => {
                for block in blocks.iter_mut().rev() {
                    if let Some(Json::String(text)) = block.get_mut("text") {
                        let original = text.clone();
                        text.push_str(CONTINUE_TAG);
                        return Ok(original);
                    }
                }
                Err(TemplateError::InvalidChat(
                    "continue_final_message is set but the final message has no text block to continue".into(),
                ))
            }
            Some(_) => Err(TemplateError::InvalidChat(
                "continue_final_message needs the final message's content to be text".into(),
            )),
            None => Err(no_content()),
        }
    }
}

/// Cuts the render right after the final message's content, as transformers does.
fn cut_after_final_message(rendered: String, final_text: &str) -> Result<String, TemplateError> {
    let tag = CONTINUE_TAG.trim_end();
    let tag_loc = match rendered.rfind(tag) {
        Some(loc) if rendered.contains(final_text.trim()) => loc,
        _ => {
            return Err(TemplateError::InvalidChat(
                "continue_final_message is set but the final message does not appear in the rendered chat".into(),
            ))
        }
    };
    if rendered[tag_loc..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..tag_loc].to_string())
    } else {
        Ok(rendered[..tag_loc].trim_end().to_string())
    }
}

/// Drops `null` keys and aliases reasoning fields, like transformers.
fn normalize_messages(messages: &[Json]) -> Result<Vec<Json>, TemplateError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let Some(obj) = message.as_object() else {
            return Err(TemplateError::InvalidChat(format!(
                "message {i} is not an object"
            )));
        };
        let mut msg: Map<String, Json> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reasoning = REASONING_FIELDS.iter().find_map(|k| msg.get(*k).cloned());
        if let Some(reasoning) = reasoning {
            // {"thinking": r, **message, "reasoning_content": r}
            let mut aliased = Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            for (k, v) in msg {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".into(), reasoning);
            msg = aliased;
        }
        out.push(Json::Object(msg));
    }
    Ok(out)
}

/// Replaces transformers' `{% generation %}` extension tags with a no-op
/// block that keeps the same whitespace control.
fn strip_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    let mut changed = false;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        // Search past the opening "{%" so "{%}" is not taken for a whole tag.
        let Some(end) = tail[2..].find("%}").map(|i| i + 2) else {
            out.push_str(tail);
            rest = "";
            break;
        };
        let tag = &tail[..end + 2];
        let inner = &tag[2..tag.len() - 2];
        let open = inner.chars().next().filter(|c| *c == '-' || *c == '+');
        let close = inner.chars().last().filter(|c| *c == '-' || *c == '+');
        let mut word = inner;
        if open.is_some() {
            word = &word[1..];
        }
        if close.is_some() && !word.is_empty() {
            word = &word[..word.len() - 1];
        }
        let replacement = match word.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                changed = true;
                out.push_str("{%");
                out.extend(open);
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                out.extend(close);
                out.push_str("%}");
            }
            None => out.push_str(tag),
        }
        rest = &tail[end + 2..];
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(src)
    }
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let text = py_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(RaisedByTemplate(text)))
}

fn strftime_now(format: &str) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("invalid strftime format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.iter())
    )
    .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime formatting failed"))?;
    Ok(Value::from(out))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson_filter(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut slots: [Option<Value>; 4] = Default::default();
    for (slot, arg) in slots.iter_mut().zip(args.iter()) {
        *slot = Some(arg.clone());
    }
    for (slot, name) in slots.iter_mut().zip(names) {
        if kwargs.has(name) {
            if slot.is_some() {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    format!("tojson got multiple values for {name}"),
                ));
            }
            *slot = Some(kwargs.get::<Value>(name)?);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let mut opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..Default::default()
    };
    opts.indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(n.clamp(0, 1024) as usize)),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson indent must be an int or a string",
                ))
            }
        },
    };
    if let Some(sep) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = sep.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                opts.separators = Some((
                    a.as_str().unwrap_or_default().into(),
                    b.as_str().unwrap_or_default().into(),
                ));
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson separators must be two strings",
                ))
            }
        }
    }
    json_dumps(value, &opts).map(Value::from)
}

/// Python `str`/`dict`/`list` methods: minijinja-contrib's set plus a few more.
fn python_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), [arg]) = (value.as_str(), args) {
        if let Some(affix) = arg.as_str() {
            match method {
                "removeprefix" => return Ok(Value::from(s.strip_prefix(affix).unwrap_or(s))),
                "removesuffix" => return Ok(Value::from(s.strip_suffix(affix).unwrap_or(s))),
                _ => {}
            }
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let _ = write!(text, ": {s}");
        source = s.source();
    }
    text
}

fn classify(err: &Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<RaisedByTemplate>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = s.source();
    }
    match err.kind() {
        ErrorKind::OutOfFuel => TemplateError::OutOfFuel,
        ErrorKind::SyntaxError => TemplateError::Syntax(describe(err)),
        _ => TemplateError::Render(describe(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_noop_blocks() {
        let src = "a{%- generation %}b{% endgeneration -%}c{% if x %}{% endif %}";
        assert_eq!(
            strip_generation_tags(src),
            "a{%- if true %}b{% endif -%}c{% if x %}{% endif %}"
        );
        assert!(matches!(strip_generation_tags("plain"), Cow::Borrowed(_)));
        assert_eq!(
            strip_generation_tags("{%}generation{%-%}{%"),
            "{%}generation{%-%}{%"
        );
    }
}

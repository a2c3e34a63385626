//! Parsing of `tokenizer_config.json` and the companion files of a model directory.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::error::TokenizerError;

/// Names of the standard special-token attributes, in transformers' order.
pub const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Settings from `tokenizer_config.json` (merged with `special_tokens_map.json`,
/// `chat_template.jinja` and `additional_chat_templates/`), or built by hand for
/// tokenizers that do not come from a model directory (e.g. GGUF).
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    /// Named special tokens (`bos_token`, `eos_token`, ... and model-specific
    /// ones such as `image_token`), as exposed to chat templates.
    pub special_tokens: BTreeMap<String, String>,
    /// Chat templates by name; a single template is stored as `"default"`.
    pub chat_templates: BTreeMap<String, String>,
    /// `add_bos_token` as written (informational: with a tokenizer.json the
    /// post-processor decides, as in transformers).
    pub add_bos_token: Option<bool>,
    /// `add_eos_token` as written (informational, like `add_bos_token`).
    pub add_eos_token: Option<bool>,
    /// `tool_parser_type`: mlx-lm's tool-call parser name.
    pub tool_parser_type: Option<String>,
    /// `chat_template_type`: an mlx-lm Python renderer name (not rendered here).
    pub chat_template_type: Option<String>,
    /// `clean_up_tokenization_spaces` (applied on decode only for non-BPE models).
    pub clean_up_tokenization_spaces: bool,
    /// Extra end-of-sequence ids (from `generation_config.json` / `config.json`).
    pub eos_token_ids: Vec<u32>,
    /// The whole `tokenizer_config.json` object.
    pub raw: Map<String, Json>,
}

impl TokenizerConfig {
    /// Parses the text of a `tokenizer_config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, TokenizerError> {
        let raw: Json = serde_json::from_str(text).map_err(|source| TokenizerError::Json {
            what: "tokenizer_config.json".into(),
            source,
        })?;
        match raw {
            Json::Object(map) => Self::from_map(map),
            _ => Err(TokenizerError::InvalidConfig(
                "tokenizer_config.json is not an object".into(),
            )),
        }
    }

    /// Builds the config from a parsed `tokenizer_config.json` object.
    pub fn from_map(raw: Map<String, Json>) -> Result<Self, TokenizerError> {
        let mut cfg = TokenizerConfig {
            raw,
            ..Default::default()
        };
        let raw = &cfg.raw;
        for name in SPECIAL_TOKEN_NAMES {
            if let Some(tok) = raw.get(name).and_then(token_content) {
                cfg.special_tokens.insert(name.to_string(), tok);
            }
        }
        // Model-specific named tokens, e.g. {"image_token": "<image_soft_token>"}.
        if let Some(Json::Object(extra)) = raw.get("extra_special_tokens") {
            for (name, value) in extra {
                if let Some(tok) = token_content(value) {
                    cfg.special_tokens.insert(name.clone(), tok);
                }
            }
        }
        cfg.chat_templates = parse_chat_template_field(raw.get("chat_template"))?;
        cfg.add_bos_token = raw.get("add_bos_token").and_then(Json::as_bool);
        cfg.add_eos_token = raw.get("add_eos_token").and_then(Json::as_bool);
        cfg.tool_parser_type = raw
            .get("tool_parser_type")
            .and_then(Json::as_str)
            .map(str::to_string);
        cfg.chat_template_type = raw
            .get("chat_template_type")
            .and_then(Json::as_str)
            .map(str::to_string);
        cfg.clean_up_tokenization_spaces = raw
            .get("clean_up_tokenization_spaces")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        Ok(cfg)
    }

    /// Reads the configuration files of a model directory (all optional).
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let mut cfg = match read_optional(&dir.join("tokenizer_config.json"))? {
            Some(text) => Self::from_json_str(&text)?,
            None => Self::default(),
        };
        // transformers reads special_tokens_map.json only for configs without
        // `added_tokens_decoder`, and then lets it override the config.
        if !cfg.raw.contains_key("added_tokens_decoder") {
            if let Some(map) = read_json_object(&dir.join("special_tokens_map.json"))? {
                for name in SPECIAL_TOKEN_NAMES {
                    if let Some(tok) = map.get(name).and_then(token_content) {
                        cfg.special_tokens.insert(name.to_string(), tok);
                    }
                }
            }
        }
        // Template files take priority over templates in the config.
        let mut files = BTreeMap::new();
        if let Some(text) = read_optional(&dir.join("chat_template.jinja"))? {
            files.insert("default".to_string(), text);
        }
        let extra_dir = dir.join("additional_chat_templates");
        if extra_dir.is_dir() {
            let entries = std::fs::read_dir(&extra_dir).map_err(|source| TokenizerError::Io {
                path: extra_dir.clone(),
                source,
            })?;
            for entry in entries.flatten() {
                let path = entry.path();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".jinja"));
                if let Some(name) = name {
                    if let Some(text) = read_optional(&path)? {
                        files.insert(name.to_string(), text);
                    }
                }
            }
        }
        if !files.is_empty() {
            cfg.chat_templates = files;
        } else if cfg.chat_templates.is_empty() {
            // Legacy processor file: {"chat_template": "..."}; used only as a fallback.
            if let Some(map) = read_json_object(&dir.join("chat_template.json"))? {
                cfg.chat_templates = parse_chat_template_field(map.get("chat_template"))?;
            }
        }
        cfg.eos_token_ids = read_eos_ids(dir)?;
        Ok(cfg)
    }
}

/// mlx-lm's rule: `generation_config.json`'s `eos_token_id` when truthy, else `config.json`'s.
fn read_eos_ids(dir: &Path) -> Result<Vec<u32>, TokenizerError> {
    let field = |name: &str| -> Result<Option<Json>, TokenizerError> {
        // mlx-lm ignores a generation_config.json that does not parse.
        match read_json_object(&dir.join(name)) {
            Ok(map) => Ok(map.and_then(|mut m| m.remove("eos_token_id"))),
            Err(TokenizerError::Json { .. }) | Err(TokenizerError::InvalidConfig(_)) => {
                tracing::warn!("ignoring unparsable {name}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    if let Some(value) = field("generation_config.json")?.filter(is_truthy) {
        return Ok(eos_ids(&value));
    }
    Ok(field("config.json")?
        .map(|v| eos_ids(&v))
        .unwrap_or_default())
}

/// Python truthiness of a JSON value.
fn is_truthy(value: &Json) -> bool {
    match value {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// `eos_token_id` as an int or a list of ints.
fn eos_ids(value: &Json) -> Vec<u32> {
    match value {
        Json::Number(n) => n
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .into_iter()
            .collect(),
        Json::Array(items) => items
            .iter()
            .filter_map(|v| v.as_u64())
            .filter_map(|v| u32::try_from(v).ok())
            .collect(),
        _ => Vec::new(),
    }
}

/// A special token given as a string or as an AddedToken object `{"content": ...}`.
fn token_content(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map
            .get("content")
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// `chat_template`: a string, or a list of `{"name": ..., "template": ...}`.
fn parse_chat_template_field(
    value: Option<&Json>,
) -> Result<BTreeMap<String, String>, TokenizerError> {
    let mut out = BTreeMap::new();
    match value {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => {
            out.insert("default".to_string(), s.clone());
        }
        Some(Json::Array(items)) => {
            for item in items {
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => {
                        out.insert(n.to_string(), t.to_string());
                    }
                    _ => {
                        return Err(TokenizerError::InvalidConfig(
                            "chat_template list entries need string \"name\" and \"template\""
                                .into(),
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(TokenizerError::InvalidConfig(format!(
                "chat_template must be a string or a list, got {other}"
            )))
        }
    }
    Ok(out)
}

pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, TokenizerError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read_json_object(path: &Path) -> Result<Option<Map<String, Json>>, TokenizerError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let what = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
        what: what.clone(),
        source,
    })? {
        Json::Object(map) => Ok(Some(map)),
        _ => Err(TokenizerError::InvalidConfig(format!(
            "{what} is not a JSON object"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_tokens_templates_and_flags() {
        let cfg = TokenizerConfig::from_json_str(
            r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
                "chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}],
                "extra_special_tokens": {"image_token": "<img>"}, "add_bos_token": true,
                "tool_parser_type": "json_tools", "clean_up_tokenization_spaces": true}"#,
        )
        .unwrap();
        assert_eq!(
            cfg.special_tokens.get("bos_token").map(String::as_str),
            Some("<s>")
        );
        assert_eq!(
            cfg.special_tokens.get("eos_token").map(String::as_str),
            Some("</s>")
        );
        assert!(!cfg.special_tokens.contains_key("pad_token"));
        assert_eq!(
            cfg.special_tokens.get("image_token").map(String::as_str),
            Some("<img>")
        );
        assert_eq!(cfg.chat_templates.len(), 2);
        assert_eq!(cfg.chat_templates["tool_use"], "B");
        assert_eq!(cfg.add_bos_token, Some(true));
        assert_eq!(cfg.tool_parser_type.as_deref(), Some("json_tools"));
        assert!(cfg.clean_up_tokenization_spaces);
    }

    #[test]
    fn eos_ids_accept_int_or_list() {
        assert_eq!(eos_ids(&serde_json::json!(7)), vec![7]);
        assert_eq!(eos_ids(&serde_json::json!([1, 2])), vec![1, 2]);
        assert!(eos_ids(&serde_json::json!("x")).is_empty());
    }

    #[test]
    fn bad_chat_template_field_is_an_error() {
        assert!(TokenizerConfig::from_json_str(r#"{"chat_template": 5}"#).is_err());
        assert!(TokenizerConfig::from_json_str(r#"[1]"#).is_err());
    }
}

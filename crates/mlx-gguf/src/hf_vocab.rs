//! The vocabulary a GGUF export writes, read from a model directory's Hugging Face
//! tokenizer files the way mlx-lm's `HfVocab` (`mlx_lm/gguf.py`) reads them through
//! transformers' `AutoTokenizer`: the base vocabulary by id, then the added tokens whose ids
//! lie past it; every score -1000; a token is BYTE (`<0xNN>`), CONTROL (a special token)
//! or NORMAL, an added token CONTROL when special and USER_DEFINED otherwise.
//!
//! Only `tokenizer.json` is read for the vocabulary (the fast tokenizer that transformers
//! builds from it); the special tokens come from `tokenizer_config.json` (and, when it has
//! no `added_tokens_decoder`, `special_tokens_map.json`, as transformers' legacy path).
use crate::error::{io_err, GgufError, Result};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// llama.cpp's token types (`gguf.py`'s `TokenType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum TokenType {
    /// An ordinary token.
    Normal = 1,
    /// A special (control) token.
    Control = 3,
    /// An added token that is not special.
    UserDefined = 4,
    /// A byte-fallback token `<0xNN>`.
    Byte = 6,
}

/// transformers' named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`).
const SPECIAL_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A model directory's vocabulary, as `HfVocab` sees it.
#[derive(Debug, Clone)]
pub struct HfVocab {
    /// Every token in GGUF order: text, score and type.
    pub tokens: Vec<(String, f32, TokenType)>,
    /// The size of the base vocabulary (without added tokens).
    pub vocab_size_base: usize,
    /// The id of the beginning-of-sequence token, if there is one.
    pub bos_token_id: Option<u32>,
    /// The id of the end-of-sequence token, if there is one.
    pub eos_token_id: Option<u32>,
    /// The id of the unknown token, if there is one.
    pub unk_token_id: Option<u32>,
}

fn err(msg: impl Into<String>) -> GgufError {
    GgufError::Export(msg.into())
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// A token given as a string or as an `AddedToken` dict (`{"content": ...}`).
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// `re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text)`.
fn is_byte_token(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 6
        && b.starts_with(b"<0x")
        && b[5] == b'>'
        && b[3].is_ascii_hexdigit()
        && b[4].is_ascii_hexdigit()
}

fn as_id(v: &Value, what: &str) -> Result<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| err(format!("tokenizer.json: {what} has id {v}, not a token id")))
}

/// The base vocabulary of `tokenizer.json`'s model: text -> id, and its size.
fn base_vocab(model: &Value) -> Result<(Vec<(String, u32)>, usize)> {
    match model.get("vocab") {
        // BPE, WordPiece, WordLevel: a map of text -> id.
        Some(Value::Object(m)) => {
            let v = m
                .iter()
                .map(|(k, id)| Ok((k.clone(), as_id(id, &format!("token `{k}`"))?)))
                .collect::<Result<Vec<_>>>()?;
            Ok((v, m.len()))
        }
        // Unigram: a list of [piece, score], the id being the position.
        Some(Value::Array(list)) => {
            let v = list
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let text = e.get(0).and_then(Value::as_str).ok_or_else(|| {
                        err(format!(
                            "tokenizer.json: vocabulary entry {i} is not [piece, score]"
                        ))
                    })?;
                    let id = u32::try_from(i)
                        .map_err(|_| err("tokenizer.json: the vocabulary is too large"))?;
                    Ok((text.to_string(), id))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((v, list.len()))
        }
        _ => Err(err(
            "tokenizer.json: the model has no vocabulary (`model.vocab`)",
        )),
    }
}

impl HfVocab {
    /// Reads the vocabulary of the tokenizer in `dir` (`HfVocab.load`).
    pub fn load(dir: &Path) -> Result<HfVocab> {
        let tok = read_json(&dir.join("tokenizer.json"))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let mut cfg = if cfg_path.is_file() {
            read_json(&cfg_path)?
        } else {
            Value::Object(Default::default())
        };
        let map_path = dir.join("special_tokens_map.json");
        if cfg.get("added_tokens_decoder").is_none() && map_path.is_file() {
            if let (Value::Object(c), Value::Object(m)) = (&mut cfg, read_json(&map_path)?) {
                for (k, v) in m {
                    c.insert(k, v);
                }
            }
        }
        let model = tok
            .get("model")
            .ok_or_else(|| err("tokenizer.json has no `model`"))?;
        let (base, vocab_size_base) = base_vocab(model)?;

        // get_vocab(with_added_tokens=True): the base vocabulary, then the added tokens.
        let mut vocab: HashMap<String, u32> = base.into_iter().collect();
        let mut added: BTreeMap<u32, String> = BTreeMap::new();
        for t in tok
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let text = t
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| err("tokenizer.json: an added token has no `content`"))?;
            let id = as_id(
                t.get("id").unwrap_or(&Value::Null),
                &format!("added token `{text}`"),
            )?;
            vocab.insert(text.to_string(), id);
            added.insert(id, text.to_string());
        }

        // all_special_tokens: the named ones, the extra ones, other `*_token` strings.
        let mut specials: Vec<String> = Vec::new();
        let c = cfg.as_object().cloned().unwrap_or_default();
        let named = |key: &str| c.get(key).and_then(token_text);
        for key in SPECIAL_ATTRIBUTES {
            specials.extend(named(key));
        }
        for key in ["extra_special_tokens", "additional_special_tokens"] {
            match c.get(key) {
                Some(Value::Array(list)) => specials.extend(list.iter().filter_map(token_text)),
                Some(Value::Object(m)) => specials.extend(m.values().filter_map(token_text)),
                _ => {}
            }
        }
        for (k, v) in &c {
            if k.ends_with("_token") && !SPECIAL_ATTRIBUTES.contains(&k.as_str()) {
                specials.extend(v.as_str().map(str::to_string));
            }
        }
        let id_of = |text: &str| -> Result<u32> {
            vocab.get(text).copied().ok_or_else(|| {
                err(format!(
                    "special token `{text}` of tokenizer_config.json is not in tokenizer.json's vocabulary"
                ))
            })
        };
        let special_ids: HashSet<u32> = specials.iter().map(|s| id_of(s)).collect::<Result<_>>()?;
        let special_id = |key: &str| named(key).map(|t| id_of(&t)).transpose();
        let (bos_token_id, eos_token_id, unk_token_id) = (
            special_id("bos_token")?,
            special_id("eos_token")?,
            special_id("unk_token")?,
        );

        let base_size = u32::try_from(vocab_size_base)
            .map_err(|_| err("tokenizer.json: the vocabulary is too large"))?;
        let mut reverse: HashMap<u32, &str> = HashMap::new();
        for (text, id) in &vocab {
            reverse.insert(*id, text);
        }
        let kind = |id: u32, text: &str| {
            if is_byte_token(text) {
                TokenType::Byte
            } else if special_ids.contains(&id) {
                TokenType::Control
            } else {
                TokenType::Normal
            }
        };
        let mut tokens = Vec::with_capacity(vocab.len());
        for id in 0..base_size {
            let text = reverse.get(&id).ok_or_else(|| {
                err(format!("tokenizer.json: no token has id {id} (the base vocabulary has {vocab_size_base})"))
            })?;
            tokens.push((text.to_string(), -1000.0, kind(id, text)));
        }
        let special_set: HashSet<&str> = specials.iter().map(String::as_str).collect();
        for (id, text) in added.range(base_size..) {
            let t = if special_set.contains(text.as_str()) {
                kind(*id, "")
            } else {
                TokenType::UserDefined
            };
            tokens.push((text.clone(), -1000.0, t));
        }
        Ok(HfVocab {
            tokens,
            vocab_size_base,
            bos_token_id,
            eos_token_id,
            unk_token_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_are_exactly_angle_0x_two_hex_digits() {
        assert!(is_byte_token("<0x0A>"));
        assert!(is_byte_token("<0xfF>"));
        assert!(!is_byte_token("<0x0A"));
        assert!(!is_byte_token("<0x0G>"));
        assert!(!is_byte_token("<0x0AB>"));
        assert!(!is_byte_token("0x0A"));
    }
}

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
        let mut vocab: HashMap<String, u32> = base.iter().cloned().collect();
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
        // id -> text of get_vocab(): a text's id is its last (added) one; where two texts
        // share an id the added token's wins (deterministically, unlike a dict built
        // from a hash map).
        let mut reverse: HashMap<u32, &str> = HashMap::new();
        let entries = base.iter().map(|(t, id)| (t.as_str(), *id));
        for (text, id) in entries.chain(added.iter().map(|(id, t)| (t.as_str(), *id))) {
            if vocab.get(text) == Some(&id) {
                reverse.insert(id, text);
            }
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

    fn dir_with(name: &str, tok: Value, cfg: Value) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mlx-gguf-vocab-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("tokenizer.json"), tok.to_string()).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        d
    }

    #[test]
    fn unigram_vocabularies_are_ordered_by_position_and_typed() {
        let tok = serde_json::json!({
            "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["<s>", 0.0], ["<0x41>", -1.0], ["a", -2.0]]},
            "added_tokens": [
                {"id": 0, "content": "<unk>", "special": true},
                {"id": 4, "content": "<tool>", "special": false},
                {"id": 5, "content": "<eot>", "special": true}
            ]
        });
        let cfg = serde_json::json!({"bos_token": "<s>", "unk_token": {"content": "<unk>"},
            "additional_special_tokens": ["<eot>"]});
        let v = HfVocab::load(&dir_with("unigram", tok, cfg)).unwrap();
        let got: Vec<(&str, TokenType)> = v.tokens.iter().map(|t| (t.0.as_str(), t.2)).collect();
        assert_eq!(
            got,
            [
                ("<unk>", TokenType::Control),
                ("<s>", TokenType::Control),
                ("<0x41>", TokenType::Byte),
                ("a", TokenType::Normal),
                ("<tool>", TokenType::UserDefined),
                ("<eot>", TokenType::Control),
            ]
        );
        assert!(v.tokens.iter().all(|t| t.1 == -1000.0));
        assert_eq!(
            (
                v.vocab_size_base,
                v.bos_token_id,
                v.eos_token_id,
                v.unk_token_id
            ),
            (4, Some(1), None, Some(0))
        );
    }

    #[test]
    fn a_special_token_missing_from_the_vocabulary_or_an_id_gap_is_an_error() {
        let tok = serde_json::json!({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "added_tokens": []});
        let e = HfVocab::load(&dir_with(
            "missing",
            tok,
            serde_json::json!({"eos_token": "</s>"}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("special token `</s>`"), "{e}");
        let tok = serde_json::json!({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}}, "added_tokens": []});
        let e = HfVocab::load(&dir_with("gap", tok, serde_json::json!({})))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no token has id 1"), "{e}");
    }
}

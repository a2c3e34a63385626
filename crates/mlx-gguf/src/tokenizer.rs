//! Rebuilding `tokenizer.json` (Hugging Face tokenizers format), `tokenizer_config.json`
//! and the special-token ids from a GGUF's `tokenizer.*` metadata.
use crate::error::{GgufError, Result};
use crate::header::GgufHeader;
use serde_json::{json, Map, Value};
use std::collections::HashSet;

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
const TOKEN_BYTE: i64 = 6;

/// The split pattern of Llama 3 style byte-level vocabularies.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split pattern of Qwen2 style byte-level vocabularies.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer files of the model directory, and the special ids config.json repeats.
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer_json: Value,
    /// `tokenizer_config.json`.
    pub tokenizer_config: Value,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u64>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u64>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_token_id: Option<u64>,
    /// Number of tokens in the vocabulary.
    pub vocab_size: usize,
    /// `tokenizer.ggml.model` (e.g. `gpt2`).
    pub model: String,
    /// `tokenizer.ggml.pre` (e.g. `smollm`).
    pub pre: String,
}

/// GPT-2's map from bytes to printable characters (the byte-level alphabet).
pub fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut extra = 0u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{fffd}');
    }
    table
}

/// The pre-tokenizer of a byte-level vocabulary, from `tokenizer.ggml.pre`.
fn byte_level_pre_tokenizer(pre: &str) -> Result<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    Ok(match pre {
        // One digit per piece, then GPT-2's split (llama.cpp: `\p{N}` then the GPT-2 regex).
        "smollm" | "starcoder" | "refact" => json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)],
        }),
        "gpt-2" | "gpt2" | "phi-2" | "roberta-bpe" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
        | "jina-v2-code" | "gigachat" => byte_level(true),
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "falcon3" | "dbrx" | "pixtral" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
        }
        other => {
            return Err(GgufError::Tokenizer(format!(
                "pre-tokenizer `{other}` (tokenizer.ggml.pre) is not supported; supported: smollm, starcoder, \
                 refact, gpt-2, llama-bpe/llama3, qwen2"
            )))
        }
    })
}

fn added_token(id: usize, content: &str, special: bool, normalized: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": normalized,
        "special": special,
    })
}

/// The vocabulary-level facts shared by both tokenizer models.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<i64>,
    bos: Option<u64>,
    eos: Option<u64>,
    unk: Option<u64>,
    pad: Option<u64>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
}

impl<'a> Vocab<'a> {
    fn read(header: &'a GgufHeader) -> Result<Vocab<'a>> {
        let tokens = header.strings("tokenizer.ggml.tokens")?;
        let types = header
            .opt_ints("tokenizer.ggml.token_type")?
            .unwrap_or_else(|| vec![1; tokens.len()]);
        if types.len() != tokens.len() {
            return Err(GgufError::BadMetadata {
                key: "tokenizer.ggml.token_type".into(),
                problem: format!("{} types for {} tokens", types.len(), tokens.len()),
            });
        }
        let special_id = |key: &str| -> Result<Option<u64>> {
            let id = header.opt_u64(key)?;
            match id {
                Some(i) if i as usize >= tokens.len() => Err(GgufError::BadMetadata {
                    key: key.into(),
                    problem: format!("token id {i} is outside the vocabulary of {}", tokens.len()),
                }),
                _ => Ok(id),
            }
        };
        Ok(Vocab {
            bos: special_id("tokenizer.ggml.bos_token_id")?,
            eos: special_id("tokenizer.ggml.eos_token_id")?,
            unk: special_id("tokenizer.ggml.unknown_token_id")?,
            pad: special_id("tokenizer.ggml.padding_token_id")?,
            add_bos: header.opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: header.opt_bool("tokenizer.ggml.add_eos_token")?,
            tokens,
            types,
        })
    }

    fn is_special(&self, id: usize) -> bool {
        matches!(self.types[id], TOKEN_CONTROL | TOKEN_UNKNOWN)
    }

    /// `added_tokens` of tokenizer.json and `added_tokens_decoder` of tokenizer_config.json:
    /// control/unknown tokens as special, user-defined ones as plain added tokens.
    fn added(&self, user_normalized: bool) -> (Vec<Value>, Map<String, Value>) {
        let mut added = Vec::new();
        let mut decoder = Map::new();
        for (id, tok) in self.tokens.iter().enumerate() {
            let special = self.is_special(id);
            if !special && self.types[id] != TOKEN_USER_DEFINED {
                continue;
            }
            let normalized = !special && user_normalized;
            added.push(added_token(id, tok, special, normalized));
            decoder.insert(
                id.to_string(),
                json!({"content": tok, "lstrip": false, "normalized": normalized, "rstrip": false,
                       "single_word": false, "special": special}),
            );
        }
        (added, decoder)
    }

    /// A `TemplateProcessing` adding BOS/EOS as the flags ask, or `None`.
    fn template(&self, default_add_bos: bool) -> Option<Value> {
        let bos = self.bos.filter(|_| self.add_bos.unwrap_or(default_add_bos));
        let eos = self.eos.filter(|_| self.add_eos.unwrap_or(false));
        if bos.is_none() && eos.is_none() {
            return None;
        }
        let tok = |i: u64| self.tokens[i as usize];
        let seq = |id: &str, type_id: u32| {
            let mut v = Vec::new();
            if let Some(b) = bos {
                v.push(json!({"SpecialToken": {"id": tok(b), "type_id": type_id}}));
            }
            v.push(json!({"Sequence": {"id": id, "type_id": type_id}}));
            if let Some(e) = eos {
                v.push(json!({"SpecialToken": {"id": tok(e), "type_id": type_id}}));
            }
            v
        };
        let mut pair = seq("A", 0);
        pair.extend(seq("B", 1));
        let mut specials = Map::new();
        for i in bos.into_iter().chain(eos) {
            specials.insert(
                tok(i).into(),
                json!({"id": tok(i), "ids": [i], "tokens": [tok(i)]}),
            );
        }
        Some(
            json!({"type": "TemplateProcessing", "single": seq("A", 0), "pair": pair,
                    "special_tokens": specials}),
        )
    }
}

/// tokenizer.json for a byte-level BPE (`gpt2`) vocabulary.
fn byte_level_json(header: &GgufHeader, v: &Vocab<'_>, pre: &str) -> Result<Value> {
    let pre_tokenizer = byte_level_pre_tokenizer(pre)?;
    let merges = header.strings("tokenizer.ggml.merges")?;
    let table = bytes_to_unicode();
    let alphabet: HashSet<char> = table.into_iter().collect();
    let mut vocab = Map::new();
    let mut duplicates = 0usize;
    for (id, &tok) in v.tokens.iter().enumerate() {
        // User-defined tokens are stored as raw text; the BPE vocabulary spells everything
        // in the byte-level alphabet.
        let key =
            if v.types[id] == TOKEN_USER_DEFINED && !tok.chars().all(|c| alphabet.contains(&c)) {
                tok.bytes().map(|b| table[b as usize]).collect()
            } else {
                tok.to_string()
            };
        if vocab.contains_key(&key) {
            duplicates += 1;
        } else {
            vocab.insert(key, json!(id));
        }
    }
    if duplicates > 0 {
        tracing::warn!(
            duplicates,
            "the GGUF vocabulary repeats tokens; the first id of each is kept"
        );
    }
    let byte_level_post = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    let post_processor = match v.template(false) {
        Some(t) => json!({"type": "Sequence", "processors": [byte_level_post, t]}),
        None => byte_level_post,
    };
    let (added, _) = v.added(true);
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        }
    }))
}

/// The merges a SentencePiece BPE vocabulary implies, best first: every split of a normal
/// piece into two normal pieces, ordered by the merged piece's score (highest first), then
/// by the ids of the halves (what transformers' SentencePiece extractor produces).
pub fn spm_merges(tokens: &[&str], scores: &[f64], types: &[i64]) -> Vec<String> {
    let normal: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types[*i] == 1)
        .map(|(i, t)| (*t, i))
        .collect();
    let mut merges: Vec<(f64, usize, usize, String)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if types[id] != 1 {
            continue;
        }
        let mut local = Vec::new();
        for (cut, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(cut);
            if let (Some(&li), Some(&ri)) = (normal.get(l), normal.get(r)) {
                local.push((scores[id], li, ri, format!("{l} {r}")));
            }
        }
        local.sort_by_key(|m| (m.1, m.2));
        merges.extend(local);
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges.into_iter().map(|m| m.3).collect()
}

/// tokenizer.json for a SentencePiece (`llama`) vocabulary, as transformers' legacy Llama
/// tokenizer spells it (and as llama.cpp runs it: a space prefix on each text fragment).
fn sentencepiece_json(header: &GgufHeader, v: &Vocab<'_>) -> Result<Value> {
    let key = "tokenizer.ggml.scores";
    let scores: Vec<f64> = match header.get(key).and_then(|s| s.as_array()) {
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_f64().ok_or_else(|| GgufError::BadMetadata {
                    key: key.into(),
                    problem: format!("element {i} is not a number"),
                })
            })
            .collect::<Result<_>>()?,
        None => return Err(GgufError::MissingMetadata { key: key.into() }),
    };
    if scores.len() != v.tokens.len() {
        return Err(GgufError::BadMetadata {
            key: key.into(),
            problem: format!("{} scores for {} tokens", scores.len(), v.tokens.len()),
        });
    }
    let add_space_prefix = header
        .opt_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let mut vocab = Map::new();
    for (id, &tok) in v.tokens.iter().enumerate() {
        vocab.entry(tok.to_string()).or_insert(json!(id));
    }
    let merges = spm_merges(&v.tokens, &scores, &v.types);
    let byte_fallback = v.types.contains(&TOKEN_BYTE);
    let unk = v.unk.or_else(|| {
        v.types
            .iter()
            .position(|t| *t == TOKEN_UNKNOWN)
            .map(|i| i as u64)
    });
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = if add_space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
    } else {
        replace
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let (added, _) = v.added(false);
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": v.template(true),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk.map(|u| v.tokens[u as usize]),
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": byte_fallback,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        }
    }))
}

/// Builds the tokenizer files from the metadata. `context_length` becomes `model_max_length`.
pub fn build(header: &GgufHeader, context_length: Option<u64>) -> Result<TokenizerFiles> {
    let model = header.str("tokenizer.ggml.model")?.to_string();
    let pre = header
        .opt_str("tokenizer.ggml.pre")?
        .unwrap_or("default")
        .to_string();
    let v = Vocab::read(header)?;
    // `PreTrainedTokenizerFast` for both: transformers 5 builds a `LlamaTokenizer` with its
    // own (non-legacy) pre-tokenizer instead of the one in tokenizer.json.
    let (tokenizer_json, class, user_normalized, default_add_bos) = match model.as_str() {
        "gpt2" => (
            byte_level_json(header, &v, &pre)?,
            "PreTrainedTokenizerFast",
            true,
            false,
        ),
        "llama" => (
            sentencepiece_json(header, &v)?,
            "PreTrainedTokenizerFast",
            false,
            true,
        ),
        other => {
            return Err(GgufError::Tokenizer(format!(
            "tokenizer model `{other}` (tokenizer.ggml.model) is not supported; supported: `gpt2` \
                 (byte-level BPE) and `llama` (SentencePiece BPE)"
        )))
        }
    };
    let mut cfg = Map::new();
    cfg.insert(
        "add_bos_token".into(),
        json!(v.add_bos.unwrap_or(default_add_bos)),
    );
    cfg.insert("add_eos_token".into(), json!(v.add_eos.unwrap_or(false)));
    cfg.insert("add_prefix_space".into(), json!(false));
    cfg.insert(
        "added_tokens_decoder".into(),
        Value::Object(v.added(user_normalized).1),
    );
    for (name, id) in [
        ("bos_token", v.bos),
        ("eos_token", v.eos),
        ("pad_token", v.pad),
        ("unk_token", v.unk),
    ] {
        if let Some(i) = id {
            cfg.insert(name.into(), json!(v.tokens[i as usize]));
        }
    }
    if let Some(t) = header.opt_str("tokenizer.chat_template")? {
        cfg.insert("chat_template".into(), json!(t));
    }
    cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
    if model == "llama" {
        cfg.insert("legacy".into(), json!(true));
    }
    if let Some(n) = context_length {
        cfg.insert("model_max_length".into(), json!(n));
    }
    cfg.insert("tokenizer_class".into(), json!(class));
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config: Value::Object(cfg),
        bos_token_id: v.bos,
        eos_token_id: v.eos,
        pad_token_id: v.pad,
        vocab_size: v.tokens.len(),
        model,
        pre,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xa0], 'ł');
        assert_eq!(t[0xad], 'Ń');
        assert_eq!(t.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn unknown_pre_tokenizer_is_a_clear_error() {
        let e = byte_level_pre_tokenizer("mystery").unwrap_err().to_string();
        assert!(e.contains("mystery") && e.contains("smollm"), "{e}");
    }
}

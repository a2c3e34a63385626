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

fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": !special,
        "special": special,
    })
}

/// Builds the tokenizer files from the metadata. `context_length` becomes `model_max_length`.
pub fn build(header: &GgufHeader, context_length: Option<u64>) -> Result<TokenizerFiles> {
    let model = header.str("tokenizer.ggml.model")?.to_string();
    if model != "gpt2" {
        return Err(GgufError::Tokenizer(format!(
            "tokenizer model `{model}` (tokenizer.ggml.model) is not supported; only byte-level BPE (`gpt2`) is"
        )));
    }
    let pre = header
        .opt_str("tokenizer.ggml.pre")?
        .unwrap_or("default")
        .to_string();
    let pre_tokenizer = byte_level_pre_tokenizer(&pre)?;
    let tokens = header.strings("tokenizer.ggml.tokens")?;
    let merges = header.strings("tokenizer.ggml.merges")?;
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
    let bos = special_id("tokenizer.ggml.bos_token_id")?;
    let eos = special_id("tokenizer.ggml.eos_token_id")?;
    let unk = special_id("tokenizer.ggml.unknown_token_id")?;
    let pad = special_id("tokenizer.ggml.padding_token_id")?;
    let add_bos = header.opt_bool("tokenizer.ggml.add_bos_token")?;
    let add_eos = header.opt_bool("tokenizer.ggml.add_eos_token")?;

    let alphabet: HashSet<char> = bytes_to_unicode().into_iter().collect();
    let to_byte_level = |s: &str| -> String {
        let table = bytes_to_unicode();
        s.bytes().map(|b| table[b as usize]).collect()
    };
    let mut vocab = Map::new();
    let mut added = Vec::new();
    let mut decoder = Map::new();
    let mut duplicates = 0usize;
    for (id, (&tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        let special = ty == TOKEN_CONTROL || ty == TOKEN_UNKNOWN;
        let added_here = special || ty == TOKEN_USER_DEFINED;
        // User-defined tokens are stored as raw text; the BPE vocabulary spells everything
        // in the byte-level alphabet.
        let key = if added_here && !special && !tok.chars().all(|c| alphabet.contains(&c)) {
            to_byte_level(tok)
        } else {
            tok.to_string()
        };
        if vocab.contains_key(&key) {
            duplicates += 1;
        } else {
            vocab.insert(key, json!(id));
        }
        if added_here {
            let entry = added_token(id, tok, special);
            added.push(entry);
            decoder.insert(
                id.to_string(),
                json!({"content": tok, "lstrip": false, "normalized": !special, "rstrip": false,
                       "single_word": false, "special": special}),
            );
        }
    }
    if duplicates > 0 {
        tracing::warn!(
            duplicates,
            "the GGUF vocabulary repeats tokens; the first id of each is kept"
        );
    }

    let byte_level_post = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    let post_processor = match (add_bos.unwrap_or(false), bos) {
        (true, Some(b)) => {
            let bos_tok = tokens[b as usize];
            json!({"type": "Sequence", "processors": [
                byte_level_post,
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": bos_tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {bos_tok: {"id": bos_tok, "ids": [b], "tokens": [bos_tok]}}}
            ]})
        }
        _ => byte_level_post,
    };
    let tokenizer_json = json!({
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
    });

    let mut cfg = Map::new();
    if let Some(b) = add_bos {
        cfg.insert("add_bos_token".into(), json!(b));
    }
    if let Some(b) = add_eos {
        cfg.insert("add_eos_token".into(), json!(b));
    }
    cfg.insert("add_prefix_space".into(), json!(false));
    cfg.insert("added_tokens_decoder".into(), Value::Object(decoder));
    for (name, id) in [
        ("bos_token", bos),
        ("eos_token", eos),
        ("pad_token", pad),
        ("unk_token", unk),
    ] {
        if let Some(i) = id {
            cfg.insert(name.into(), json!(tokens[i as usize]));
        }
    }
    if let Some(t) = header.opt_str("tokenizer.chat_template")? {
        cfg.insert("chat_template".into(), json!(t));
    }
    cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(n) = context_length {
        cfg.insert("model_max_length".into(), json!(n));
    }
    cfg.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));

    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config: Value::Object(cfg),
        bos_token_id: bos,
        eos_token_id: eos,
        pad_token_id: pad,
        vocab_size: tokens.len(),
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

//! Loading model directories: which files win, EOS ids, named templates.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use mlx_tokenizer::{ChatOptions, DetokenizerKind, Tokenizer, TokenizerConfig, TokenizerError};
use serde_json::json;

/// A tiny word-level tokenizer.json.
fn tiny_tokenizer_json() -> String {
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<s>"), added(1, "</s>"), added(5, "<eot>")],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<s>": 0, "</s>": 1, "hello": 2, "world": 3, "<unk>": 4, "<eot>": 5},
                  "unk_token": "<unk>"}
    })
    .to_string()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("mlx-tokenizer-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> &Self {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, text).unwrap();
        self
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model_dir() -> TempDir {
    let dir = TempDir::new();
    dir.write("tokenizer.json", &tiny_tokenizer_json());
    dir
}

#[test]
fn missing_tokenizer_json_is_a_clear_error() {
    let dir = TempDir::new();
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TokenizerError::MissingTokenizerJson(_))
    ));
    dir.write("tokenizer.json", "{not json");
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TokenizerError::Json { .. })
    ));
}

#[test]
fn encode_applies_post_processor_and_decode_reverses() {
    let dir = model_dir();
    dir.write(
        "tokenizer_config.json",
        r#"{"bos_token": "<s>", "eos_token": "</s>"}"#,
    );
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.encode("hello world", true).unwrap(), vec![0, 2, 3]);
    assert_eq!(tok.encode("hello world", false).unwrap(), vec![2, 3]);
    assert_eq!(tok.encode_prompt("<s> hello").unwrap(), vec![0, 2]);
    assert_eq!(tok.decode(&[0, 2, 3], true).unwrap(), "hello world");
    assert_eq!(tok.detokenizer_kind(), DetokenizerKind::Naive);
    assert_eq!(tok.vocab_size(), 6);
}

#[test]
fn eos_ids_merge_generation_config_and_eos_token() {
    let dir = model_dir();
    dir.write("tokenizer_config.json", r#"{"eos_token": "</s>"}"#)
        .write("generation_config.json", r#"{"eos_token_id": [5, 3]}"#)
        .write("config.json", r#"{"eos_token_id": 4}"#);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let mut ids: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 3, 5]);

    // A falsy generation_config value falls back to config.json.
    dir.write("generation_config.json", r#"{"eos_token_id": 0}"#);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let mut ids: Vec<u32> = tok.eos_token_ids().iter().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 4]);
}

#[test]
fn template_files_override_config_templates() {
    let dir = model_dir();
    dir.write(
        "tokenizer_config.json",
        r#"{"chat_template": "config:{{ messages[0].content }}"}"#,
    );
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let msgs = [json!({"role": "user", "content": "x"})];
    assert_eq!(
        tok.apply_chat_template(&msgs, &ChatOptions::default())
            .unwrap(),
        "config:x"
    );

    dir.write("chat_template.jinja", "file:{{ messages[0].content }}\n");
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(
        tok.apply_chat_template(&msgs, &ChatOptions::default())
            .unwrap(),
        "file:x"
    );
    assert_eq!(
        tok.chat_template(),
        Some("file:{{ messages[0].content }}\n")
    );

    dir.write(
        "additional_chat_templates/tool_use.jinja",
        "tools:{{ tools | length }}",
    );
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.chat_template_names(), vec!["default", "tool_use"]);
    let with_tools = ChatOptions {
        tools: Some(vec![json!({"name": "a"})]),
        ..Default::default()
    };
    assert_eq!(
        tok.apply_chat_template(&msgs, &with_tools).unwrap(),
        "tools:1"
    );
    assert_eq!(
        tok.apply_chat_template(&msgs, &ChatOptions::default())
            .unwrap(),
        "file:x"
    );
    let named = ChatOptions {
        template_name: Some("nope".into()),
        ..Default::default()
    };
    assert!(matches!(
        tok.apply_chat_template(&msgs, &named),
        Err(TokenizerError::NoSuchTemplate { .. })
    ));
}

#[test]
fn legacy_chat_template_json_is_a_fallback() {
    let dir = model_dir();
    dir.write("chat_template.json", r#"{"chat_template": "legacy"}"#);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.chat_template(), Some("legacy"));
    let bare = model_dir();
    let tok = Tokenizer::from_dir(bare.path()).unwrap();
    assert!(!tok.has_chat_template());
    let msgs = [json!({"role": "user", "content": "x"})];
    assert!(matches!(
        tok.apply_chat_template(&msgs, &ChatOptions::default()),
        Err(TokenizerError::NoChatTemplate)
    ));
}

#[test]
fn named_templates_without_default_need_a_name() {
    let dir = model_dir();
    dir.write(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "rag", "template": "R"}]}"#,
    );
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let msgs = [json!({"role": "user", "content": "x"})];
    assert!(matches!(
        tok.apply_chat_template(&msgs, &ChatOptions::default()),
        Err(TokenizerError::NoSuchTemplate { .. })
    ));
    let named = ChatOptions {
        template_name: Some("rag".into()),
        ..Default::default()
    };
    assert_eq!(tok.apply_chat_template(&msgs, &named).unwrap(), "R");
}

#[test]
fn special_tokens_map_file_applies_only_without_added_tokens_decoder() {
    let dir = model_dir();
    dir.write("tokenizer_config.json", r#"{"eos_token": "</s>"}"#)
        .write(
            "special_tokens_map.json",
            r#"{"eos_token": {"content": "<eot>"}, "bos_token": "<s>"}"#,
        );
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_token(), Some("<eot>"));
    assert_eq!(tok.bos_token(), Some("<s>"));

    dir.write(
        "tokenizer_config.json",
        r#"{"eos_token": "</s>", "added_tokens_decoder": {}}"#,
    );
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_token(), Some("</s>"));
    assert_eq!(tok.bos_token(), None);
}

#[test]
fn in_memory_tokenizer_json_with_hand_built_config() {
    let mut cfg = TokenizerConfig::default();
    cfg.special_tokens
        .insert("eos_token".into(), "<eot>".into());
    cfg.chat_templates
        .insert("default".into(), "{{ eos_token }}".into());
    cfg.eos_token_ids = vec![1];
    let tok = Tokenizer::from_json_str(&tiny_tokenizer_json(), cfg).unwrap();
    assert_eq!(tok.eos_token_id(), Some(5));
    assert!(tok.eos_token_ids().contains(&1) && tok.eos_token_ids().contains(&5));
    let msgs = [json!({"role": "user", "content": "x"})];
    assert_eq!(
        tok.apply_chat_template(&msgs, &ChatOptions::default())
            .unwrap(),
        "<eot>"
    );
    assert!(Tokenizer::from_json_str("[]", TokenizerConfig::default()).is_err());
}

#[test]
fn broken_template_fails_at_render_not_at_load() {
    let dir = model_dir();
    dir.write("chat_template.jinja", "{% if %}");
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let msgs = [json!({"role": "user", "content": "x"})];
    assert!(matches!(
        tok.apply_chat_template(&msgs, &ChatOptions::default()),
        Err(TokenizerError::Template(_))
    ));
}

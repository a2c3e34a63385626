//! Dataset formats and their tokenization (mlx-lm's `create_dataset` and dataset
//! classes), and the errors bad data gets.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_eval::datasets::{load_split, read_jsonl, split_file};
use mlx_eval::{Dataset, EvalError, Features, Format};
use mlx_tokenizer::{ChatOptions, Tokenizer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn tokenizer() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../goldens/generate/tokenizer");
    Tokenizer::from_dir(dir).unwrap()
}

fn ds(rows: Vec<Value>, mask: bool) -> Result<Dataset, EvalError> {
    Dataset::new(rows, &Features::default(), mask, "test")
}

#[test]
fn the_first_row_picks_the_format() {
    let f = |row: Value| ds(vec![row], false).unwrap().format().clone();
    assert!(matches!(f(json!({"text": "a"})), Format::Text { .. }));
    assert!(matches!(f(json!({"messages": []})), Format::Chat { .. }));
    // Completions win over chat and text when a row has all of them (mlx-lm's order).
    assert!(matches!(
        f(json!({"prompt": "p", "completion": "c", "text": "t", "messages": []})),
        Format::Completions { .. }
    ));
    assert!(matches!(
        f(json!({"prompt": "p", "text": "t"})),
        Format::Text { .. }
    ));
    let custom = Features {
        text: "body".into(),
        ..Features::default()
    };
    let d = Dataset::new(vec![json!({"body": "x"})], &custom, false, "t").unwrap();
    assert_eq!(d.format(), &Format::Text { key: "body".into() });
}

#[test]
fn unusable_data_is_an_error_naming_it() {
    let e = ds(vec![], false).unwrap_err().to_string();
    assert!(e.contains("no rows"), "{e}");
    let e = ds(vec![json!({"foo": 1})], false).unwrap_err().to_string();
    assert!(
        e.contains("unsupported data format") && e.contains("foo"),
        "{e}"
    );
    let e = ds(vec![json!({"text": "a"})], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("prompt masking"), "{e}");
    let tok = tokenizer();
    let d = ds(
        vec![
            json!({"text": "a"}),
            json!({"other": 1}),
            json!({"text": 5}),
        ],
        false,
    )
    .unwrap();
    let e = d.process(1, &tok).unwrap_err().to_string();
    assert!(e.contains("row 2") && e.contains("`text`"), "{e}");
    let e = d.process(2, &tok).unwrap_err().to_string();
    assert!(e.contains("not a string"), "{e}");
    assert!(d.process(3, &tok).is_err());

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"a\"}\n\n[1, 2]\n").unwrap();
    let e = read_jsonl(&bad).unwrap_err().to_string();
    assert!(e.contains("line 3") && e.contains("object"), "{e}");
    std::fs::write(&bad, "{\"text\": \"a\"\n").unwrap();
    let e = read_jsonl(&bad).unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("not JSON"), "{e}");
    let e = split_file(dir.path(), "train").unwrap_err().to_string();
    assert!(e.contains("no train.jsonl"), "{e}");
    let e = split_file(Path::new("org/some-dataset"), "train")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a local dataset"), "{e}");
}

#[test]
fn text_rows_end_with_one_eos() {
    let tok = tokenizer();
    let eos = tok.eos_token_id().unwrap();
    let d = ds(vec![json!({"text": "hello there"})], false).unwrap();
    let (ids, offset) = d.process(0, &tok).unwrap();
    let mut want = tok.encode("hello there", true).unwrap();
    want.push(eos);
    assert_eq!((ids, offset), (want, 0));
    let eos_text = tok.eos_token().unwrap().to_string();
    let d = ds(vec![json!({"text": format!("hi{eos_text}")})], false).unwrap();
    let (ids, _) = d.process(0, &tok).unwrap();
    assert_eq!(ids.iter().filter(|&&t| t == eos).count(), 1);
    assert_eq!(ids.last(), Some(&eos));
}

#[test]
fn chat_and_completions_rows_go_through_the_template() {
    let tok = tokenizer();
    let messages = json!([
        {"role": "user", "content": "tell me"},
        {"role": "assistant", "content": "a story"},
    ]);
    let full = tok
        .apply_chat_template_ids(messages.as_array().unwrap(), &ChatOptions::default())
        .unwrap();
    let prompt = tok
        .apply_chat_template_ids(
            &messages.as_array().unwrap()[..1],
            &ChatOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(prompt.len() < full.len());
    let chat = ds(vec![json!({"messages": messages})], false).unwrap();
    assert_eq!(chat.process(0, &tok).unwrap(), (full.clone(), 0));
    let masked = ds(vec![json!({"messages": messages})], true).unwrap();
    assert_eq!(
        masked.process(0, &tok).unwrap(),
        (full.clone(), prompt.len())
    );
    let comp = ds(
        vec![json!({"prompt": "tell me", "completion": "a story"})],
        false,
    )
    .unwrap();
    assert_eq!(comp.process(0, &tok).unwrap(), (full.clone(), 0));
    let comp = ds(
        vec![json!({"prompt": "tell me", "completion": "a story"})],
        true,
    )
    .unwrap();
    assert_eq!(comp.process(0, &tok).unwrap(), (full, prompt.len()));
}

#[test]
fn a_local_dataset_is_a_directory_of_splits_or_one_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../goldens/perplexity");
    let d = load_split(&root.join("chat"), "train", &Features::default(), false).unwrap();
    assert_eq!(d.len(), 14);
    assert!(matches!(d.format(), Format::Chat { .. }));
    let file: PathBuf = root.join("text/train.jsonl");
    let d = load_split(&file, "valid", &Features::default(), false).unwrap();
    assert!(matches!(d.format(), Format::Text { .. }));
}

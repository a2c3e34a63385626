//! Datasets in mlx-lm's formats (`mlx_lm.tuner.datasets`): JSON lines whose rows are
//! `{"text": ...}`, `{"messages": [...]}` (chat, optional `tools`) or `{"prompt": ...,
//! "completion": ...}`, with the feature names configurable. A dataset's format is read
//! from its first row, like mlx-lm's `create_dataset`, and every row is tokenized the
//! way mlx-lm's dataset classes do it.
use crate::{EvalError, Result};
use mlx_tokenizer::{ChatOptions, Tokenizer};
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

/// The row keys each format reads (mlx-lm's `*_feature` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    /// Prompt of a completions row (`prompt`).
    pub prompt: String,
    /// Completion of a completions row (`completion`).
    pub completion: String,
    /// Text of a text row (`text`).
    pub text: String,
    /// Messages of a chat row (`messages`).
    pub chat: String,
}

impl Default for Features {
    fn default() -> Features {
        Features {
            prompt: "prompt".into(),
            completion: "completion".into(),
            text: "text".into(),
            chat: "messages".into(),
        }
    }
}

/// How rows turn into tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// `TextDataset`: the text encoded with special tokens, EOS appended when missing.
    Text {
        /// The row key.
        key: String,
    },
    /// `ChatDataset`: the messages rendered by the chat template and tokenized.
    Chat {
        /// The row key.
        key: String,
    },
    /// `CompletionsDataset`: a user turn and an assistant turn through the template.
    Completions {
        /// The prompt's key.
        prompt: String,
        /// The completion's key.
        completion: String,
    },
}

/// Rows of one split and their format.
#[derive(Debug, Clone)]
pub struct Dataset {
    rows: Vec<Json>,
    format: Format,
    mask_prompt: bool,
    source: String,
}

impl Dataset {
    /// mlx-lm's `create_dataset`: the format is the first that the first row fits
    /// (completions, then chat, then text). `source` names the data in errors.
    pub fn new(
        rows: Vec<Json>,
        features: &Features,
        mask_prompt: bool,
        source: &str,
    ) -> Result<Dataset> {
        let Some(first) = rows.first() else {
            return Err(EvalError::Data(format!(
                "{source}: the dataset has no rows"
            )));
        };
        let has = |k: &str| first.get(k).is_some();
        let format = if has(&features.prompt) && has(&features.completion) {
            Format::Completions {
                prompt: features.prompt.clone(),
                completion: features.completion.clone(),
            }
        } else if has(&features.chat) {
            Format::Chat {
                key: features.chat.clone(),
            }
        } else if has(&features.text) {
            if mask_prompt {
                return Err(EvalError::Data(format!(
                    "{source}: prompt masking is not supported for a text dataset"
                )));
            }
            Format::Text {
                key: features.text.clone(),
            }
        } else {
            let keys: Vec<&str> = first
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            return Err(EvalError::Data(format!(
                "{source}: unsupported data format: the first row has keys {keys:?}; rows need \
                 `{}` and `{}` (completions), `{}` (chat) or `{}` (text)",
                features.prompt, features.completion, features.chat, features.text
            )));
        };
        Ok(Dataset {
            rows,
            format,
            mask_prompt,
            source: source.to_string(),
        })
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no rows (never, for a dataset [`Dataset::new`] made).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The format read from the first row.
    pub fn format(&self) -> &Format {
        &self.format
    }

    /// Row `idx` as JSON.
    pub fn row(&self, idx: usize) -> Option<&Json> {
        self.rows.get(idx)
    }

    /// mlx-lm's `dataset.process(row)`: the row's tokens and the offset where the loss
    /// starts (the prompt's length when masking the prompt, else 0).
    pub fn process(&self, idx: usize, tok: &Tokenizer) -> Result<(Vec<u32>, usize)> {
        let row = self
            .rows
            .get(idx)
            .ok_or_else(|| EvalError::Invalid(format!("row {idx} of {} rows", self.rows.len())))?;
        let ctx = || format!("{} row {}", self.source, idx + 1);
        let field = |k: &str| {
            row.get(k)
                .ok_or_else(|| EvalError::Data(format!("{}: no `{k}`", ctx())))
        };
        let tok_err = |source| EvalError::Tokenizer {
            context: ctx(),
            source,
        };
        let tools = row
            .get("tools")
            .and_then(Json::as_array)
            .map(|t| t.to_vec());
        let template = |messages: &[Json], generation: bool| -> Result<Vec<u32>> {
            let opts = ChatOptions {
                add_generation_prompt: generation,
                tools: tools.clone(),
                ..Default::default()
            };
            tok.apply_chat_template_ids(messages, &opts)
                .map_err(tok_err)
        };
        match &self.format {
            Format::Text { key } => {
                let text = field(key)?.as_str().ok_or_else(|| {
                    EvalError::Data(format!("{}: `{key}` is not a string", ctx()))
                })?;
                let mut ids = tok.encode(text, true).map_err(tok_err)?;
                let eos = tok.eos_token_id().ok_or_else(|| {
                    EvalError::Data("the tokenizer has no EOS token to end text rows".into())
                })?;
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
                Ok((ids, 0))
            }
            Format::Chat { key } => {
                let messages = field(key)?.as_array().ok_or_else(|| {
                    EvalError::Data(format!("{}: `{key}` is not a list of messages", ctx()))
                })?;
                let ids = template(messages, false)?;
                if !self.mask_prompt || messages.is_empty() {
                    return Ok((ids, 0));
                }
                let last = &messages[messages.len() - 1];
                let generation = last.get("role").and_then(Json::as_str) == Some("assistant");
                let offset = template(&messages[..messages.len() - 1], generation)?.len();
                Ok((ids, offset))
            }
            Format::Completions { prompt, completion } => {
                let messages = [
                    json!({"role": "user", "content": field(prompt)?}),
                    json!({"role": "assistant", "content": field(completion)?}),
                ];
                let ids = template(&messages, false)?;
                let offset = if self.mask_prompt {
                    template(&messages[..1], true)?.len()
                } else {
                    0
                };
                Ok((ids, offset))
            }
        }
    }
}

/// The rows of a JSON-lines file (blank lines skipped); a bad line is an error naming
/// the file and line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Json>> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: Json = serde_json::from_str(line).map_err(|e| {
            EvalError::Data(format!("{} line {}: not JSON: {e}", path.display(), i + 1))
        })?;
        if !row.is_object() {
            return Err(EvalError::Data(format!(
                "{} line {}: a row must be a JSON object",
                path.display(),
                i + 1
            )));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Where a split's rows are: `path` itself when it is a `.jsonl` file, else
/// `path/{split}.jsonl` (mlx-lm's local dataset layout: `train`, `valid`, `test`).
pub fn split_file(path: &Path, split: &str) -> Result<PathBuf> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if path.is_dir() {
        let f = path.join(format!("{split}.jsonl"));
        if f.is_file() {
            return Ok(f);
        }
        return Err(EvalError::Data(format!(
            "{} has no {split}.jsonl (a local dataset is a directory of train.jsonl, \
             valid.jsonl and test.jsonl, or one .jsonl file)",
            path.display()
        )));
    }
    Err(EvalError::Data(format!(
        "`{}` is not a local dataset (a directory with {split}.jsonl, or a .jsonl file) \
         nor an `org/name` Hugging Face dataset id",
        path.display()
    )))
}

/// One split of a local dataset (see [`split_file`]).
pub fn load_split(
    path: &Path,
    split: &str,
    features: &Features,
    mask_prompt: bool,
) -> Result<Dataset> {
    let file = split_file(path, split)?;
    let rows = read_jsonl(&file)?;
    Dataset::new(rows, features, mask_prompt, &file.display().to_string())
}

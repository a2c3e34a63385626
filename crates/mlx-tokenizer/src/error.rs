//! Error types.

use std::path::PathBuf;

/// Errors from compiling or rendering a chat template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// The render used up its instruction budget (likely an endless loop).
    #[error("chat template ran out of fuel (too many instructions)")]
    OutOfFuel,
    /// Any other failure while rendering.
    #[error("chat template render error: {0}")]
    Render(String),
    /// The conversation or options are unusable (empty chat, bad message...).
    #[error("invalid chat input: {0}")]
    InvalidChat(String),
}

/// Errors from loading or using a [`crate::Tokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (or string) does not parse or has the wrong shape.
    #[error("invalid JSON in {what}: {source}")]
    Json {
        /// What was being parsed.
        what: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The model directory has no `tokenizer.json`.
    #[error("no tokenizer.json in {0}")]
    MissingTokenizerJson(PathBuf),
    /// The `tokenizers` library failed (bad tokenizer.json, encode/decode error).
    #[error("tokenizer error: {0}")]
    Backend(String),
    /// A config field has an unusable value.
    #[error("invalid tokenizer config: {0}")]
    InvalidConfig(String),
    /// A token string or id that is not in the vocabulary.
    #[error("'{0}' is not a token for this tokenizer")]
    UnknownToken(String),
    /// `apply_chat_template` on a tokenizer without a template.
    #[error("this tokenizer has no chat template")]
    NoChatTemplate,
    /// The requested named template does not exist, or none is the default.
    #[error("no chat template named {requested:?}; available: {available:?}")]
    NoSuchTemplate {
        /// The requested name (`None`: the default one).
        requested: Option<String>,
        /// The names the tokenizer has.
        available: Vec<String>,
    },
    /// Compiling or rendering the chat template failed.
    #[error(transparent)]
    Template(#[from] TemplateError),
}

//! Tokenizer, chat templates and streaming detokenizers for the MLX runtime,
//! with the behaviour of mlx-lm 0.32.2's `tokenizer_utils.py` and the chat
//! template handling of transformers' `apply_chat_template`.
//!
//! ```no_run
//! use mlx_tokenizer::{ChatOptions, StreamingDetokenizer, Tokenizer};
//! # fn main() -> Result<(), mlx_tokenizer::TokenizerError> {
//! let tok = Tokenizer::from_dir("/path/to/model")?;
//! let messages = vec![serde_json::json!({"role": "user", "content": "Hi"})];
//! let opts = ChatOptions { add_generation_prompt: true, ..Default::default() };
//! let prompt = tok.apply_chat_template_ids(&messages, &opts)?;
//! let mut detok = tok.detokenizer();
//! for id in prompt {
//!     detok.add_token(id);
//!     print!("{}", detok.last_segment());
//! }
//! detok.finalize();
//! print!("{}", detok.last_segment());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod config;
mod detokenizer;
mod error;
mod pyfmt;
mod template;
mod tokenizer;
mod vocab;

pub use config::{TokenizerConfig, SPECIAL_TOKEN_NAMES};
pub use detokenizer::{
    BpeDetokenizer, Detokenizer, DetokenizerKind, NaiveDetokenizer, SpmDetokenizer,
    StreamingDetokenizer,
};
pub use error::{TemplateError, TokenizerError};
pub use pyfmt::py_json_dumps;
pub use template::{ChatOptions, ChatTemplate, DEFAULT_TEMPLATE_FUEL};
pub use tokenizer::{ThinkMarkers, Tokenizer};
pub use vocab::VocabToken;

//! Model architectures and loading.
#![warn(missing_docs)]

pub mod model;

pub use model::{CacheSpec, LanguageModel};

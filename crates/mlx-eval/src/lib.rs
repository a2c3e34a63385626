//! Model evaluation (layer 5): datasets in mlx-lm's formats, perplexity
//! (`mlx_lm.perplexity`) and lm-evaluation-harness scoring (`mlx_lm.evaluate`,
//! [`scoring`]), with mlx-lm's data order and op sequence, so the same model, data and
//! seed give the same numbers bit for bit.
#![warn(missing_docs)]

pub mod datasets;
mod error;
pub mod harness;
pub mod hub_data;
pub mod nprandom;
pub mod perplexity;
pub mod scoring;

pub use datasets::{Dataset, Features, Format};
pub use error::{EvalError, Result};
pub use nprandom::RandomState;
pub use perplexity::{eval_ppl, load_data, Perplexity};

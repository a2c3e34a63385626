//! Neural-network layers over `mlx-array`, shaped like `mlx.nn` and mlx-lm's model code.
#![warn(missing_docs)]

pub mod cache;

pub use cache::{AttnMask, KvCache, KvFetch};

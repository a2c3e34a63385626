//! `qwen3_5_moe` (mlx-lm `qwen3_5_moe.py`): Qwen 3.5's text model with experts on every
//! layer, built by [`super::qwen3_5`].
pub use super::qwen3_5::build_moe as build;

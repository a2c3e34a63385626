//! Qwen3-VL, text part only, following `mlx_lm/models/qwen3_vl.py`: a Qwen3 model under
//! `language_model`, loaded as Qwen2-VL's ([`super::qwen2_vl::VlText`]).
use super::qwen2_vl::VlText;
use super::{qwen3, Architecture};
use serde_json::Value;

/// Registry entry.
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    VlText::build(config, "qwen3_vl", qwen3::build)
}

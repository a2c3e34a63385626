//! LFM2-VL (`lfm2-vl`), text part only, following `mlx_lm/models/lfm2-vl.py`: an LFM2
//! model built from `text_config` under `language_model`, whose caches it makes
//! (`make_cache`); the `vision_tower` and `multi_modal_projector` trees are dropped and
//! LFM2's own `sanitize` is not called (`qwen2_vl::Layout::Towers`).
use super::qwen2_vl::VlText;
use super::{lfm2, Architecture};
use serde_json::{Map, Value};

/// `__post_init__` sets `tie_word_embeddings` false, a key LFM2 does not read (its head
/// is always the embedding).
fn post_init(text: &mut Map<String, Value>) {
    text.insert("tie_word_embeddings".into(), false.into());
}

/// Registry entry (`model_type` and `text_config` required).
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    VlText::build_towers(config, "lfm2-vl", true, post_init, lfm2::build)
}

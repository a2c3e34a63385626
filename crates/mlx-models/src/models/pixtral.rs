//! Pixtral, text part only, following `mlx_lm/models/pixtral.py`: a Llama model built
//! from `text_config` under `language_model`, its head always untied and its head count
//! 32 unless given; the `vision_tower` and `multi_modal_projector` trees are dropped
//! (`qwen2_vl::Layout::Towers`).
use super::qwen2_vl::VlText;
use super::{llama, Architecture};
use serde_json::{Map, Value};

/// `__post_init__`: `tie_word_embeddings` set false whatever the text config says,
/// `num_attention_heads` 32 when missing.
fn post_init(text: &mut Map<String, Value>) {
    text.insert("tie_word_embeddings".into(), false.into());
    text.entry("num_attention_heads").or_insert(32.into());
}

/// Registry entry (`model_type` and `text_config` required; no `make_cache`, so every
/// layer gets a plain cache).
pub fn build(config: &Value) -> crate::Result<Box<dyn Architecture>> {
    VlText::build_towers(config, "pixtral", false, post_init, llama::build)
}

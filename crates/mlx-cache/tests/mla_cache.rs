//! Multi-head latent attention (deepseek_v3's family) keeps its compressed latent and the
//! shared rotary key part as the keys and values of a plain `KVCache`: trimming it and
//! decoding again gives the logits of the untrimmed run. Uses the committed tiny models
//! (`goldens/models/*`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{Array, Dtype};
use mlx_cache::make_prompt_cache;
use mlx_models::LanguageModel;
use std::path::PathBuf;

fn load(name: &str) -> Box<dyn LanguageModel> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models");
    mlx_models::load_model(dir.join(name))
        .expect("load model")
        .0
}

fn tokens(t: &[u32]) -> Array {
    Array::from_slice(t, &[1, t.len() as i32]).expect("tokens")
}

fn f32s(a: &Array) -> Vec<f32> {
    a.astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .expect("logits")
}

const PROMPT: [u32; 9] = [3, 14, 15, 92, 65, 35, 89, 79, 32];

#[test]
fn trimmed_latent_cache_decodes_like_the_untrimmed_one() {
    for name in [
        "deepseek_v3-small-f32",
        "kimi_k25-small-f32",
        "kimi_vl-small-f32",
        "glm4_moe_lite-small-f32",
    ] {
        let model = load(name);
        let mut straight = make_prompt_cache(&model.cache_specs(), None).expect("caches");
        model
            .forward(&tokens(&PROMPT[..6]), &mut straight)
            .expect("prefill");
        let want = model
            .forward(&tokens(&PROMPT[6..]), &mut straight)
            .expect("rest");

        let mut trimmed = make_prompt_cache(&model.cache_specs(), None).expect("caches");
        model
            .forward(&tokens(&PROMPT), &mut trimmed)
            .expect("prefill all");
        for c in trimmed.iter_mut() {
            assert!(c.is_trimmable(), "{name}: a latent cache is trimmable");
            assert_eq!(c.trim(3), 3, "{name}");
            assert_eq!(c.offset(), 6, "{name}");
        }
        let got = model
            .forward(&tokens(&PROMPT[6..]), &mut trimmed)
            .expect("again");
        assert_eq!(f32s(&got), f32s(&want), "{name}: logits after trimming");
    }
}

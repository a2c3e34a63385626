//! `TokenGenerator` refuses prompt ids outside the model's vocabulary (MLX's gather
//! would read past the embedding table) and generates from ids inside it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_engine::{GenerateOptions, TokenGenerator, TokenIterator};
use std::path::PathBuf;

fn model() -> Box<dyn mlx_models::LanguageModel> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models/llama-small-f32-tied");
    mlx_models::load_model(dir).expect("load model").0
}

#[test]
fn an_id_past_the_vocabulary_is_refused_by_name() {
    let model = model();
    let vocab = model.vocab_size() as u32;
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None).expect("caches");
    let prompt = [1, 2, vocab, 3];
    let err = match TokenGenerator::new(
        model.as_ref(),
        &prompt,
        &mut caches,
        GenerateOptions::default(),
    ) {
        Ok(_) => panic!("an id of {vocab} in a vocabulary of {vocab} was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!(
            "prompt token 2 is id {vocab}, outside the model's vocabulary of {vocab}"
        )),
        "{err}"
    );
}

#[test]
fn the_last_id_of_the_vocabulary_generates() {
    let model = model();
    let vocab = model.vocab_size() as u32;
    let mut caches = mlx_cache::make_prompt_cache(&model.cache_specs(), None).expect("caches");
    let opts = GenerateOptions {
        max_tokens: 2,
        ..GenerateOptions::default()
    };
    let mut gen =
        TokenGenerator::new(model.as_ref(), &[1, vocab - 1], &mut caches, opts).expect("generator");
    let (tok, _) = gen.next_token().expect("step").expect("a token");
    assert!(tok < vocab);
}

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The eager feed of speculative decoding (`MLX_DRAFT_EAGER_FEED`): a round's last draft
//! fed to the draft model right behind the verification instead of with the next
//! round's first draft step. On the CPU each row's products have the same bits however
//! many rows a product has, so the tokens are exactly those of mlx-lm's way (and of
//! plain greedy decoding), with a draft that agrees with the target every round (the
//! target itself) and one that does not (a noisy copy); after the last token, or when
//! the consumer stops early, both models' caches hold what mlx-lm's would.
use common::{model, noisy_copy};
use mlx_engine::{DraftSource, GenerateOptions, SpeculativeGenerator, TokenIterator};
use mlx_models::LanguageModel;

#[allow(dead_code)] // the batch tests' helpers
mod common;

const TARGET: &str = "llama-small-f32";
const PROMPT: &[u32] = &[3, 4, 5, 6, 7, 8, 9, 10, 11];

/// `take` tokens of greedy speculative decoding under `eager` (the variable's value),
/// the generator dropped then; the tokens, the stats' (accepted, drafted) and the
/// caches' offsets (the target's, then the draft's).
fn run(
    target: &dyn LanguageModel,
    draft: &dyn LanguageModel,
    eager: &str,
    max: i64,
    take: usize,
) -> (Vec<u32>, (u64, u64), Vec<i32>) {
    std::env::set_var("MLX_DRAFT_EAGER_FEED", eager);
    let mut caches = mlx_cache::make_prompt_cache(&target.cache_specs(), None).unwrap();
    caches.extend(mlx_cache::make_prompt_cache(&draft.cache_specs(), None).unwrap());
    let opts = GenerateOptions {
        max_tokens: max,
        ..GenerateOptions::default()
    };
    let (tokens, stats) = {
        let mut gen = SpeculativeGenerator::new(
            target,
            DraftSource::Model(draft),
            PROMPT,
            &mut caches,
            4,
            opts,
        )
        .unwrap();
        let mut tokens = Vec::new();
        while tokens.len() < take {
            match gen.next_token().unwrap() {
                Some((t, _)) => tokens.push(t),
                None => break,
            }
        }
        let s = gen.stats().clone();
        (tokens, (s.accepted, s.drafted))
    };
    let offsets = caches.iter().map(|c| c.offset()).collect();
    (tokens, stats, offsets)
}

#[test]
fn eager_feed_gives_mlx_lms_tokens_and_caches() {
    let target = model(TARGET);
    let (noisy, _dir) = noisy_copy(TARGET, 0.05);
    let same = model(TARGET);
    for (name, draft) in [("itself", &same), ("noisy copy", &noisy)] {
        for (max, take) in [(23, usize::MAX), (23, 7), (21, usize::MAX)] {
            let lazy = run(target.as_ref(), draft.as_ref(), "0", max, take);
            let eager = run(target.as_ref(), draft.as_ref(), "1", max, take);
            assert_eq!(eager, lazy, "draft {name}, max {max}, take {take}");
            assert!(!lazy.0.is_empty());
        }
    }
    // The self-draft accepts every draft; the noisy copy not all of them (so both of
    // the eager feed's trims were taken).
    let (_, (acc, drafted), _) = run(target.as_ref(), same.as_ref(), "1", 23, usize::MAX);
    assert_eq!(acc, drafted);
    let (_, (acc, drafted), _) = run(target.as_ref(), noisy.as_ref(), "1", 23, usize::MAX);
    assert!(
        acc < drafted && acc > 0,
        "noisy draft accepted {acc} of {drafted}"
    );
}

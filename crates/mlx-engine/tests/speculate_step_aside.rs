#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The default acceptance floor of greedy speculative decoding with a draft model
//! (`GREEDY_MIN_ACCEPTANCE`, not in mlx-lm): a draft that is almost never accepted is
//! dropped after `ACCEPTANCE_WINDOW` rounds and the rest decodes plainly, giving the
//! same greedy tokens; sampled decoding, an explicit 0 and a useful draft keep
//! speculating to the end, as mlx-lm does.
use common::{model, noisy_copy};
use mlx_engine::speculative::{SpeculativeStats, ACCEPTANCE_WINDOW};
use mlx_engine::{DraftSource, GenerateOptions, SpeculativeGenerator, TokenIterator};
use mlx_models::LanguageModel;
use mlx_sample::{make_sampler, SamplerParams};

#[allow(dead_code)] // the batch tests' helpers
mod common;

const TARGET: &str = "llama-small-f32";
const PROMPT: &[u32] = &[3, 4, 5, 6, 7, 8, 9, 10, 11];
const MAX: i64 = 60;

/// `MAX` tokens with `draft` at k = 3: greedy unless `temp` > 0 (seeded), the minimum
/// acceptance `min` where given.
fn run(
    target: &dyn LanguageModel,
    draft: &dyn LanguageModel,
    temp: f64,
    min: Option<f64>,
) -> (Vec<u32>, SpeculativeStats) {
    mlx_array::random::seed(11).unwrap();
    let mut caches = mlx_cache::make_prompt_cache(&target.cache_specs(), None).unwrap();
    caches.extend(mlx_cache::make_prompt_cache(&draft.cache_specs(), None).unwrap());
    let params = SamplerParams {
        temp,
        ..SamplerParams::default()
    };
    let opts = GenerateOptions {
        max_tokens: MAX,
        sampler: Some(make_sampler(&params).unwrap()),
        ..GenerateOptions::default()
    };
    let mut gen = SpeculativeGenerator::new(
        target,
        DraftSource::Model(draft),
        PROMPT,
        &mut caches,
        3,
        opts,
    )
    .unwrap()
    .with_min_acceptance_if(min)
    .unwrap();
    let mut tokens = Vec::new();
    while let Some((t, _)) = gen.next_token().unwrap() {
        tokens.push(t);
    }
    let stats = gen.stats().clone();
    (tokens, stats)
}

#[test]
fn a_useless_draft_is_dropped_by_default_for_greedy_decoding_only() {
    let target = model(TARGET);
    // Weights drowned in noise: (almost) nothing accepted.
    let (useless, _d1) = noisy_copy(TARGET, 2.0);
    let (default, stats) = run(target.as_ref(), useless.as_ref(), 0.0, None);
    assert!(stats.stepped_aside, "{stats:?}");
    assert_eq!(stats.rounds, ACCEPTANCE_WINDOW as u64, "{stats:?}");
    assert!(stats.fallback.is_some());
    // The same tokens as speculating to the end (mlx-lm's way, 0).
    let (never, all) = run(target.as_ref(), useless.as_ref(), 0.0, Some(0.0));
    assert!(!all.stepped_aside && all.rounds > ACCEPTANCE_WINDOW as u64);
    assert_eq!(default, never);
    assert_eq!(default.len(), MAX as usize);
    // Sampled decoding keeps mlx-lm's behaviour.
    let (_, sampled) = run(target.as_ref(), useless.as_ref(), 0.8, None);
    assert!(!sampled.stepped_aside && sampled.rounds > ACCEPTANCE_WINDOW as u64);
    // A draft that agrees with the target is kept.
    let same = model(TARGET);
    let (_, kept) = run(target.as_ref(), same.as_ref(), 0.0, None);
    assert!(
        !kept.stepped_aside && kept.accepted == kept.drafted,
        "{kept:?}"
    );
}

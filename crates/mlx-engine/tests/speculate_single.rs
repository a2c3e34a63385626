#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! The single speculative generator's own ways (not in mlx-lm), on the CPU:
//!
//! - the eager feed (`MLX_DRAFT_EAGER_FEED`): a round's last draft fed to the draft model
//!   right behind the verification instead of with the next round's first draft step.
//!   On the CPU each row's products have the same bits however many rows a product has,
//!   so the tokens are exactly those of mlx-lm's way (and of plain greedy decoding), with
//!   a draft that agrees with the target every round (the target itself) and one that
//!   does not (a noisy copy); after the last token, or when the consumer stops early,
//!   both models' caches hold what mlx-lm's would;
//! - the pipelined rounds (`MLX_DRAFT_PIPELINE=1`): a round that feeds eagerly also queues
//!   the next round's drafts behind its verification, from the draft's own guess of the
//!   target's token; used when the guess was right, trimmed otherwise: the same tokens,
//!   counts and caches as without, with every kind of draft and every way of stopping;
//! - the default acceptance floor of greedy decoding with a draft model
//!   (`GREEDY_MIN_ACCEPTANCE`): a draft that is almost never accepted is dropped after
//!   `ACCEPTANCE_WINDOW` rounds and the rest decodes plainly, giving the same greedy
//!   tokens; sampled decoding, an explicit 0 and a useful draft keep speculating to the
//!   end, as mlx-lm does.
use common::{model, noisy_copy};
use mlx_engine::speculative::{SpeculativeStats, ACCEPTANCE_WINDOW};
use mlx_engine::{DraftSource, GenerateOptions, SpeculativeGenerator, TokenIterator};
use mlx_models::LanguageModel;
use mlx_sample::{make_sampler, SamplerParams};

#[allow(dead_code)] // the batch tests' helpers
mod common;

const TARGET: &str = "llama-small-f32";
const PROMPT: &[u32] = &[3, 4, 5, 6, 7, 8, 9, 10, 11];

/// One generation's settings.
struct Run {
    k: i32,
    max: i64,
    /// Tokens read before the generator is dropped.
    take: usize,
    /// Greedy at 0, else seeded sampling.
    temp: f64,
    min_acceptance: Option<f64>,
}

/// The tokens, the stats and the caches' offsets (the target's, then the draft's) of
/// `run` with `draft`.
fn run(
    target: &dyn LanguageModel,
    draft: &dyn LanguageModel,
    r: &Run,
) -> (Vec<u32>, SpeculativeStats, Vec<i32>) {
    mlx_array::random::seed(11).unwrap();
    let mut caches = mlx_cache::make_prompt_cache(&target.cache_specs(), None).unwrap();
    caches.extend(mlx_cache::make_prompt_cache(&draft.cache_specs(), None).unwrap());
    let params = SamplerParams {
        temp: r.temp,
        ..SamplerParams::default()
    };
    let opts = GenerateOptions {
        max_tokens: r.max,
        sampler: Some(make_sampler(&params).unwrap()),
        ..GenerateOptions::default()
    };
    let (tokens, stats) = {
        let source = DraftSource::Model(draft);
        let mut gen = SpeculativeGenerator::new(target, source, PROMPT, &mut caches, r.k, opts)
            .unwrap()
            .with_min_acceptance_if(r.min_acceptance)
            .unwrap();
        let mut tokens = Vec::new();
        while tokens.len() < r.take {
            match gen.next_token().unwrap() {
                Some((t, _)) => tokens.push(t),
                None => break,
            }
        }
        (tokens, gen.stats().clone())
    };
    let offsets = caches.iter().map(|c| c.offset()).collect();
    (tokens, stats, offsets)
}

#[test]
fn eager_feed_gives_mlx_lms_tokens_and_caches() {
    let target = model(TARGET);
    let (noisy, _dir) = noisy_copy(TARGET, 0.05);
    let same = model(TARGET);
    let with = |eager: &str, draft: &dyn LanguageModel, max: i64, take: usize| {
        std::env::set_var("MLX_DRAFT_EAGER_FEED", eager);
        let r = Run {
            k: 4,
            max,
            take,
            temp: 0.0,
            min_acceptance: Some(0.0),
        };
        run(target.as_ref(), draft, &r)
    };
    for (name, draft) in [("itself", &same), ("noisy copy", &noisy)] {
        for (max, take) in [(23, usize::MAX), (23, 7), (21, usize::MAX)] {
            let lazy = with("0", draft.as_ref(), max, take);
            let eager = with("1", draft.as_ref(), max, take);
            assert_eq!(
                (&eager.0, &eager.2, eager.1.accepted, eager.1.drafted),
                (&lazy.0, &lazy.2, lazy.1.accepted, lazy.1.drafted),
                "draft {name}, max {max}, take {take}"
            );
            assert!(!lazy.0.is_empty());
        }
    }
    // The self-draft accepts every draft; the noisy copy not all of them (so both of
    // the eager feed's trims were taken).
    let (_, s, _) = with("1", same.as_ref(), 23, usize::MAX);
    assert_eq!(s.accepted, s.drafted);
    let (_, s, _) = with("1", noisy.as_ref(), 23, usize::MAX);
    assert!(s.accepted < s.drafted && s.accepted > 0, "{s:?}");
}

#[test]
fn a_useless_draft_is_dropped_by_default_for_greedy_decoding_only() {
    let target = model(TARGET);
    // Weights drowned in noise: (almost) nothing accepted.
    let (useless, _d1) = noisy_copy(TARGET, 2.0);
    let r = |temp: f64, min_acceptance: Option<f64>| Run {
        k: 3,
        max: 60,
        take: usize::MAX,
        temp,
        min_acceptance,
    };
    let (default, stats, _) = run(target.as_ref(), useless.as_ref(), &r(0.0, None));
    assert!(stats.stepped_aside, "{stats:?}");
    assert_eq!(stats.rounds, ACCEPTANCE_WINDOW as u64, "{stats:?}");
    assert!(stats.fallback.is_some());
    // The same tokens as speculating to the end (mlx-lm's way, 0).
    let (never, all, _) = run(target.as_ref(), useless.as_ref(), &r(0.0, Some(0.0)));
    assert!(!all.stepped_aside && all.rounds > ACCEPTANCE_WINDOW as u64);
    assert_eq!(default, never);
    assert_eq!(default.len(), 60);
    // Sampled decoding keeps mlx-lm's behaviour.
    let (_, sampled, _) = run(target.as_ref(), useless.as_ref(), &r(0.8, None));
    assert!(!sampled.stepped_aside && sampled.rounds > ACCEPTANCE_WINDOW as u64);
    // A draft that agrees with the target is kept.
    let same = model(TARGET);
    let (_, kept, _) = run(target.as_ref(), same.as_ref(), &r(0.0, None));
    assert!(
        !kept.stepped_aside && kept.accepted == kept.drafted,
        "{kept:?}"
    );
}

#[test]
fn pipelined_rounds_give_the_same_tokens_and_caches() {
    let target = model(TARGET);
    let (noisy, _d1) = noisy_copy(TARGET, 0.05);
    let (useless, _d2) = noisy_copy(TARGET, 2.0);
    // Often right for a draft or two, often wrong about the token after them: rounds that
    // accept every draft whose guess is wrong.
    let (fair, _d3) = noisy_copy(TARGET, 0.3);
    let same = model(TARGET);
    std::env::set_var("MLX_DRAFT_EAGER_FEED", "1");
    let with = |pipeline: &str, draft: &dyn LanguageModel, r: &Run| {
        std::env::set_var("MLX_DRAFT_PIPELINE", pipeline);
        run(target.as_ref(), draft, r)
    };
    let mut used = 0;
    let drafts = [
        ("itself", &same),
        ("noisy copy", &noisy),
        ("fair copy", &fair),
        ("useless", &useless),
    ];
    for (name, draft) in drafts {
        for (k, max, take) in [
            (4, 23, usize::MAX),
            (4, 23, 7),
            (4, 21, usize::MAX),
            (3, 30, 12),
            (1, 40, usize::MAX),
            (2, 40, usize::MAX),
        ] {
            for min_acceptance in [Some(0.0), None] {
                let r = Run {
                    k,
                    max,
                    take,
                    temp: 0.0,
                    min_acceptance,
                };
                let off = with("0", draft.as_ref(), &r);
                let on = with("1", draft.as_ref(), &r);
                let what =
                    format!("draft {name}, k {k}, max {max}, take {take}, {min_acceptance:?}");
                assert_eq!(on.0, off.0, "tokens: {what}");
                assert_eq!(on.2, off.2, "caches: {what}");
                let counts =
                    |s: &SpeculativeStats| (s.drafted, s.accepted, s.rounds, s.stepped_aside);
                assert_eq!(counts(&on.1), counts(&off.1), "{what}");
                assert_eq!(off.1.pipelined, 0);
                assert!(!off.0.is_empty());
                used += on.1.pipelined;
                if name == "itself" && take == usize::MAX {
                    // Every round after the first starts from the round before's guess.
                    assert_eq!(on.1.pipelined, on.1.rounds - 1, "{what}: {:?}", on.1);
                }
            }
        }
    }
    assert!(used > 0);
    // Sampled decoding does not pipeline (its draft would draw random numbers).
    std::env::set_var("MLX_DRAFT_PIPELINE", "1");
    let r = Run {
        k: 4,
        max: 23,
        take: usize::MAX,
        temp: 0.8,
        min_acceptance: Some(0.0),
    };
    let (_, s, _) = run(target.as_ref(), same.as_ref(), &r);
    assert_eq!(s.pipelined, 0, "{s:?}");
}

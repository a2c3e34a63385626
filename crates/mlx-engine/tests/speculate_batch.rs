#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Speculative decoding inside continuous batching: greedy rows served together in a
//! speculating batch (a draft model of another shape, or prompt lookup against a
//! prediction), next to plain rows, give exactly the tokens of the same requests
//! served alone without speculation; with the model itself as the draft every round
//! is accepted in full; each row keeps its own acceptance, so batched rows are drafted
//! and accept exactly as alone, with the last drafts fed eagerly too
//! (`MLX_DRAFT_EAGER_FEED=1`); rows starting from the draft model's pooled acceptance
//! (the default; `MLX_DRAFT_POOLED_ACCEPTANCE=0` from the fixed prior) answer as alone.
use common::{model, opts, read, serve, Got};
use mlx_engine::batch::{
    DraftFrom, DraftWidth, Engine, EngineMetrics, GenerationRequest, Speculate,
};
use std::path::PathBuf;
use std::sync::Arc;

mod common;

const TARGET: &str = "llama-small-f32";
const DRAFT: &str = "llama-small-f32-hd32";

const PROMPTS: [&[u32]; 4] = [
    &[3, 4, 5, 6, 7, 8, 9, 10, 11],
    &[11, 12],
    &[20, 21, 22, 23, 24],
    &[40, 41, 42, 43, 44, 45, 46],
];
const MAX: [usize; 4] = [24, 17, 30, 9];

/// Each prompt served alone (one request at a time) by a plain engine.
fn alone() -> Vec<Vec<u32>> {
    alone_to(&MAX)
}

/// The first `lens.len()` prompts served alone by a plain engine, `lens[i]` tokens each.
fn alone_to(lens: &[usize]) -> Vec<Vec<u32>> {
    let engine =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    PROMPTS
        .iter()
        .zip(lens)
        .map(|(p, &n)| {
            serve(&engine, vec![GenerationRequest::new(p.to_vec(), n)])
                .remove(0)
                .tokens
        })
        .collect()
}

/// An engine on the target whose prediction batches verify drafts by `width`.
fn predicting(width: DraftWidth, metrics: Arc<EngineMetrics>) -> Engine {
    let o = mlx_engine::batch::EngineOptions {
        prediction_drafts: width,
        ..opts()
    };
    Engine::start(model(TARGET), o, metrics).expect("engine")
}

/// An engine on the target with the target itself as its draft model, each step's width
/// from its step times (the default).
fn self_drafting() -> Engine {
    let o = mlx_engine::batch::EngineOptions {
        model_drafts: DraftWidth::Paying,
        ..opts()
    };
    Engine::start_with_draft(
        model(TARGET),
        Some(model(TARGET)),
        o,
        Arc::new(EngineMetrics::default()),
    )
    .expect("engine")
}

fn speculating(i: usize, from: DraftFrom, k: usize) -> GenerationRequest {
    speculating_to(i, from, k, MAX[i])
}

/// Prompt `i` for `n` tokens, `k` drafts a round from `from`.
fn speculating_to(i: usize, from: DraftFrom, k: usize, n: usize) -> GenerationRequest {
    GenerationRequest {
        speculate: Some(Speculate {
            from,
            num_draft_tokens: k,
        }),
        ..GenerationRequest::new(PROMPTS[i].to_vec(), n)
    }
}

#[test]
fn greedy_rows_in_a_speculating_batch_give_the_tokens_they_give_alone() {
    let want = alone();
    let metrics = Arc::new(EngineMetrics::default());
    let engine =
        Engine::start_with_draft(model(TARGET), Some(model(DRAFT)), opts(), metrics.clone())
            .expect("engine");
    for ks in [[1, 3, 7, 2], [3, 3, 3, 3]] {
        let mut reqs: Vec<GenerationRequest> = (0..3)
            .map(|i| speculating(i, DraftFrom::DraftModel, ks[i]))
            .collect();
        // A plain row decodes next to them in its own batch.
        reqs.push(GenerationRequest::new(PROMPTS[3].to_vec(), MAX[3]));
        let got = serve(&engine, reqs);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.tokens, want[i], "row {i}, draft tokens {ks:?}");
        }
        assert_eq!(got[3].drafted, 0, "the plain row speculated");
        assert!(got[..3].iter().all(|g| g.drafted > 0), "{got:?}");
    }
    assert!(metrics.spec_steps.get() > 0);
    assert!(metrics.spec_drafted.get() >= metrics.spec_accepted.get());
    // Several rounds of streams, some joining while others speculate.
    let reqs: Vec<GenerationRequest> = (0..12)
        .map(|j| speculating(j % 3, DraftFrom::DraftModel, 1 + j % 4))
        .collect();
    for (j, g) in serve(&engine, reqs).iter().enumerate() {
        assert_eq!(g.tokens, want[j % 3], "stream {j}");
    }
}

/// An engine on the target with `draft` as its draft model.
fn with_draft(draft: Box<dyn mlx_models::LanguageModel>) -> Engine {
    Engine::start_with_draft(
        model(TARGET),
        Some(draft),
        opts(),
        Arc::new(EngineMetrics::default()),
    )
    .expect("engine")
}

/// Three rows of 17 tokens, 3 drafts a round from `engine`'s draft model (the target
/// itself): each gives its plain tokens with every round accepted in full.
fn check_every_round_accepted(engine: &Engine, want: &[Vec<u32>]) {
    // Equal lengths, so that no row's budget caps the drafts of the round.
    let reqs = (0..3)
        .map(|i| GenerationRequest {
            max_tokens: 17,
            ..speculating(i, DraftFrom::DraftModel, 3)
        })
        .collect();
    for (i, g) in serve(engine, reqs).iter().enumerate() {
        assert_eq!(g.tokens, want[i][..17], "row {i}");
        // Four rounds of 3 drafts + 1, then one token without drafts. (Rows that joined
        // at different steps may draft more than the batch keeps near their ends.)
        assert_eq!(g.from_draft, 12, "row {i}: {g:?}");
        assert!(g.drafted >= g.from_draft, "row {i}: {g:?}");
    }
}

/// Three rows drafted by `engine`'s draft model (a noisy copy: rows accept different
/// numbers of drafts each round), served alone and then together next to a plain row:
/// each keeps its own acceptance (the target and the draft caches roll each row's
/// rejected positions away), so every row gives its plain tokens and is drafted and
/// accepts exactly as alone. Returns the rows served alone.
fn check_rows_accept_as_alone(engine: &Engine, want: &[Vec<u32>]) -> Vec<Got> {
    let ks = [3, 5, 2];
    let solo: Vec<Got> = (0..3)
        .map(|i| serve(engine, vec![speculating(i, DraftFrom::DraftModel, ks[i])]).remove(0))
        .collect();
    let mut reqs: Vec<GenerationRequest> = (0..3)
        .map(|i| speculating(i, DraftFrom::DraftModel, ks[i]))
        .collect();
    reqs.push(GenerationRequest::new(PROMPTS[3].to_vec(), MAX[3]));
    let got = serve(engine, reqs);
    for i in 0..3 {
        assert_eq!(solo[i].tokens, want[i], "row {i} alone");
        assert_eq!(got[i].tokens, want[i], "row {i}");
        assert_eq!(
            (got[i].from_draft, got[i].drafted),
            (solo[i].from_draft, solo[i].drafted),
            "row {i}: batched {:?}, alone {:?}",
            got[i],
            solo[i]
        );
    }
    assert_eq!(got[3].tokens, want[3]);
    solo
}

#[test]
fn the_model_as_its_own_draft_has_every_round_accepted_in_full() {
    check_every_round_accepted(&with_draft(model(TARGET)), &alone());
}

#[test]
fn each_draft_model_row_keeps_its_own_acceptance() {
    let want = alone();
    // Noise of 5% of each weight's RMS: about half the drafts are accepted.
    let (draft, _files) = common::noisy_copy(TARGET, 0.05);
    let solo = check_rows_accept_as_alone(&with_draft(draft), &want);
    // The rows do accept different numbers of drafts (else nothing was rolled).
    let rates: Vec<usize> = solo.iter().map(|g| g.from_draft).collect();
    assert!(rates.iter().any(|&r| r != rates[0]), "{solo:?}");
    assert!(rates.iter().any(|&r| r > 0), "{solo:?}");

    // A sampled row (temperature 1: its drafts are mostly rejected) next to greedy
    // rows that are their own draft: the greedy rows still accept every draft.
    let engine = with_draft(model(TARGET));
    let mut reqs: Vec<GenerationRequest> = (0..3)
        .map(|i| GenerationRequest {
            max_tokens: 17,
            ..speculating(i, DraftFrom::DraftModel, 3)
        })
        .collect();
    reqs[1].sampling = mlx_engine::Sampling {
        params: mlx_sample::SamplerParams {
            temp: 1.0,
            ..Default::default()
        },
        seed: Some(11),
    };
    let got = serve(&engine, reqs);
    assert!(got[1].from_draft < got[1].drafted, "{:?}", got[1]);
    for i in [0, 2] {
        assert_eq!(got[i].tokens, want[i][..17], "row {i}");
        assert_eq!(got[i].from_draft, 12, "row {i}: {:?}", got[i]);
    }
}

#[test]
fn rows_fed_their_last_draft_eagerly_keep_their_tokens_and_acceptance() {
    // `MLX_DRAFT_EAGER_FEED=1` (each test runs in its own process; read when the engine
    // starts): every round feeds each row's last draft to the draft model right behind
    // the verification, and the draft caches keep what each row accepted of it.
    // With the model as its own draft every draft is accepted: no row lags, ever. With
    // a noisy copy the fed last drafts a row rejected are rolled away with the rest.
    std::env::set_var("MLX_DRAFT_EAGER_FEED", "1");
    check_self_and_noisy_drafts();
}

/// With the model as its own draft every round is accepted in full; with a noisy copy
/// the rows give their plain tokens, are drafted and accept as alone, some drafts
/// accepted and some rejected.
fn check_self_and_noisy_drafts() {
    let want = alone();
    check_every_round_accepted(&with_draft(model(TARGET)), &want);
    let (draft, _files) = common::noisy_copy(TARGET, 0.05);
    let solo = check_rows_accept_as_alone(&with_draft(draft), &want);
    assert!(solo.iter().any(|g| g.from_draft > 0), "{solo:?}");
    assert!(solo.iter().any(|g| g.from_draft < g.drafted), "{solo:?}");
}

/// `MLX_DRAFTS_ON_DEVICE=1` (read once per process): the draft model's drafts go into
/// the verification's input on the device and are read back with its tokens.
#[test]
fn drafts_kept_on_the_device_give_the_tokens_and_acceptance_of_read_ones() {
    std::env::set_var("MLX_DRAFTS_ON_DEVICE", "1");
    check_self_and_noisy_drafts();
}

#[test]
fn drafts_kept_on_the_device_and_fed_eagerly_give_the_same_tokens_and_acceptance() {
    // The eager feed takes each row's last draft from the device array too.
    std::env::set_var("MLX_DRAFTS_ON_DEVICE", "1");
    std::env::set_var("MLX_DRAFT_EAGER_FEED", "1");
    check_self_and_noisy_drafts();
}

#[test]
fn predicted_outputs_are_verified_and_the_right_prediction_is_accepted() {
    let want = alone();
    // Every draft verified: the default width follows the measured step times, which a
    // loaded machine can make leave drafts out (the same tokens either way).
    let engine = predicting(DraftWidth::All, Arc::new(EngineMetrics::default()));
    // Row 0 predicts its exact output, row 1 a wrong one, row 2 half of its own.
    let reqs = vec![
        speculating(0, DraftFrom::Prediction(want[0].clone()), 5),
        speculating(1, DraftFrom::Prediction(vec![7; 20]), 5),
        speculating(2, DraftFrom::Prediction(want[2][..15].to_vec()), 4),
        GenerationRequest::new(PROMPTS[3].to_vec(), MAX[3]),
    ];
    let got = serve(&engine, reqs);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
    }
    // Each row keeps its own acceptance: the wrong prediction next to it does not
    // hold the right one back.
    assert!(got[0].from_draft >= MAX[0] / 2, "{:?}", got[0]);
    assert!(got[0].from_draft <= got[0].drafted);
    assert_eq!(got[1].from_draft, 0, "{:?}", got[1]);
    assert!(got[2].from_draft > 0, "{:?}", got[2]);
    assert_eq!(got[3].drafted, 0);
}

#[test]
fn predictions_under_the_default_width_answer_as_without_them() {
    // The default: each step verifies the drafts its measured times say pay (any number,
    // none included); whatever it picks, every row answers as alone.
    let want = alone();
    let metrics = Arc::new(EngineMetrics::default());
    let engine = Engine::start(model(TARGET), opts(), metrics.clone()).expect("engine");
    let reqs = vec![
        speculating(0, DraftFrom::Prediction(want[0].clone()), 5),
        speculating(1, DraftFrom::Prediction(vec![7; 20]), 5),
        speculating(2, DraftFrom::Prediction(want[2][..15].to_vec()), 4),
        GenerationRequest::new(PROMPTS[3].to_vec(), MAX[3]),
    ];
    for (i, g) in serve(&engine, reqs).iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert!(g.from_draft <= g.drafted, "row {i}: {g:?}");
    }
    assert_eq!(metrics.spec_stepped_aside.get(), 0);
}

#[test]
fn prediction_rows_stepping_plainly_are_pipelined_and_answer_as_alone() {
    // No draft verified: every step of the prediction batch is plain, queued before the
    // last one's tokens are read. Rows join while others decode, leave at their
    // `max_tokens` or a stop sequence, and ask for log-probabilities.
    let want = alone();
    let mut with_logprobs = GenerationRequest::new(PROMPTS[0].to_vec(), MAX[0]);
    with_logprobs.logprobs = true;
    with_logprobs.top_logprobs = 3;
    let engine =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    let plain_lp = serve(&engine, vec![with_logprobs]).remove(0).logprobs;
    drop(engine);
    let stop_at = want[2][6];
    let metrics = Arc::new(EngineMetrics::default());
    let engine = predicting(DraftWidth::None, metrics.clone());
    let reqs: Vec<GenerationRequest> = (0..12)
        .map(|j| {
            let i = j % 4;
            let mut r = match i {
                3 => GenerationRequest::new(PROMPTS[3].to_vec(), MAX[3]),
                _ => speculating(i, DraftFrom::Prediction(want[i].clone()), 1 + j % 3),
            };
            if j == 0 {
                r.logprobs = true;
                r.top_logprobs = 3;
            }
            if j == 6 {
                r.stop_sequences = vec![vec![stop_at]];
            }
            r
        })
        .collect();
    let got = serve(&engine, reqs);
    for (j, g) in got.iter().enumerate() {
        let mut w = want[j % 4].clone();
        if j == 6 {
            let end = w.iter().position(|&t| t == stop_at).expect("stop token") + 1;
            w.truncate(end);
        }
        assert_eq!(g.tokens, w, "stream {j}");
        assert_eq!(g.drafted, 0, "stream {j}");
    }
    assert_eq!(got[0].logprobs.len(), plain_lp.len());
    for (i, ((lp, top), (want_lp, want_top))) in got[0].logprobs.iter().zip(&plain_lp).enumerate() {
        let (lp, want_lp) = (lp.expect("logprob"), want_lp.expect("logprob"));
        assert!((lp - want_lp).abs() < 1e-4, "token {i}: {lp} vs {want_lp}");
        let ids = |t: &Vec<(u32, f32)>| {
            let mut v: Vec<u32> = t.iter().map(|p| p.0).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(ids(top), ids(want_top), "token {i}");
    }
    assert!(metrics.spec_steps.get() > 0);
    assert_eq!(metrics.spec_drafted.get(), 0);
}

#[test]
fn plain_rows_stepping_with_predictions_answer_as_alone_seeded_ones_too() {
    // Every draft verified: the plain rows that join the prediction batch (unseeded) step
    // through verifications of several positions; a seeded row keeps its draws by staying
    // in the plain batch.
    let sampled = |seed: Option<u64>| {
        let mut r = GenerationRequest::new(PROMPTS[3].to_vec(), 20);
        r.sampling = mlx_engine::Sampling {
            params: mlx_sample::SamplerParams {
                temp: 1.0,
                ..Default::default()
            },
            seed,
        };
        r
    };
    let want = alone();
    let engine =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    let seeded = serve(&engine, vec![sampled(Some(3))]).remove(0).tokens;
    drop(engine);
    let engine = predicting(DraftWidth::All, Arc::new(EngineMetrics::default()));
    let reqs = vec![
        speculating(0, DraftFrom::Prediction(want[0].clone()), 5),
        GenerationRequest::new(PROMPTS[1].to_vec(), MAX[1]),
        sampled(Some(3)),
        GenerationRequest::new(PROMPTS[2].to_vec(), MAX[2]),
        sampled(None),
    ];
    let got = serve(&engine, reqs);
    assert_eq!(got[0].tokens, want[0]);
    assert!(got[0].from_draft > 0, "{:?}", got[0]);
    assert_eq!(got[1].tokens, want[1]);
    assert_eq!(got[2].tokens, seeded, "the seeded row's draws changed");
    assert_eq!(got[3].tokens, want[2]);
    assert_eq!(got[4].tokens.len(), 20);
    assert!(got[1..].iter().all(|g| g.drafted == 0));
}

#[test]
fn draft_model_rows_under_the_default_width_or_none_answer_as_alone() {
    // The default: each step drafts as many tokens as its measured times (drafting
    // included) say pay, none included; with none, the rows step plainly (the draft
    // model lagging behind, fed when a step drafts again). Rows never step aside for
    // steps that drafted nothing by their width.
    let want = alone();
    for width in [DraftWidth::Paying, DraftWidth::None] {
        let metrics = Arc::new(EngineMetrics::default());
        let o = mlx_engine::batch::EngineOptions {
            model_drafts: width,
            draft_min_acceptance: 0.9,
            ..opts()
        };
        let engine =
            Engine::start_with_draft(model(TARGET), Some(model(DRAFT)), o, metrics.clone())
                .expect("engine");
        let mut reqs: Vec<GenerationRequest> = (0..3)
            .map(|i| speculating(i, DraftFrom::DraftModel, 3))
            .collect();
        reqs.push(GenerationRequest::new(PROMPTS[3].to_vec(), MAX[3]));
        for (i, g) in serve(&engine, reqs).iter().enumerate() {
            assert_eq!(g.tokens, want[i], "{width:?}: row {i}");
            assert!(g.from_draft <= g.drafted, "{width:?}: row {i}: {g:?}");
            if width == DraftWidth::None {
                assert_eq!(g.drafted, 0, "row {i}");
            }
        }
        if width == DraftWidth::None {
            assert_eq!(metrics.spec_stepped_aside.get(), 0);
            assert!(metrics.spec_steps.get() > 0);
        }
    }
}

#[test]
fn rows_starting_from_the_draft_models_pooled_acceptance_answer_as_alone() {
    // A joining row starts from the acceptance the draft model had over the batch's
    // earlier rounds (the default since session 47; `MLX_DRAFT_POOLED_ACCEPTANCE=0`: from
    // the fixed prior, read at each engine's start). It changes the widths only: requests
    // served in two waves (the second starting from the first's rounds), with a noisy
    // draft and with the model itself as the draft, answer as alone, either way.
    let want = alone();
    for (pooled, draft) in [("1", DRAFT), ("1", TARGET), ("0", DRAFT), ("0", TARGET)] {
        std::env::set_var("MLX_DRAFT_POOLED_ACCEPTANCE", pooled);
        let o = mlx_engine::batch::EngineOptions {
            model_drafts: DraftWidth::Paying,
            ..opts()
        };
        let engine = Engine::start_with_draft(
            model(TARGET),
            Some(model(draft)),
            o,
            Arc::new(EngineMetrics::default()),
        )
        .expect("engine");
        for wave in [0..2, 2..4] {
            let reqs: Vec<GenerationRequest> = wave
                .clone()
                .map(|i| speculating(i, DraftFrom::DraftModel, 3))
                .collect();
            for (g, i) in serve(&engine, reqs).iter().zip(wave) {
                assert_eq!(g.tokens, want[i], "{draft}: row {i}");
                assert!(g.from_draft <= g.drafted, "{draft}: row {i}: {g:?}");
                if draft == TARGET {
                    assert_eq!(g.from_draft, g.drafted, "self-draft: row {i}: {g:?}");
                }
            }
        }
    }
}

#[test]
fn a_draft_model_lagging_behind_pipelined_plain_steps_drafts_from_where_the_target_is() {
    // `MLX_MODEL_PLAIN_STEPS=1` (the GPU's default; each test runs in its own process):
    // the model as its own draft under the default width, which then times plain steps too.
    // On the CPU a draft costs a forward as dear as the target's, so the rows step
    // plainly, queued before the last tokens are read (the draft model lagging by each
    // token, fed to it a step late), and verify one draft a row when that width's time
    // is stale (every 64 steps). Each such draft is accepted only if the draft model was
    // fed exactly the tokens the target was.
    std::env::set_var("MLX_MODEL_PLAIN_STEPS", "1");
    let n = 200;
    let want = alone_to(&[n; 3]);
    let engine = self_drafting();
    let drafted = |i: usize| speculating_to(i, DraftFrom::DraftModel, 3, n);
    let reqs = (0..3).map(drafted).collect();
    let check = |i: usize, g: &Got| {
        assert_eq!(g.tokens, want[i], "row {i}");
        // Drafts after the first stretch of plain steps too.
        assert!(g.drafted >= 2, "row {i}: {} drafted", g.drafted);
        assert_eq!(g.from_draft, g.drafted, "row {i}: accepted of drafted");
    };
    for (i, g) in serve(&engine, reqs).iter().enumerate() {
        check(i, g);
    }
    // A batch of one row catches up in pieces of at most 32 tokens.
    check(2, &serve(&engine, vec![drafted(2)]).remove(0));
}

#[test]
fn prompts_joining_a_plainly_stepping_draft_batch_reach_the_draft_model_when_it_drafts() {
    // `MLX_MODEL_PLAIN_STEPS=1` (each test in its own process): prompts that join while
    // the batch steps plainly are not prefilled into the draft model; the rows then lag
    // by different counts (a prompt, a few plain steps' tokens) and the draft model is
    // fed them in right-padded chunks when the batch drafts again. The model as its own
    // draft: a draft is accepted only if the draft model was fed exactly the target's
    // tokens, so every draft accepted and every answer as alone shows it was.
    std::env::set_var("MLX_MODEL_PLAIN_STEPS", "1");
    let n = 160;
    let want = alone_to(&[n; 4]);
    let engine = self_drafting();
    let submit = |i: usize| {
        let (tx, rx) = std::sync::mpsc::channel();
        let drafted = speculating_to(i, DraftFrom::DraftModel, 3, n);
        (engine.submit(drafted, Arc::new(tx)).expect("submit"), rx)
    };
    // One row decodes a while, two join it, then a fourth.
    let first = submit(0);
    let mut got = vec![Got::default(); 4];
    read(&first.1, &mut got[0], 20);
    let (second, third) = (submit(1), submit(2));
    read(&second.1, &mut got[1], 30);
    let fourth = submit(3);
    for (i, (sub, rx)) in [first, second, third, fourth].into_iter().enumerate() {
        read(&rx, &mut got[i], usize::MAX);
        sub.release();
    }
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert_eq!(g.from_draft, g.drafted, "row {i}: accepted of drafted");
    }
    // On the CPU a draft costs as much as the target's forward, so the batch steps
    // plainly but for its tries of drafts. A row count whose width has no times (1 row,
    // then the 2 or 3 rows of the first join: not within 1.5x of 1) tries drafts within
    // its first steps, so rows 0 and 1 (whose prompt was deferred) draft whatever the
    // times; rows joining a row count timed already draft when its times say so (on a
    // loaded machine, maybe not within their answers).
    for (i, g) in got.iter().enumerate().take(2) {
        assert!(g.drafted >= 1, "row {i}: {} drafted", g.drafted);
    }
}

#[test]
fn long_answers_with_queued_plain_stretches_answer_as_alone() {
    // Long answers, so that the batches pipeline plain stretches, verify again when a
    // width's time goes stale, and lose rows mid-way; with the model as its own draft
    // (plain steps queued too, `MLX_MODEL_PLAIN_STEPS=1`, each test in its own process)
    // every draft is accepted.
    std::env::set_var("MLX_MODEL_PLAIN_STEPS", "1");
    let n = [150, 90, 160, 40];
    let want = alone_to(&n);
    let with = |i: usize, from: DraftFrom| speculating_to(i, from, 3, n[i]);
    let metrics = Arc::new(EngineMetrics::default());
    let engine = Engine::start(model(TARGET), opts(), metrics.clone()).expect("engine");
    let reqs = vec![
        with(0, DraftFrom::Prediction(want[0].clone())),
        with(1, DraftFrom::Prediction(vec![7; 40])),
        with(2, DraftFrom::Prediction(want[2][..60].to_vec())),
        GenerationRequest::new(PROMPTS[3].to_vec(), n[3]),
    ];
    for (i, g) in serve(&engine, reqs).iter().enumerate() {
        assert_eq!(g.tokens, want[i], "predicted: row {i}");
        assert!(g.from_draft <= g.drafted, "row {i}: {g:?}");
    }
    assert!(metrics.spec_steps.get() > 0);
    drop(engine);
    let engine = self_drafting();
    let reqs = (0..3).map(|i| with(i, DraftFrom::DraftModel)).collect();
    for (i, g) in serve(&engine, reqs).iter().enumerate() {
        assert_eq!(g.tokens, want[i], "self-draft: row {i}");
        assert_eq!(g.from_draft, g.drafted, "self-draft: row {i}");
    }
}

#[test]
fn a_draft_with_a_larger_vocabulary_or_untrimmable_caches_is_refused() {
    let small = mlx_models::load_model(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models/llama-small-f32-tied"),
    )
    .expect("load model")
    .0;
    let m = Arc::new(EngineMetrics::default());
    let msg = match Engine::start_with_draft(small, Some(model(TARGET)), opts(), m.clone()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a draft with a larger vocabulary was accepted"),
    };
    assert!(
        msg.contains("vocabulary (320)") && msg.contains("(128)"),
        "{msg}"
    );
    let msg = match Engine::start_with_draft(
        model(TARGET),
        Some(model("gemma3_text-small-f32")),
        opts(),
        m,
    ) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a sliding-window draft was accepted"),
    };
    assert!(msg.contains("cannot be trimmed"), "{msg}");
}

#[test]
fn a_model_with_sliding_window_caches_serves_speculating_requests_plainly() {
    // gemma3_text's rotating caches cannot be trimmed: its rows decode in the plain
    // batch (the engine logs why) and give the tokens they give without a draft.
    let gemma = "gemma3_text-small-f32";
    let plain =
        Engine::start(model(gemma), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    let want: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            serve(
                &plain,
                vec![GenerationRequest::new(PROMPTS[i].to_vec(), MAX[i])],
            )
            .remove(0)
            .tokens
        })
        .collect();
    let metrics = Arc::new(EngineMetrics::default());
    let engine =
        Engine::start_with_draft(model(gemma), Some(model(TARGET)), opts(), metrics.clone())
            .expect("engine");
    let reqs = (0..3)
        .map(|i| speculating(i, DraftFrom::DraftModel, 3))
        .collect();
    for (i, g) in serve(&engine, reqs).iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert_eq!(g.drafted, 0, "row {i}");
    }
    assert_eq!(metrics.spec_steps.get(), 0);
}

/// Rows that step aside need tokens to spare after the window.
const ASIDE_MAX: usize = 20;

fn aside_request(i: usize, from: DraftFrom) -> GenerationRequest {
    GenerationRequest {
        speculate: Some(Speculate {
            from,
            num_draft_tokens: 3,
        }),
        ..GenerationRequest::new(PROMPTS[i].to_vec(), ASIDE_MAX)
    }
}

/// Row 3 with penalties (a history the plain batch goes on from).
fn penalized(mut r: GenerationRequest) -> GenerationRequest {
    r.logits = mlx_sample::LogitsParams {
        repetition_penalty: Some(1.5),
        frequency_penalty: Some(0.9),
        ..mlx_sample::LogitsParams::default()
    };
    r
}

#[test]
fn rows_whose_drafts_are_rejected_step_aside_and_decode_plainly() {
    use mlx_engine::speculative::ACCEPTANCE_WINDOW;
    let plain =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    let plain_req = |i: usize| {
        let r = GenerationRequest::new(PROMPTS[i].to_vec(), ASIDE_MAX);
        if i == 3 {
            penalized(r)
        } else {
            r
        }
    };
    let want: Vec<Vec<u32>> = (0..4)
        .map(|i| serve(&plain, vec![plain_req(i)]).remove(0).tokens)
        .collect();
    let min = |m: f64| mlx_engine::batch::EngineOptions {
        draft_min_acceptance: m,
        ..opts()
    };
    let reqs = || -> Vec<GenerationRequest> {
        let mut r: Vec<GenerationRequest> = (0..4)
            .map(|i| aside_request(i, DraftFrom::DraftModel))
            .collect();
        let last = r.pop().unwrap();
        r.push(penalized(last));
        r
    };
    // The draft of another shape (its own random weights) almost never agrees with
    // the target: every row leaves the speculating batch after the window's rounds of
    // 3 drafts and decodes plainly, with the tokens it gives without speculation.
    let metrics = Arc::new(EngineMetrics::default());
    let cached = mlx_engine::batch::EngineOptions {
        prompt_cache_size: 8,
        ..min(0.5)
    };
    let engine =
        Engine::start_with_draft(model(TARGET), Some(model(DRAFT)), cached, metrics.clone())
            .expect("engine");
    // A plain row decodes in the batch they join.
    let long = GenerationRequest::new(PROMPTS[2].to_vec(), ASIDE_MAX + 10);
    let long_want = serve(&plain, vec![long.clone()]).remove(0).tokens;
    let mut batch = reqs();
    batch.push(long);
    let got = serve(&engine, batch);
    for (i, g) in got[..4].iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert_eq!(g.drafted, 3 * ACCEPTANCE_WINDOW, "row {i}: {g:?}");
    }
    assert_eq!(got[4].tokens, long_want);
    assert_eq!(got[4].drafted, 0);
    assert_eq!(metrics.spec_stepped_aside.get(), 4);
    // Their caches hold the tokens they count as fed: a prompt that continues row 0's
    // answer is served from the cache row 0 left, and answers as without it.
    let mut follow = PROMPTS[0].to_vec();
    follow.extend_from_slice(&want[0]);
    let follow = GenerationRequest::new(follow, 5);
    let follow_want = serve(&plain, vec![follow.clone()]).remove(0).tokens;
    let before = metrics.cached_prompt_tokens.get();
    assert_eq!(serve(&engine, vec![follow]).remove(0).tokens, follow_want);
    let hit = metrics.cached_prompt_tokens.get() - before;
    assert_eq!(hit as usize, PROMPTS[0].len() + ASIDE_MAX - 1);
    // A wrong prediction gives no accepted draft, and its row stays in the speculating
    // batch (a prediction's drafts cost nothing to make: the step's width leaves out
    // those that do not pay, see `batch/width.rs`), decoding as without it.
    let got = serve(
        &engine,
        vec![aside_request(1, DraftFrom::Prediction(vec![7; 20]))],
    );
    assert_eq!(got[0].tokens, want[1]);
    assert_eq!(got[0].from_draft, 0);
    assert_eq!(metrics.spec_stepped_aside.get(), 4);

    // With a minimum of 0 the same rows speculate to their end.
    let metrics = Arc::new(EngineMetrics::default());
    let engine =
        Engine::start_with_draft(model(TARGET), Some(model(DRAFT)), min(0.0), metrics.clone())
            .expect("engine");
    for (i, g) in serve(&engine, reqs()).iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert!(g.drafted > 3 * ACCEPTANCE_WINDOW, "row {i}: {g:?}");
    }
    assert_eq!(metrics.spec_stepped_aside.get(), 0);

    // The model as its own draft (every draft accepted) never steps aside.
    let metrics = Arc::new(EngineMetrics::default());
    let engine = Engine::start_with_draft(
        model(TARGET),
        Some(model(TARGET)),
        min(0.5),
        metrics.clone(),
    )
    .expect("engine");
    for (i, g) in serve(&engine, reqs()).iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert!(
            g.from_draft > 0 && g.from_draft <= g.drafted,
            "row {i}: {g:?}"
        );
    }
    assert_eq!(metrics.spec_stepped_aside.get(), 0);

    // A minimum outside 0..=1 is refused.
    let msg = match Engine::start(model(TARGET), min(1.5), metrics) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a minimum acceptance of 1.5 was accepted"),
    };
    assert!(msg.contains("from 0 to 1") && msg.contains("1.5"), "{msg}");
}

/// The engine options with a draft max batch of `n`.
fn max_batch(n: usize) -> mlx_engine::batch::EngineOptions {
    mlx_engine::batch::EngineOptions {
        draft_max_batch: n,
        ..opts()
    }
}

#[test]
fn speculating_rows_decode_plainly_while_more_rows_than_the_draft_max_batch_decode() {
    // Row 2 generates long after the others end (the batch back under the limit);
    // row 3 has penalties (a history the plain batch goes on from).
    let lens = [ASIDE_MAX, ASIDE_MAX, 3 * ASIDE_MAX, ASIDE_MAX];
    let plain_req = |i: usize| {
        let r = GenerationRequest::new(PROMPTS[i].to_vec(), lens[i]);
        if i == 3 {
            penalized(r)
        } else {
            r
        }
    };
    let spec_req = |i: usize| GenerationRequest {
        speculate: Some(Speculate {
            from: DraftFrom::DraftModel,
            num_draft_tokens: 3,
        }),
        ..plain_req(i)
    };
    let plain =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    let want: Vec<Vec<u32>> = (0..4)
        .map(|i| serve(&plain, vec![plain_req(i)]).remove(0).tokens)
        .collect();
    // The model as its own draft: every row that speculates has drafts accepted.
    let start = |n: usize, metrics: &Arc<EngineMetrics>| {
        Engine::start_with_draft(
            model(TARGET),
            Some(model(TARGET)),
            max_batch(n),
            metrics.clone(),
        )
        .expect("engine")
    };

    // Without the limit the four rows speculate (the test's control): row 2 drafts
    // about 3 tokens per 4 it emits.
    let metrics = Arc::new(EngineMetrics::default());
    let engine = start(0, &metrics);
    let got = serve(&engine, (0..4).map(spec_req).collect());
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert!(g.from_draft > 0, "row {i}: {g:?}");
    }
    assert!(got[2].drafted >= 40, "{:?}", got[2]);
    assert_eq!(metrics.spec_over_batch.get(), 0);

    // Four rows over a limit of 2: every row leaves its speculating batch once the
    // four decode (a row that joined first may draft a few rounds before the others
    // join), with the tokens it gives without a draft; row 2 stays plain once alone
    // (stepping aside is for good).
    let metrics = Arc::new(EngineMetrics::default());
    let engine = start(2, &metrics);
    for (i, g) in serve(&engine, (0..4).map(spec_req).collect())
        .iter()
        .enumerate()
    {
        assert_eq!(g.tokens, want[i], "row {i}");
        assert!(g.drafted < 20, "row {i}: {g:?}");
    }
    assert_eq!(metrics.spec_over_batch.get(), 4);
    assert_eq!(metrics.spec_stepped_aside.get(), 0);

    // Under the limit again, a new request speculates.
    let g = serve(&engine, vec![spec_req(0)]).remove(0);
    assert_eq!(g.tokens, want[0]);
    assert!(g.from_draft > 0, "{g:?}");
    assert_eq!(metrics.spec_over_batch.get(), 4);

    // Two rows speculate under the limit (rows 0 and 3, penalized); a third joins
    // (over it): both leave their batch mid-generation, their drafting stops there,
    // their tokens unchanged.
    let long = |i: usize| GenerationRequest {
        max_tokens: 5 * ASIDE_MAX,
        ..spec_req(i)
    };
    let long_want: Vec<Vec<u32>> = [0, 3]
        .iter()
        .map(|&i| {
            let r = GenerationRequest {
                max_tokens: 5 * ASIDE_MAX,
                ..plain_req(i)
            };
            serve(&plain, vec![r]).remove(0).tokens
        })
        .collect();
    let subs: Vec<_> = [0, 3]
        .iter()
        .map(|&i| {
            let (tx, rx) = std::sync::mpsc::channel();
            (engine.submit(long(i), Arc::new(tx)).expect("submit"), rx)
        })
        .collect();
    let mut got: Vec<Got> = vec![Got::default(); 2];
    let mut finished = [false; 2];
    let take = |got: &mut Got,
                finished: &mut bool,
                rx: &std::sync::mpsc::Receiver<mlx_engine::batch::EngineEvent>| {
        match rx.recv().expect("event") {
            mlx_engine::batch::EngineEvent::Token { out, .. } => {
                got.tokens.push(out.token);
                got.from_draft += usize::from(out.from_draft);
                got.drafted += out.drafted;
                *finished = out.finish.is_some();
            }
            mlx_engine::batch::EngineEvent::Failed { error, .. } => panic!("{error}"),
            _ => {}
        }
    };
    // Both have emitted drafted tokens before the third request comes.
    for ((g, f), (_, rx)) in got.iter_mut().zip(&mut finished).zip(&subs) {
        while g.from_draft == 0 {
            take(g, f, rx);
        }
    }
    let third = serve(&engine, vec![plain_req(1)]).remove(0);
    assert_eq!(third.tokens, want[1]);
    let drafted_after_third = metrics.spec_drafted.get();
    for ((g, f), (sub, rx)) in got.iter_mut().zip(&mut finished).zip(subs) {
        while !*f {
            take(g, f, &rx);
        }
        sub.release();
    }
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.tokens, long_want[i], "row {i}");
        assert!(g.from_draft > 0, "row {i}: {g:?}");
        // Without the limit (every draft accepted) it would draft nearly every token.
        assert!(g.drafted < g.tokens.len() / 2, "row {i}: {g:?}");
    }
    assert_eq!(metrics.spec_over_batch.get(), 6);
    // Nothing drafted once the third request joined (the rows never came back).
    assert_eq!(metrics.spec_drafted.get(), drafted_after_third);
}

#[test]
fn a_draft_max_batch_that_can_never_apply_is_refused() {
    // opts() decodes at most 8 rows at once.
    for n in [8, 100] {
        let msg = match Engine::start(
            model(TARGET),
            max_batch(n),
            Arc::new(EngineMetrics::default()),
        ) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a draft max batch of {n} was accepted"),
        };
        assert!(
            msg.contains("draft max batch") && msg.contains(&n.to_string()) && msg.contains("8"),
            "{msg}"
        );
    }
    let e = mlx_engine::speculative::check_max_batch(-1, 8).unwrap_err();
    assert!(e.to_string().contains("got -1"), "{e}");
    assert_eq!(mlx_engine::speculative::check_max_batch(7, 8).unwrap(), 7);
    assert_eq!(mlx_engine::speculative::check_max_batch(0, 8).unwrap(), 0);
}

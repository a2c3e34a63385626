#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! Rows with logits processors speculate inside the batch: a stateful constraint (it
//! needs each accepted token) and penalties, next to unconstrained speculating rows and
//! a plain row, drafted by a draft model (a noisy copy of the target, or the target
//! itself) or from a prediction. Every greedy row gives exactly the tokens the same request gives
//! served alone without speculation, the constrained output keeps to its constraint,
//! and drafts are really accepted for the rows with processors.
use common::{model, opts, serve, BuildPeriodic, Got};
use mlx_array::Array;
use mlx_engine::batch::{
    DraftFrom, Engine, EngineEvent, EngineMetrics, GenerationRequest, Speculate,
};
use mlx_sample::{BuildProcessor, LogitsParams, LogitsProcessor};
use std::sync::{mpsc, Arc};

mod common;

const TARGET: &str = "llama-small-f32";

const PROMPTS: [&[u32]; 4] = [
    &[3, 4, 5, 6, 7, 8, 9, 10, 11],
    &[11, 12],
    &[20, 21, 22, 23, 24],
    &[40, 41, 42, 43, 44, 45, 46],
];
const MAX: usize = 17;

/// What each row asks for besides speculation: 0 the constraint, 1 penalties and a
/// bias, 2 the constraint and a penalty, 3 nothing.
fn request(i: usize) -> GenerationRequest {
    let mut r = GenerationRequest::new(PROMPTS[i].to_vec(), MAX);
    if i == 0 || i == 2 {
        r.processors.push(Arc::new(BuildPeriodic {
            modulus: 2,
            host_bits: false,
            dead_end_at: None,
        }));
    }
    if i == 1 {
        r.logits = LogitsParams {
            repetition_penalty: Some(1.5),
            presence_penalty: Some(0.7),
            logit_bias: vec![(5, 2.5), (17, -1.0)],
            ..LogitsParams::default()
        };
    }
    if i == 2 {
        r.logits = LogitsParams {
            frequency_penalty: Some(0.9),
            ..LogitsParams::default()
        };
    }
    r
}

fn speculating(i: usize, from: DraftFrom, k: usize) -> GenerationRequest {
    GenerationRequest {
        speculate: Some(Speculate {
            from,
            num_draft_tokens: k,
        }),
        ..request(i)
    }
}

/// Each request served alone (one at a time) by a plain engine, without speculation.
fn alone() -> Vec<Vec<u32>> {
    let engine =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    (0..4)
        .map(|i| serve(&engine, vec![request(i)]).remove(0).tokens)
        .collect()
}

fn assert_alternates(tokens: &[u32], what: &str) {
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(
            t % 2,
            i as u32 % 2,
            "{what}: token {i} breaks the constraint"
        );
    }
}

#[test]
fn rows_with_processors_speculate_and_give_the_tokens_they_give_alone() {
    let want = alone();
    assert_alternates(&want[0], "alone");
    assert_alternates(&want[2], "alone");
    // The constraint changes the answer (else this would not test it).
    let free = {
        let engine = Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default()))
            .expect("engine");
        serve(
            &engine,
            vec![GenerationRequest::new(PROMPTS[0].to_vec(), MAX)],
        )
        .remove(0)
        .tokens
    };
    assert_ne!(free, want[0]);

    // A noisy copy of the target as the draft: about half the drafts are accepted.
    // Each row keeps its own acceptance, so batched it is drafted and accepts as when
    // it speculates alone.
    let (draft, _files) = common::noisy_copy(TARGET, 0.05);
    let metrics = Arc::new(EngineMetrics::default());
    let engine = Engine::start_with_draft(model(TARGET), Some(draft), opts(), metrics.clone())
        .expect("engine");
    for ks in [[1, 3, 7], [3, 3, 3]] {
        let solo: Vec<Got> = (0..3)
            .map(|i| serve(&engine, vec![speculating(i, DraftFrom::DraftModel, ks[i])]).remove(0))
            .collect();
        let mut reqs: Vec<GenerationRequest> = (0..3)
            .map(|i| speculating(i, DraftFrom::DraftModel, ks[i]))
            .collect();
        reqs.push(request(3));
        let got = serve(&engine, reqs);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.tokens, want[i], "row {i}, draft tokens {ks:?}");
        }
        for (i, (g, s)) in got.iter().zip(&solo).enumerate() {
            assert_eq!(s.tokens, want[i], "row {i} alone, draft tokens {ks:?}");
            assert_eq!(
                (g.from_draft, g.drafted),
                (s.from_draft, s.drafted),
                "row {i}, draft tokens {ks:?}: batched {g:?}, alone {s:?}"
            );
            // Drafts were accepted, and rejected.
            assert!(
                0 < g.from_draft && g.from_draft < g.drafted,
                "row {i}: {g:?}"
            );
        }
        assert_eq!(got[3].drafted, 0, "the plain row speculated");
    }
    assert!(metrics.spec_drafted.get() > metrics.spec_accepted.get());

    // The target as its own draft: drafted under the same processors, verified
    // position by position under forks that took the drafts before, every draft is
    // accepted (a mask one position off would reject them and change the tokens).
    let engine = Engine::start_with_draft(
        model(TARGET),
        Some(model(TARGET)),
        opts(),
        Arc::new(EngineMetrics::default()),
    )
    .expect("engine");
    let mut reqs: Vec<GenerationRequest> = (0..3)
        .map(|i| speculating(i, DraftFrom::DraftModel, 3))
        .collect();
    reqs.push(request(3));
    let got = serve(&engine, reqs);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}, the target as its draft");
    }
    for (i, g) in got[..3].iter().enumerate() {
        // Four rounds of 3 drafts + 1, then one token without drafts.
        assert_eq!(g.from_draft, 12, "row {i}: {g:?}");
    }
}

#[test]
fn predictions_are_verified_against_the_constraint_and_penalties() {
    let want = alone();
    // Every draft verified: the default width follows the measured step times, which a
    // loaded machine can make leave drafts out (the same tokens either way).
    let all = mlx_engine::batch::EngineOptions {
        prediction_drafts: mlx_engine::batch::DraftWidth::All,
        ..opts()
    };
    let engine =
        Engine::start(model(TARGET), all, Arc::new(EngineMetrics::default())).expect("engine");
    // Row 0 predicts its exact output; row 1 (penalties) too; row 2's prediction breaks
    // the constraint at token 6; row 3 (unconstrained) predicts its own; a plain
    // constrained row beside them.
    let mut broken = want[2].clone();
    broken[6] ^= 1;
    let reqs = vec![
        speculating(0, DraftFrom::Prediction(want[0].clone()), 5),
        speculating(1, DraftFrom::Prediction(want[1].clone()), 4),
        speculating(2, DraftFrom::Prediction(broken), 8),
        speculating(3, DraftFrom::Prediction(want[3].clone()), 5),
        request(0),
    ];
    let got = serve(&engine, reqs);
    for (i, g) in got[..4].iter().enumerate() {
        assert_eq!(g.tokens, want[i], "row {i}");
    }
    assert_eq!(got[4].tokens, want[0], "the plain constrained row");
    assert_eq!(got[4].drafted, 0);
    assert_alternates(&got[0].tokens, "row 0");
    assert_alternates(&got[2].tokens, "row 2");
    // A right prediction is accepted though the row has processors.
    for i in [0, 1, 3] {
        assert!(got[i].from_draft >= MAX / 2, "row {i}: {:?}", got[i]);
        assert!(got[i].from_draft <= got[i].drafted, "row {i}: {:?}", got[i]);
    }
    // The first round drafts the prediction's 8 first tokens: the 6 before the broken
    // one are accepted, the broken one is not (the answer is right after it).
    assert!(
        got[2].from_draft >= 6 && got[2].from_draft < MAX - 1,
        "{:?}",
        got[2]
    );
}

/// A processor that fails once it has been told `after` tokens.
#[derive(Debug, Clone)]
struct FailAfter {
    after: u32,
    seen: u32,
}

impl LogitsProcessor for FailAfter {
    fn process(&mut self, _history: &Array, logits: &Array) -> mlx_sample::Result<Array> {
        if self.seen >= self.after {
            return Err(mlx_sample::SampleError::Constraint(format!(
                "failing after {} tokens",
                self.after
            )));
        }
        Ok(logits.clone())
    }

    fn accept(&mut self, _token: u32) -> mlx_sample::Result<()> {
        self.seen += 1;
        Ok(())
    }

    fn needs_accepted_token(&self) -> bool {
        true
    }

    fn fork(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }
}

#[derive(Debug)]
struct BuildFailAfter(u32);

impl BuildProcessor for BuildFailAfter {
    fn build(&self) -> mlx_sample::Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(FailAfter {
            after: self.0,
            seen: 0,
        }))
    }
}

#[test]
fn a_failing_processor_fails_its_row_only() {
    let want = alone();
    let engine = Engine::start_with_draft(
        model(TARGET),
        Some(model(TARGET)),
        opts(),
        Arc::new(EngineMetrics::default()),
    )
    .expect("engine");
    // Its processor fails in the middle of a round of 3 drafts (the 6th token).
    let mut failing = speculating(3, DraftFrom::DraftModel, 3);
    failing.processors.push(Arc::new(BuildFailAfter(5)));
    let reqs = vec![
        speculating(0, DraftFrom::DraftModel, 3),
        failing,
        speculating(1, DraftFrom::DraftModel, 2),
    ];
    let outcomes = outcomes_of(&engine, reqs);
    assert_eq!(outcomes[0], (want[0].clone(), None));
    assert_eq!(outcomes[2], (want[1].clone(), None));
    // The failing row ends with the processor's error, as the same request without
    // speculation does, after the tokens before it: the round emits up to the failing
    // position (5 tokens; the plain batch reads the 5th only after the step that
    // fails, and drops it).
    let plain =
        Engine::start(model(TARGET), opts(), Arc::new(EngineMetrics::default())).expect("engine");
    let mut alone = request(3);
    alone.processors.push(Arc::new(BuildFailAfter(5)));
    let alone = outcomes_of(&plain, vec![alone]).remove(0);
    assert!(
        alone
            .1
            .as_deref()
            .is_some_and(|e| e.contains("failing after 5")),
        "{alone:?}"
    );
    assert_eq!(outcomes[1].1, alone.1);
    assert_eq!(outcomes[1].0[..], want[3][..5]);
    assert!(
        outcomes[1].0.starts_with(&alone.0),
        "{outcomes:?} {alone:?}"
    );
}

/// Each request's tokens and, if it failed, its error.
fn outcomes_of(engine: &Engine, reqs: Vec<GenerationRequest>) -> Vec<(Vec<u32>, Option<String>)> {
    let subs: Vec<_> = reqs
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            (engine.submit(r, Arc::new(tx)).expect("submit"), rx)
        })
        .collect();
    let mut outcomes = Vec::new();
    for (sub, rx) in subs {
        let mut tokens = Vec::new();
        let error = loop {
            match rx.recv().expect("event") {
                EngineEvent::Token { out, .. } => {
                    tokens.push(out.token);
                    if out.finish.is_some() {
                        break None;
                    }
                }
                EngineEvent::Failed { error, .. } => break Some(error.to_string()),
                _ => {}
            }
        };
        sub.release();
        outcomes.push((tokens, error));
    }
    outcomes
}

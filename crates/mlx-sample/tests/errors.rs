//! Parameters mlx-lm rejects are rejected here, naming the parameter.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::Array;
use mlx_sample::{make_logits_processors, make_sampler, LogitsParams, SampleError, SamplerParams};

fn rejected(p: SamplerParams, name: &str) {
    match make_sampler(&p) {
        Err(SampleError::InvalidParameter { name: n, .. }) => assert_eq!(n, name),
        Err(e) => panic!("expected InvalidParameter({name}), got {e}"),
        Ok(_) => panic!("{p:?} should be rejected"),
    }
}

#[test]
fn out_of_range_sampler_parameters_are_rejected() {
    let t = SamplerParams {
        temp: 1.0,
        ..Default::default()
    };
    rejected(
        SamplerParams {
            min_p: 1.5,
            ..t.clone()
        },
        "min_p",
    );
    rejected(
        SamplerParams {
            min_p: 0.1,
            min_tokens_to_keep: 0,
            ..t.clone()
        },
        "min_tokens_to_keep",
    );
    rejected(
        SamplerParams {
            xtc_probability: 0.5,
            xtc_threshold: 0.7,
            ..t.clone()
        },
        "threshold",
    );
    rejected(
        SamplerParams {
            xtc_probability: 1.5,
            ..t.clone()
        },
        "probability",
    );
    // Greedy ignores everything else, like mlx-lm.
    assert!(make_sampler(&SamplerParams {
        min_p: 1.5,
        ..Default::default()
    })
    .is_ok());
}

#[test]
fn top_k_not_below_the_vocabulary_is_rejected_when_sampling() {
    let lp = Array::from_slice(&[-1.0f32, -2.0, -3.0], &[1, 3]).expect("array");
    let s = make_sampler(&SamplerParams {
        temp: 1.0,
        top_k: 3,
        ..Default::default()
    })
    .expect("top_k is checked against the vocabulary per call");
    let err = match s.sample(&lp) {
        Err(e) => e,
        Ok(t) => panic!("top_k = vocab must be rejected, sampled {t}"),
    };
    assert!(err.to_string().contains("(0, 3)"), "{err}");
}

#[test]
fn negative_repetition_penalty_is_rejected_and_zero_penalties_add_nothing() {
    let p = LogitsParams {
        repetition_penalty: Some(-1.0),
        ..Default::default()
    };
    assert!(make_logits_processors(&p).is_err());
    let p = LogitsParams {
        repetition_penalty: Some(0.0),
        presence_penalty: Some(0.0),
        frequency_penalty: None,
        ..Default::default()
    };
    assert_eq!(make_logits_processors(&p).expect("make").len(), 0);
}

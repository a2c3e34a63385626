//! The processor chain keeps mlx-lm's token history itself: prompt chunks told through
//! `prompt` and each step's input through `process` give bit for bit what the
//! processors give on the whole history at once (what mlx-lm's `generate_step` passes),
//! and a fork goes on from the same history.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{random, Array, Dtype};
use mlx_sample::{make_logits_processors, LogitsParams};

fn params() -> LogitsParams {
    LogitsParams {
        logit_bias: vec![(3, 1.5), (17, -2.0)],
        repetition_penalty: Some(1.3),
        repetition_context_size: 5,
        presence_penalty: Some(0.4),
        presence_context_size: 4,
        frequency_penalty: Some(0.25),
        frequency_context_size: 6,
    }
}

fn bits(a: &Array) -> Vec<u32> {
    a.astype(Dtype::Float32)
        .and_then(|a| a.to_vec::<f32>())
        .expect("read")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

#[test]
fn incremental_history_matches_the_whole_history_bit_for_bit() {
    random::seed(3).expect("seed");
    let logits = random::normal(&[1, 32], Dtype::Float32, None, None, None).expect("logits");
    let history: Vec<u32> = vec![1, 3, 3, 9, 17, 2, 3, 5, 9, 9];
    let mut chain = make_logits_processors(&params()).expect("make");
    assert_eq!(chain.len(), 4);
    chain.prompt(&history[..4]).expect("prompt");
    chain.prompt(&history[4..7]).expect("prompt");
    let mut whole = make_logits_processors(&params()).expect("make");
    let mut fork = None;
    for end in 8..=history.len() {
        let input = Array::from_slice(&history[end - 1..end], &[1]).expect("input");
        let got = chain.process(&input, &logits).expect("process");
        let all = Array::from_slice(&history[..end], &[end as i32]).expect("history");
        let want = whole.process_with_history(&all, &logits).expect("process");
        assert_eq!(bits(&got), bits(&want), "after {end} tokens");
        if end == 8 {
            fork = Some(chain.fork());
        }
    }
    // The fork has the history up to 8 tokens: it continues like the original did.
    let mut fork = fork.expect("forked");
    let input = Array::from_slice(&history[8..9], &[1]).expect("input");
    let all = Array::from_slice(&history[..9], &[9]).expect("history");
    assert_eq!(
        bits(&fork.process(&input, &logits).expect("process")),
        bits(&whole.process_with_history(&all, &logits).expect("process"))
    );
    assert!(!chain.needs_accepted_token());
}

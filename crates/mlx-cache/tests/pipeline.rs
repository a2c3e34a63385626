//! Pipelined prefill (`mlx_nn::pipeline`): inside a scope, multi-token cache updates are
//! evaluated `depth` layers behind the one being built, single-token updates and
//! updates outside a scope are left lazy, and every committed tiny model gives the
//! same bits (logits and caches) with the pipelining as without it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_cache::{make_prompt_cache, KVCache, PromptCache};
use mlx_models::LanguageModel;
use mlx_nn::cache::KvFetch;
use mlx_nn::pipeline::{update_and_fetch, PipelinedPrefill};
use std::path::PathBuf;

fn kv(positions: i32, seed: f32) -> (Array, Array) {
    let shape = [1, 2, positions, 4];
    let k = ops::arange(0.0, 8.0 * positions as f64, 1.0, Dtype::Float32)
        .and_then(|a| a.reshape(&shape))
        .and_then(|a| a.add(seed))
        .expect("keys");
    let v = k.multiply(2.0f32).expect("values");
    (k, v)
}

fn keys(f: &KvFetch) -> Array {
    match f {
        KvFetch::Plain { keys, .. } => keys.clone(),
        KvFetch::Quantized { keys, .. } => keys.0.clone(),
    }
}

/// Three layers' updates of `positions` tokens; whether each layer's fetched keys were
/// evaluated once all three were built.
fn available_after_three(depth: Option<usize>, positions: i32) -> Vec<bool> {
    let _scope = depth.map(PipelinedPrefill::new);
    let mut caches: Vec<KVCache> = (0..3).map(|_| KVCache::new()).collect();
    let fetched: Vec<Array> = caches
        .iter_mut()
        .enumerate()
        .map(|(i, c)| {
            let (k, v) = kv(positions, i as f32);
            keys(&update_and_fetch(c, &k, &v).expect("update"))
        })
        .collect();
    fetched.iter().map(|a| a.is_available()).collect()
}

#[test]
fn prefill_updates_are_evaluated_depth_layers_behind() {
    // Depth 1: the first layer is waited for once the second is queued, the second once
    // the third is (the third may or may not have finished: not asserted).
    let got = available_after_three(Some(1), 5);
    assert_eq!(&got[..2], &[true, true], "depth 1: {got:?}");
    // Depth 2: only the first layer has been waited for.
    assert!(available_after_three(Some(2), 5)[0]);
}

#[test]
fn nothing_is_evaluated_outside_a_scope_at_depth_zero_or_when_decoding() {
    assert_eq!(available_after_three(None, 5), vec![false; 3]);
    assert_eq!(available_after_three(Some(0), 5), vec![false; 3]);
    // One-token updates (decoding steps) stay one lazy graph, even inside a scope.
    assert_eq!(available_after_three(Some(1), 1), vec![false; 3]);
}

#[test]
fn scopes_nest_and_end_with_their_guard() {
    {
        let _outer = PipelinedPrefill::new(1);
        {
            let _inner = PipelinedPrefill::new(0);
            assert_eq!(
                available_after_three(None, 5),
                vec![false; 3],
                "inner depth 0"
            );
        }
        // Back in the outer scope: pipelined again.
        assert!(available_after_three(None, 5)[0], "outer scope restored");
    }
    assert_eq!(
        available_after_three(None, 5),
        vec![false; 3],
        "after both guards"
    );
}

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models")
}

/// A prefill of `prompt` (all but the last token), then one step on the last token:
/// the step's logits and the caches' state, as bytes.
fn run(model: &dyn LanguageModel, prompt: &[u32], depth: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut caches: PromptCache = make_prompt_cache(&model.cache_specs(), None).expect("caches");
    let n = prompt.len() - 1;
    let x = Array::from_slice(&prompt[..n], &[1, n as i32]).expect("tokens");
    {
        let _scope = PipelinedPrefill::new(depth);
        model.forward(&x, &mut caches).expect("prefill");
    }
    let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
    transforms::eval(&state.iter().collect::<Vec<_>>()).expect("eval");
    let last = Array::from_slice(&prompt[n..], &[1, 1]).expect("token");
    let logits = model.forward(&last, &mut caches).expect("step");
    let state: Vec<Vec<u8>> = caches
        .iter()
        .flat_map(|c| c.state())
        .map(|a| a.to_bytes().expect("state bytes"))
        .collect();
    (logits.to_bytes().expect("logits bytes"), state)
}

#[test]
fn every_committed_model_gives_the_same_bits_pipelined() {
    let mut names: Vec<String> = std::fs::read_dir(models_dir())
        .expect("goldens/models")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 20, "committed tiny models: {names:?}");
    for name in &names {
        let (model, _) = mlx_models::load_model(models_dir().join(name)).expect("load model");
        // Token ids inside the vocabulary (a gather past its end reads arbitrary memory).
        let vocab = model.vocab_size() as u32;
        let prompt: Vec<u32> = (0..23u32).map(|j| (13 * j + 5) % (vocab - 1) + 1).collect();
        let plain = run(model.as_ref(), &prompt, 0);
        for depth in [1, 2] {
            let piped = run(model.as_ref(), &prompt, depth);
            assert!(plain.0 == piped.0, "{name}: logits differ at depth {depth}");
            assert!(plain.1 == piped.1, "{name}: caches differ at depth {depth}");
        }
    }
}

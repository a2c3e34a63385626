#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
//! mlx-lm's `ChunkedKVCache` (Llama 4's chunked-attention layers) on the committed tiny
//! Llama 4 checkpoint, whose chunk (8) is shorter than the prompt (9), so the caches
//! have dropped their front: a prompt-cache file written by mlx-lm loads here and
//! decodes to mlx-lm's logits bit for bit; the file we write for the same prompt is
//! mlx-lm's, tensor for tensor; mlx-lm decodes our file to the same logits. Goldens:
//! `xtask/py/hybrid_cache_oracle.py goldens` (its CHUNKED list).
mod common;

use common::{assert_bits_eq, golden_dir, load_golden, mlx_python};
use mlx_array::{io, ops, transforms, Array, Dtype};
use mlx_cache::{
    can_trim_prompt_cache, load_prompt_cache, make_prompt_cache, save_prompt_cache, ChunkedKVCache,
    KvCache, PromptCache,
};
use mlx_models::LanguageModel;
use std::collections::BTreeMap;
use std::path::PathBuf;

const NAME: &str = "llama4-small-f32";
const PROMPT: [i32; 9] = [3, 14, 15, 92, 65, 35, 89, 79, 32];
const NEXT: [i32; 3] = [38, 46, 26];

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/models")
        .join(NAME)
}

fn model() -> Box<dyn LanguageModel> {
    mlx_models::load_model(model_dir()).expect("golden model").0
}

fn classes(caches: &[Box<dyn KvCache>]) -> Vec<&'static str> {
    caches.iter().map(|c| c.class_name()).collect()
}

/// mlx-lm's `make_cache` of the 4-layer model: three chunked layers, then a global one.
const WANT: [&str; 4] = [
    "ChunkedKVCache",
    "ChunkedKVCache",
    "ChunkedKVCache",
    "KVCache",
];

fn prefill(model: &dyn LanguageModel) -> PromptCache {
    let mut caches = make_prompt_cache(&model.cache_specs(), None).expect("caches");
    assert_eq!(classes(&caches), WANT);
    let x = Array::from_slice(&PROMPT, &[1, PROMPT.len() as i32]).expect("tokens");
    model.forward(&x, &mut caches).expect("prefill");
    let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
    transforms::eval(&state.iter().collect::<Vec<_>>()).expect("eval");
    caches
}

fn decode(model: &dyn LanguageModel, caches: &mut [Box<dyn KvCache>]) -> Array {
    let steps: Vec<Array> = NEXT
        .iter()
        .map(|&t| {
            let x = Array::from_slice(&[t], &[1, 1]).expect("token");
            let y = model.forward(&x, caches).expect("decode");
            y.eval().expect("eval");
            y
        })
        .collect();
    ops::concatenate(&steps.iter().collect::<Vec<_>>(), 1).expect("concat")
}

fn expected() -> Array {
    let (mut e, _) = load_golden(&format!("prompt_cache_{NAME}_expected.safetensors"));
    e.remove("logits").expect("expected logits")
}

#[test]
fn an_mlx_lm_chunked_prompt_cache_decodes_to_mlx_lm_logits() {
    let path = golden_dir().join(format!("prompt_cache_{NAME}.safetensors"));
    let (mut caches, meta) = load_prompt_cache(&path).expect("load mlx-lm's file");
    assert_eq!(classes(&caches), WANT);
    assert_eq!(meta.get("model").map(String::as_str), Some(NAME));
    let model = model();
    let got = decode(model.as_ref(), &mut caches);
    assert_bits_eq(&got, &expected(), NAME);
    // Decoding past the chunk moved the chunked caches' front (mlx-lm's maybe_trim_front).
    let c = caches[0]
        .as_any()
        .downcast_ref::<ChunkedKVCache>()
        .expect("chunked");
    assert_eq!(c.offset(), 12);
    assert_eq!(c.start_position(), 11 - c.chunk_size());
}

#[test]
fn our_chunked_prompt_cache_equals_mlx_lm_s_and_round_trips() {
    let model = model();
    let caches = prefill(model.as_ref());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ours.safetensors");
    let mut meta = BTreeMap::new();
    meta.insert("model".to_string(), NAME.to_string());
    save_prompt_cache(&path, &caches, &meta).expect("save");
    let (ours, our_meta) = io::load_safetensors(&path).expect("read ours");
    let golden = golden_dir().join(format!("prompt_cache_{NAME}.safetensors"));
    let (theirs, mut their_meta) = io::load_safetensors(&golden).expect("read mlx-lm's");
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (k, w) in &theirs {
        assert_bits_eq(&ours[k], w, k);
    }
    their_meta.retain(|k, _| !k.starts_with("0.") || k == "0.model");
    assert_eq!(our_meta, their_meta);
    let (mut loaded, got_meta) = load_prompt_cache(&path).expect("load ours");
    assert_eq!(got_meta, meta);
    assert_eq!(classes(&loaded), WANT);
    let got = decode(model.as_ref(), &mut loaded);
    assert_bits_eq(&got, &expected(), NAME);
}

#[test]
fn mlx_lm_decodes_our_chunked_prompt_cache_to_the_same_logits() {
    let py = mlx_python();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../xtask/py/hybrid_cache_oracle.py");
    let model = model();
    let caches = prefill(model.as_ref());
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cache.safetensors");
    let out = dir.path().join("out.safetensors");
    save_prompt_cache(&file, &caches, &BTreeMap::new()).expect("save");
    let status = std::process::Command::new(&py)
        .arg(&script)
        .arg("check-file")
        .arg(model_dir())
        .arg(&file)
        .arg(&out)
        .status()
        .expect("run python");
    assert!(status.success(), "mlx-lm could not load our file");
    let (mut got, meta) = io::load_safetensors(&out).expect("read mlx-lm's output");
    let want: Vec<String> = WANT.iter().map(|c| format!("\"{c}\"")).collect();
    assert_eq!(
        meta.get("classes").cloned(),
        Some(format!("[{}]", want.join(", ")))
    );
    assert_bits_eq(&got.remove("logits").expect("logits"), &expected(), NAME);
}

fn kv(n: i32) -> Array {
    ops::arange(0.0, n as f64, 1.0, Dtype::Float32)
        .unwrap()
        .reshape(&[1, 1, n, 1])
        .unwrap()
}

#[test]
fn the_front_is_trimmed_to_the_chunk_and_trim_stops_at_the_held_positions() {
    // mlx-lm: maybe_trim_front keeps the last chunk_size positions and moves
    // start_position; trim(n) removes at most offset - start_position.
    let mut c = ChunkedKVCache::new(4);
    c.maybe_trim_front().unwrap(); // empty: nothing to do
    c.update(&kv(6), &kv(6)).unwrap();
    assert_eq!((c.offset(), c.start_position()), (6, 0));
    c.maybe_trim_front().unwrap();
    assert_eq!((c.offset(), c.start_position()), (6, 2));
    assert_eq!(
        c.keys().unwrap().to_vec::<f32>().unwrap(),
        vec![2., 3., 4., 5.]
    );
    let (k, _) = c.update(&kv(1), &kv(1)).unwrap();
    assert_eq!(k.to_vec::<f32>().unwrap(), vec![2., 3., 4., 5., 0.]);
    assert_eq!(c.keys().unwrap().dim(2).unwrap(), 4 + 256);
    assert!(c.is_trimmable());
    assert_eq!(c.trim(10), 5);
    assert_eq!((c.offset(), c.start_position()), (2, 2));
    let caches: PromptCache = vec![Box::new(c)];
    assert!(can_trim_prompt_cache(&caches));
}

#[test]
fn a_chunked_cache_file_with_an_inconsistent_state_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.safetensors");
    let caches: PromptCache = vec![Box::new(ChunkedKVCache::from_parts(
        Some(kv(4)),
        Some(kv(4)),
        3,
        8,
        5,
    ))];
    save_prompt_cache(&path, &caches, &BTreeMap::new()).expect("save");
    let e = load_prompt_cache(&path).err().expect("refused");
    assert!(e.to_string().contains("start_position"), "{e}");
}

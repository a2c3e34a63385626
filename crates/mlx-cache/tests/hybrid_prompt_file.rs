//! Prompt-cache files of hybrid models (mlx-lm's `ArraysCache` recurrent states beside
//! `KVCache`s): a file written by mlx-lm (`save_prompt_cache`, as `mlx_lm.cache_prompt`
//! calls it) loads here and decodes to mlx-lm's logits bit for bit; a file we write
//! loads in mlx-lm and decodes to the same logits; our own round trip keeps every array.
mod common;

use common::{assert_bits_eq, golden_dir, load_golden, mlx_python};
use mlx_array::{io, ops, transforms, Array};
use mlx_cache::{
    can_trim_prompt_cache, load_prompt_cache, make_prompt_cache, save_prompt_cache,
    trim_prompt_cache, ArraysCache, KvCache, PromptCache,
};
use mlx_models::LanguageModel;
use std::collections::BTreeMap;
use std::path::PathBuf;

const MODEL: &str = "qwen3_next-small-f32";
const PROMPT: [i32; 9] = [3, 14, 15, 92, 65, 35, 89, 79, 32];
const NEXT: [i32; 3] = [38, 46, 26];

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/models")
        .join(MODEL)
}

fn model() -> Box<dyn LanguageModel> {
    mlx_models::load_model(model_dir()).expect("golden model").0
}

fn eval_caches(caches: &[Box<dyn KvCache>]) {
    let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
    transforms::eval(&state.iter().collect::<Vec<_>>()).expect("eval");
}

fn prefill(model: &dyn LanguageModel) -> PromptCache {
    let mut caches = make_prompt_cache(&model.cache_specs(), None).expect("caches");
    let x = Array::from_slice(&PROMPT, &[1, PROMPT.len() as i32]).expect("tokens");
    model.forward(&x, &mut caches).expect("prefill");
    eval_caches(&caches);
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
    let (mut e, _) = load_golden(&format!("prompt_cache_{MODEL}_expected.safetensors"));
    e.remove("logits").expect("expected logits")
}

fn classes(caches: &[Box<dyn KvCache>]) -> Vec<&'static str> {
    caches.iter().map(|c| c.class_name()).collect()
}

#[test]
fn an_mlx_lm_hybrid_prompt_cache_decodes_to_mlx_lm_logits() {
    let path = golden_dir().join(format!("prompt_cache_{MODEL}.safetensors"));
    let (mut caches, meta) = load_prompt_cache(&path).expect("load mlx-lm's file");
    assert_eq!(
        classes(&caches),
        ["ArraysCache", "KVCache", "ArraysCache", "KVCache"]
    );
    assert_eq!(meta.get("model").map(String::as_str), Some(MODEL));
    let arrays = caches[0].arrays().expect("slots");
    assert_eq!(arrays.cache.len(), 2);
    assert!(arrays.left_padding.is_none() && arrays.lengths.is_none());
    let model = model();
    assert_bits_eq(&decode(model.as_ref(), &mut caches), &expected(), "logits");
}

#[test]
fn our_hybrid_prompt_cache_equals_mlx_lm_s_and_round_trips() {
    let model = model();
    let caches = prefill(model.as_ref());
    let path = tempfile::Builder::new()
        .prefix("mlx-cache-hybrid-")
        .suffix(".safetensors")
        .tempfile()
        .expect("temp")
        .into_temp_path();
    let mut meta = BTreeMap::new();
    meta.insert("model".to_string(), MODEL.to_string());
    save_prompt_cache(&path, &caches, &meta).expect("save");
    // Same tensors and metadata as mlx-lm's file for the same prompt.
    let (ours, our_meta) = io::load_safetensors(&path).expect("read ours");
    let golden = golden_dir().join(format!("prompt_cache_{MODEL}.safetensors"));
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
    // Our loader gives back the same arrays and decodes like the original caches.
    let (mut loaded, got_meta) = load_prompt_cache(&path).expect("load ours");
    assert_eq!(got_meta, meta);
    assert_eq!(classes(&loaded), classes(&caches));
    for (a, b) in loaded.iter().zip(&caches) {
        let (sa, sb) = (a.state(), b.state());
        assert_eq!(sa.len(), sb.len());
        for (x, y) in sa.iter().zip(&sb) {
            assert_bits_eq(x, y, a.class_name());
        }
    }
    assert_bits_eq(&decode(model.as_ref(), &mut loaded), &expected(), "logits");
}

#[test]
fn mlx_lm_decodes_our_hybrid_prompt_cache_to_the_same_logits() {
    let py = mlx_python();
    let model = model();
    let caches = prefill(model.as_ref());
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cache.safetensors");
    let out = dir.path().join("out.safetensors");
    save_prompt_cache(&file, &caches, &BTreeMap::new()).expect("save");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../xtask/py/hybrid_cache_oracle.py");
    let status = std::process::Command::new(py)
        .arg(script)
        .arg("check-file")
        .arg(model_dir())
        .arg(&file)
        .arg(&out)
        .status()
        .expect("run python");
    assert!(status.success(), "mlx-lm could not load our file");
    let (mut got, meta) = io::load_safetensors(&out).expect("read mlx-lm's output");
    assert_eq!(
        meta.get("classes").map(String::as_str),
        Some(r#"["ArraysCache", "KVCache", "ArraysCache", "KVCache"]"#)
    );
    assert_bits_eq(
        &got.remove("logits").expect("logits"),
        &expected(),
        "logits",
    );
}

#[test]
fn a_recurrent_state_is_never_trimmed() {
    let model = model();
    let mut caches = prefill(model.as_ref());
    assert!(!can_trim_prompt_cache(&caches));
    assert_eq!(trim_prompt_cache(&mut caches, 2), 0);
    let a = caches[0]
        .as_any()
        .downcast_ref::<ArraysCache>()
        .expect("ArraysCache");
    assert!(!a.is_trimmable());
    assert!(!a.is_empty());
    assert!(ArraysCache::new(2).is_empty());
}

#[test]
fn an_arrays_cache_refuses_keys_and_values() {
    let mut c = ArraysCache::new(2);
    let k = ops::zeros(&[1, 1, 1, 4], mlx_array::Dtype::Float32).expect("zeros");
    let e = c.update_and_fetch(&k, &k).expect_err("refused");
    assert!(e.to_string().contains("recurrent state"), "{e}");
}

//! Prompt-cache files of hybrid models (mlx-lm's `ArraysCache` recurrent states beside
//! `KVCache`s), on the committed tiny checkpoints: a file written by mlx-lm
//! (`save_prompt_cache`, as `mlx_lm.cache_prompt` calls it) loads here and decodes to
//! mlx-lm's logits bit for bit; the file we write for the same prompt is mlx-lm's,
//! tensor for tensor, and mlx-lm decodes it to the same logits; our own round trip
//! keeps every array. Goldens: `xtask/py/hybrid_cache_oracle.py goldens`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
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

/// The committed hybrid goldens (`hybrid_cache_oracle.py`'s MODELS).
const MODELS: [&str; 8] = [
    "qwen3_next-small-f32",
    "qwen3_5-small-f32",
    "qwen3_5_moe-small-f32",
    "lfm2-small-f32",
    "mamba2-small-f32",
    "granitemoehybrid-small-f32",
    "nemotron_h-small-f32",
    "mamba-small-f32",
];
const PROMPT: [i32; 9] = [3, 14, 15, 92, 65, 35, 89, 79, 32];
const NEXT: [i32; 3] = [38, 46, 26];

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../goldens/models")
        .join(name)
}

fn model(name: &str) -> Box<dyn LanguageModel> {
    mlx_models::load_model(model_dir(name))
        .expect("golden model")
        .0
}

fn classes(caches: &[Box<dyn KvCache>]) -> Vec<&'static str> {
    caches.iter().map(|c| c.class_name()).collect()
}

/// mlx-lm's class names of the model's caches (at least one `ArraysCache`).
fn want_classes(model: &dyn LanguageModel) -> Vec<&'static str> {
    let caches = make_prompt_cache(&model.cache_specs(), None).expect("caches");
    assert!(caches.iter().any(|c| c.class_name() == "ArraysCache"));
    classes(&caches)
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

fn expected(name: &str) -> Array {
    let (mut e, _) = load_golden(&format!("prompt_cache_{name}_expected.safetensors"));
    e.remove("logits").expect("expected logits")
}

#[test]
fn an_mlx_lm_hybrid_prompt_cache_decodes_to_mlx_lm_logits() {
    for name in MODELS {
        let path = golden_dir().join(format!("prompt_cache_{name}.safetensors"));
        let (mut caches, meta) = load_prompt_cache(&path).expect("load mlx-lm's file");
        let model = model(name);
        assert_eq!(classes(&caches), want_classes(model.as_ref()), "{name}");
        assert_eq!(meta.get("model").map(String::as_str), Some(name));
        let arrays = caches.iter().find_map(|c| c.arrays()).expect("slots");
        assert!(arrays.cache.iter().all(Option::is_some), "{name}");
        assert!(arrays.left_padding.is_none() && arrays.lengths.is_none());
        let got = decode(model.as_ref(), &mut caches);
        assert_bits_eq(&got, &expected(name), name);
    }
}

#[test]
fn our_hybrid_prompt_caches_equal_mlx_lm_s_and_round_trip() {
    for name in MODELS {
        let model = model(name);
        let caches = prefill(model.as_ref());
        let path = tempfile::Builder::new()
            .prefix("mlx-cache-hybrid-")
            .suffix(".safetensors")
            .tempfile()
            .expect("temp")
            .into_temp_path();
        let mut meta = BTreeMap::new();
        meta.insert("model".to_string(), name.to_string());
        save_prompt_cache(&path, &caches, &meta).expect("save");
        // The tensors and metadata of mlx-lm's file for the same prompt.
        let (ours, our_meta) = io::load_safetensors(&path).expect("read ours");
        let golden = golden_dir().join(format!("prompt_cache_{name}.safetensors"));
        let (theirs, mut their_meta) = io::load_safetensors(&golden).expect("read mlx-lm's");
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (k, w) in &theirs {
            assert_bits_eq(&ours[k], w, &format!("{name} {k}"));
        }
        their_meta.retain(|k, _| !k.starts_with("0.") || k == "0.model");
        assert_eq!(our_meta, their_meta, "{name}");
        // Our loader gives the same arrays back, which decode like the originals.
        let (mut loaded, got_meta) = load_prompt_cache(&path).expect("load ours");
        assert_eq!(got_meta, meta);
        assert_eq!(classes(&loaded), classes(&caches));
        for (a, b) in loaded.iter().zip(&caches) {
            let (sa, sb) = (a.state(), b.state());
            assert_eq!(sa.len(), sb.len(), "{name}");
            for (x, y) in sa.iter().zip(&sb) {
                assert_bits_eq(x, y, &format!("{name} {}", a.class_name()));
            }
        }
        let got = decode(model.as_ref(), &mut loaded);
        assert_bits_eq(&got, &expected(name), name);
    }
}

#[test]
fn mlx_lm_decodes_our_hybrid_prompt_caches_to_the_same_logits() {
    let py = mlx_python();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../xtask/py/hybrid_cache_oracle.py");
    for name in MODELS {
        let model = model(name);
        let caches = prefill(model.as_ref());
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("cache.safetensors");
        let out = dir.path().join("out.safetensors");
        save_prompt_cache(&file, &caches, &BTreeMap::new()).expect("save");
        let status = std::process::Command::new(&py)
            .arg(&script)
            .arg("check-file")
            .arg(model_dir(name))
            .arg(&file)
            .arg(&out)
            .status()
            .expect("run python");
        assert!(status.success(), "{name}: mlx-lm could not load our file");
        let (mut got, meta) = io::load_safetensors(&out).expect("read mlx-lm's output");
        let want: Vec<String> = want_classes(model.as_ref())
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect();
        assert_eq!(
            meta.get("classes").cloned(),
            Some(format!("[{}]", want.join(", "))),
            "{name}"
        );
        let got = got.remove("logits").expect("logits");
        assert_bits_eq(&got, &expected(name), name);
    }
}

#[test]
fn a_recurrent_state_is_never_trimmed() {
    let model = model(MODELS[0]);
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

#[test]
fn a_prompt_cache_file_with_a_broken_arrays_cache_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.safetensors");
    let a = ops::zeros(&[1, 3, 8], mlx_array::Dtype::Float32).expect("zeros");
    let b = ops::zeros(&[2, 3, 8], mlx_array::Dtype::Float32).expect("zeros");
    let caches: PromptCache = vec![Box::new(ArraysCache::from_parts(
        vec![Some(a), Some(b)],
        None,
        None,
    ))];
    save_prompt_cache(&path, &caches, &BTreeMap::new()).expect("save");
    let e = load_prompt_cache(&path).err().expect("refused");
    assert!(e.to_string().contains("batch size"), "{e}");
}

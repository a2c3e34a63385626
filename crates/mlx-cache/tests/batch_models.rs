//! Batched decoding through [`BatchPromptCache`] with the committed tiny models
//! (`goldens/models/*`, every architecture, plain and sliding-window caches): each row,
//! prefilled alone and then decoded among others that join and leave between steps,
//! gets the same greedy tokens and ends with the same cache as the same prompt decoded
//! alone with batch size 1, whether the prompts were prefilled alone or together in
//! right-padded chunks (mlx-lm's `PromptProcessingBatch`, rows leaving the prefill batch
//! when done). With plain caches the logits are bit-identical on the CPU.
//! Sliding-window layers attend to the same positions but, once a batch buffer wraps,
//! in another order than a single row's buffer (mlx-lm's `BatchRotatingKVCache` does
//! the same), so there the logits agree to float rounding only.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
use mlx_array::{transforms, Array, Dtype};
use mlx_cache::{make_prompt_cache, BatchPromptCache, KvCache, PromptCache, RotatingKVCache};
use mlx_models::LanguageModel;
use std::path::PathBuf;

const STEPS: usize = 7;

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../goldens/models")
}

fn prompts(vocab: i32) -> Vec<Vec<u32>> {
    (0..4u32)
        .map(|i| {
            (0..3 + 4 * i)
                .map(|j| (7 * i + 13 * j + 1) % (vocab as u32 - 1) + 1)
                .collect()
        })
        .collect()
}

fn last_logits(logits: &Array, row: i32) -> Array {
    let s = logits.shape();
    logits
        .slice(&[row, s[1] - 1, 0], &[row + 1, s[1], s[2]], None)
        .and_then(|a| a.reshape(&[s[2]]))
        .and_then(|a| a.astype(Dtype::Float32))
        .expect("slice logits")
}

fn greedy(logits: &Array) -> u32 {
    logits
        .argmax(Some(-1), false)
        .and_then(|a| a.astype(Dtype::Uint32))
        .and_then(|a| a.item::<u32>())
        .expect("argmax")
}

/// All but the last prompt token, alone (what the server's prefill does).
fn prefill(model: &dyn LanguageModel, prompt: &[u32]) -> PromptCache {
    let mut caches = make_prompt_cache(&model.cache_specs(), None).expect("caches");
    let n = prompt.len() - 1;
    let x = Array::from_slice(&prompt[..n], &[1, n as i32]).expect("tokens");
    model.forward(&x, &mut caches).expect("prefill");
    let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
    transforms::eval(&state.iter().collect::<Vec<_>>()).expect("eval");
    caches
}

/// Greedy logits of `STEPS` steps with batch size 1, and the final caches.
fn alone(model: &dyn LanguageModel, prompt: &[u32]) -> (Vec<Array>, PromptCache) {
    let mut caches = prefill(model, prompt);
    let mut tok = *prompt.last().expect("prompt");
    let mut out = Vec::new();
    for _ in 0..STEPS {
        let x = Array::from_slice(&[tok], &[1, 1]).expect("token");
        let l = last_logits(&model.forward(&x, &mut caches).expect("step"), 0);
        tok = greedy(&l);
        out.push(l);
    }
    (out, caches)
}

struct Row {
    id: usize,
    next: u32,
    logits: Vec<Array>,
}

/// The cached keys oldest first (the last `size` positions).
fn cache_keys(c: &dyn KvCache) -> Array {
    if let Some(subs) = c.sub_caches() {
        // A CacheList: each cache's keys, flattened.
        let flat: Vec<Array> = subs
            .iter()
            .map(|s| cache_keys(s.as_ref()).reshape(&[-1]).expect("flatten"))
            .collect();
        return mlx_array::ops::concatenate(&flat.iter().collect::<Vec<_>>(), 0)
            .and_then(|a| a.reshape(&[1, 1, -1, 1]))
            .expect("list");
    }
    let s = c.state();
    if c.arrays().is_some() {
        // A recurrent state: every slot, flattened.
        let flat: Vec<Array> = s
            .iter()
            .map(|a| a.reshape(&[-1]).expect("flatten"))
            .collect();
        return mlx_array::ops::concatenate(&flat.iter().collect::<Vec<_>>(), 0)
            .and_then(|a| a.reshape(&[1, 1, -1, 1]))
            .expect("state");
    }
    let mut k = s[0].clone();
    if let Some(r) = c.as_any().downcast_ref::<RotatingKVCache>() {
        k = r.temporal_order(&k).expect("temporal order");
    }
    let (size, shape) = (c.size(), k.shape());
    let end = if c.as_any().is::<RotatingKVCache>() {
        shape[2]
    } else {
        size
    };
    k.slice(&[0, 0, end - size, 0], &[1, shape[1], end, shape[3]], None)
        .expect("keys")
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    a.subtract(b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max(None, false))
        .and_then(|d| d.item::<f32>())
        .unwrap_or(f32::NAN)
}

/// Prompt tokens per prefill chunk when prompts are prefilled together.
const CHUNK: usize = 4;

/// Prompts prefilled together, right-padded chunk by chunk like mlx-lm's
/// `PromptProcessingBatch`; rows done with their prompt (all but the last token) leave.
#[derive(Default)]
struct Prefilling {
    cache: BatchPromptCache,
    /// (prompt index, tokens prefilled).
    rows: Vec<(usize, usize)>,
}

impl Prefilling {
    fn add(&mut self, model: &dyn LanguageModel, ids: &[usize]) {
        let empty: Vec<PromptCache> = ids
            .iter()
            .map(|_| make_prompt_cache(&model.cache_specs(), None).expect("caches"))
            .collect();
        let refs: Vec<&[Box<dyn KvCache>]> = empty.iter().map(|c| c.as_slice()).collect();
        self.cache
            .extend(BatchPromptCache::merge(&refs).expect("merge"))
            .expect("extend");
        self.rows.extend(ids.iter().map(|&i| (i, 0)));
    }

    /// One chunk for every row; returns the rows now ready to decode with their caches.
    fn chunk(
        &mut self,
        model: &dyn LanguageModel,
        prompts: &[Vec<u32>],
    ) -> Option<(Vec<usize>, BatchPromptCache)> {
        if self.rows.is_empty() {
            return None;
        }
        let parts: Vec<&[u32]> = self
            .rows
            .iter()
            .map(|&(i, done)| &prompts[i][done..(done + CHUNK).min(prompts[i].len() - 1)])
            .collect();
        let longest = parts.iter().map(|p| p.len()).max().unwrap_or(0);
        let lengths: Vec<i32> = parts.iter().map(|p| p.len() as i32).collect();
        let padding: Vec<i32> = lengths.iter().map(|l| longest as i32 - l).collect();
        let mut tokens = Vec::with_capacity(parts.len() * longest);
        for p in &parts {
            tokens.extend_from_slice(p);
            tokens.extend(std::iter::repeat_n(0, longest - p.len()));
        }
        let x = Array::from_slice(&tokens, &[parts.len() as i32, longest as i32]).expect("x");
        if padding.iter().any(|&p| p > 0) {
            self.cache
                .prepare_right_padding(&lengths, &padding)
                .expect("prepare");
        }
        model.forward(&x, self.cache.layers_mut()).expect("prefill");
        self.cache.finalize().expect("finalize");
        for (r, n) in self.rows.iter_mut().zip(&lengths) {
            r.1 += *n as usize;
        }
        let ready: Vec<usize> = (0..self.rows.len())
            .filter(|&b| self.rows[b].1 + 1 == prompts[self.rows[b].0].len())
            .collect();
        let ids: Vec<usize> = ready.iter().map(|&b| self.rows[b].0).collect();
        let cache = self.cache.split(&ready).expect("split");
        self.rows = (0..self.rows.len())
            .filter(|b| !ready.contains(b))
            .map(|b| self.rows[b])
            .collect();
        assert_eq!(self.cache.rows(), self.rows.len());
        Some((ids, cache))
    }
}

/// `exact`: logits bit-identical; otherwise within 1e-4 and the same greedy tokens.
/// `together`: prompts are prefilled together (right-padded chunks) instead of alone.
fn check_model(name: &str, exact: bool, together: bool) {
    let (model, _) = mlx_models::load_model(models_dir().join(name)).expect("load model");
    let model = model.as_ref();
    let prompts = prompts(model.vocab_size());
    let want: Vec<(Vec<Array>, PromptCache)> = prompts.iter().map(|p| alone(model, p)).collect();
    // Rows 0 and 1 start together, row 2 joins after 2 steps, row 3 after 4; each leaves
    // after STEPS tokens.
    let joins = [0usize, 0, 2, 4];
    let mut batch = BatchPromptCache::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut finished = 0;
    let mut prefilling = Prefilling::default();
    for step in 0.. {
        let mut joining: Vec<usize> = (0..prompts.len()).filter(|&i| joins[i] == step).collect();
        if together {
            prefilling.add(model, &joining);
            joining.clear();
            if let Some((ids, cache)) = prefilling.chunk(model, &prompts) {
                batch.extend(cache).expect("extend");
                for i in ids {
                    rows.push(Row {
                        id: i,
                        next: *prompts[i].last().expect("prompt"),
                        logits: Vec::new(),
                    });
                }
            }
        }
        if !joining.is_empty() {
            let caches: Vec<PromptCache> = joining
                .iter()
                .map(|&i| prefill(model, &prompts[i]))
                .collect();
            let refs: Vec<&[Box<dyn KvCache>]> = caches.iter().map(|c| c.as_slice()).collect();
            batch
                .extend(BatchPromptCache::merge(&refs).expect("merge"))
                .expect("extend");
            for i in joining {
                rows.push(Row {
                    id: i,
                    next: *prompts[i].last().expect("prompt"),
                    logits: Vec::new(),
                });
            }
        }
        if rows.is_empty() {
            if step > joins[joins.len() - 1] && prefilling.rows.is_empty() {
                break;
            }
            continue;
        }
        let toks: Vec<u32> = rows.iter().map(|r| r.next).collect();
        let x = Array::from_slice(&toks, &[toks.len() as i32, 1]).expect("tokens");
        let logits = model.forward(&x, batch.layers_mut()).expect("batched step");
        for (b, r) in rows.iter_mut().enumerate() {
            let l = last_logits(&logits, b as i32);
            r.next = greedy(&l);
            r.logits.push(l);
        }
        let keep: Vec<usize> = (0..rows.len())
            .filter(|&b| rows[b].logits.len() < STEPS)
            .collect();
        for (b, r) in rows.iter().enumerate() {
            if keep.contains(&b) {
                continue;
            }
            let (want_logits, want_caches) = &want[r.id];
            for (s, (got, exp)) in r.logits.iter().zip(want_logits).enumerate() {
                let what = format!("{name}: prompt {} step {s}", r.id);
                if exact {
                    let same = got.array_equal(exp, false).and_then(|a| a.item::<bool>());
                    assert!(
                        same.expect("compare"),
                        "{what}: batched logits differ from alone (max |diff| {})",
                        max_diff(got, exp)
                    );
                } else {
                    assert!(max_diff(got, exp) < 1e-4, "{what}: {}", max_diff(got, exp));
                    assert_eq!(greedy(got), greedy(exp), "{what}: greedy token");
                }
            }
            let extracted = batch.extract(b).expect("extract");
            for (l, (got, exp)) in extracted.iter().zip(want_caches).enumerate() {
                assert_eq!(
                    got.offset(),
                    exp.offset(),
                    "{name} prompt {} layer {l}",
                    r.id
                );
                let (gk, ek) = (cache_keys(got.as_ref()), cache_keys(exp.as_ref()));
                assert_eq!(gk.shape(), ek.shape(), "{name} prompt {} layer {l}", r.id);
                let diff = max_diff(
                    &gk.astype(Dtype::Float32).expect("cast"),
                    &ek.astype(Dtype::Float32).expect("cast"),
                );
                let bound = if exact { 0.0 } else { 1e-4 };
                assert!(
                    diff <= bound,
                    "{name} prompt {} layer {l}: keys differ by {diff}",
                    r.id
                );
            }
            finished += 1;
        }
        rows = keep
            .iter()
            .map(|&b| {
                std::mem::replace(
                    &mut rows[b],
                    Row {
                        id: 0,
                        next: 0,
                        logits: Vec::new(),
                    },
                )
            })
            .collect();
        batch.filter(&keep).expect("filter");
        assert_eq!(batch.rows(), rows.len());
    }
    assert_eq!(finished, prompts.len(), "{name}");
}

/// A state-space model's SSD scan sums a prompt's positions in chunk-sized blocks, so a
/// prompt prefilled in chunks of [`CHUNK`] (together) rounds differently from one
/// prefilled at once (alone), as in mlx-lm; decoding in a batch is still exact.
#[test]
fn batched_decode_equals_alone_mamba2() {
    check_model("mamba2-small-f32", true, false);
}

#[test]
fn prefilled_together_matches_alone_mamba2_chunked_scan() {
    check_model("mamba2-small-f32", false, true);
}

#[test]
fn batched_decode_equals_alone_falcon_h1() {
    check_model("falcon_h1-small-f32", true, false);
}

#[test]
fn prefilled_together_matches_alone_falcon_h1_chunked_scan() {
    check_model("falcon_h1-small-f32", false, true);
}

#[test]
fn batched_decode_equals_alone_plamo2() {
    check_model("plamo2-small-f32", true, false);
}

#[test]
fn prefilled_together_matches_alone_plamo2_chunked_scan() {
    check_model("plamo2-small-f32", false, true);
}

#[test]
fn batched_decode_equals_alone_gear() {
    // Within 1e-4: rotating caches and left-padded keys in the soft-capped scores.
    check_model("gear-small-f32", false, false);
}

#[test]
fn prefilled_together_matches_alone_gear() {
    check_model("gear-small-f32", false, true);
}

#[test]
fn batched_decode_equals_alone_granitemoehybrid() {
    check_model("granitemoehybrid-small-f32", true, false);
}

#[test]
fn prefilled_together_matches_alone_granitemoehybrid_chunked_scan() {
    check_model("granitemoehybrid-small-f32", false, true);
}

// mamba's block takes no padding mask (as mlx-lm's): only decoding is batched.
#[test]
fn batched_decode_equals_alone_mamba() {
    check_model("mamba-small-f32", true, false);
}

// Jamba's mixer takes no padding mask either (as mlx-lm's): only decoding is batched.
#[test]
fn batched_decode_equals_alone_jamba() {
    check_model("jamba-small-f32", true, false);
}

// OLMo Hybrid's convolutions take no padding mask (as mlx-lm's): only decoding is batched.
#[test]
fn batched_decode_equals_alone_olmo_hybrid() {
    check_model("olmo_hybrid-small-f32", true, false);
}

// RecurrentGemma's recurrent blocks take no padding mask (as mlx-lm's): only decoding is
// batched; its local attention's rotating caches put it within 1e-4 of alone, as the
// other sliding models.
#[test]
fn batched_decode_matches_alone_recurrent_gemma() {
    check_model("recurrent_gemma-small-f32", false, false);
}

// LongCat-Flash: a CacheList of two latent KV caches per layer.
#[test]
fn batched_decode_equals_alone_longcat_flash() {
    check_model("longcat_flash-small-f32", true, false);
}

#[test]
fn prefilled_together_matches_alone_longcat_flash() {
    check_model("longcat_flash-small-f32", false, true);
}

// RWKV-7's blocks take no padding mask (as mlx-lm's): only decoding is batched.
#[test]
fn batched_decode_equals_alone_rwkv7() {
    check_model("rwkv7-small-f32", true, false);
}

#[test]
fn batched_decode_equals_alone_nemotron_h() {
    check_model("nemotron_h-small-f32", true, false);
}

// Baichuan-M1: each layer a CacheList of the convolution's state (ArraysCache) and its
// keys and values, rotating on the sliding layers: within 1e-4 with the same tokens, as
// the other sliding hybrids (with global layers only it is bit-exact). Its convolution
// keeps no lengths (as mlx-lm's), so only decoding is batched.
#[test]
fn batched_decode_matches_alone_baichuan_m1_sliding() {
    check_model("baichuan_m1-small-f32", false, false);
}

// No right-padded prefill test for nemotron_h: mlx-lm's mixer gives the scan no lengths,
// so the state carried out of a chunk is read at the padded last position, and a row
// shorter than the chunk loses that chunk's tokens from it (in mlx-lm as here); the
// server does not form batches of hybrid models yet.

macro_rules! model_tests {
    ($($test:ident, $together:ident => $dir:literal, $exact:literal;)*) => {$(
        #[test]
        fn $test() {
            check_model($dir, $exact, false);
        }
        #[test]
        fn $together() {
            check_model($dir, $exact, true);
        }
    )*};
}

model_tests! {
    batched_decode_equals_alone_gemma2, prefilled_together_equals_alone_gemma2
        => "gemma2-small-f32", true;
    batched_decode_matches_alone_gemma3_text_sliding,
    prefilled_together_matches_alone_gemma3_text_sliding => "gemma3_text-small-bf16", false;
    batched_decode_equals_alone_llama_bias, prefilled_together_equals_alone_llama_bias
        => "llama-small-bf16-untied-bias", true;
    batched_decode_equals_alone_llama_hd32, prefilled_together_equals_alone_llama_hd32
        => "llama-small-f32-hd32", true;
    batched_decode_matches_alone_llama_sliding_llama3_rope,
    prefilled_together_matches_alone_llama_sliding_llama3_rope
        => "llama-small-f32-sliding-llama3", false;
    batched_decode_equals_alone_llama_tied, prefilled_together_equals_alone_llama_tied
        => "llama-small-f32-tied", true;
    batched_decode_equals_alone_llama_mxfp4, prefilled_together_equals_alone_llama_mxfp4
        => "llama-small-mxfp4", true;
    batched_decode_equals_alone_llama_q4, prefilled_together_equals_alone_llama_q4
        => "llama-small-q4-g32", true;
    batched_decode_equals_alone_mixtral, prefilled_together_equals_alone_mixtral
        => "mixtral-small-f32", true;
    batched_decode_equals_alone_phi3_longrope, prefilled_together_equals_alone_phi3_longrope
        => "phi3-small-f32-longrope", true;
    batched_decode_equals_alone_qwen2, prefilled_together_equals_alone_qwen2
        => "qwen2-small-f32", true;
    batched_decode_equals_alone_qwen3, prefilled_together_equals_alone_qwen3
        => "qwen3-small-bf16", true;
    batched_decode_equals_alone_qwen3_q8, prefilled_together_equals_alone_qwen3_q8
        => "qwen3-small-q8-g32", true;
    batched_decode_equals_alone_qwen3_next, prefilled_together_equals_alone_qwen3_next
        => "qwen3_next-small-f32", true;
    batched_decode_equals_alone_qwen3_5, prefilled_together_equals_alone_qwen3_5
        => "qwen3_5-small-f32", true;
    batched_decode_equals_alone_qwen3_5_moe, prefilled_together_equals_alone_qwen3_5_moe
        => "qwen3_5_moe-small-f32", true;
    batched_decode_equals_alone_lfm2, prefilled_together_equals_alone_lfm2
        => "lfm2-small-f32", true;
    batched_decode_equals_alone_qwen3_moe, prefilled_together_equals_alone_qwen3_moe
        => "qwen3_moe-small-f32", true;
    batched_decode_equals_alone_gemma, prefilled_together_equals_alone_gemma
        => "gemma-small-f32", true;
    batched_decode_matches_alone_cohere2_sliding,
    prefilled_together_matches_alone_cohere2_sliding => "cohere2-small-f32", false;
    batched_decode_matches_alone_exaone4_hybrid,
    prefilled_together_matches_alone_exaone4_hybrid => "exaone4-small-f32-hybrid", false;
    batched_decode_equals_alone_glm4, prefilled_together_equals_alone_glm4
        => "glm4-small-f32", true;
    batched_decode_equals_alone_qwen2_moe, prefilled_together_equals_alone_qwen2_moe
        => "qwen2_moe-small-f32", true;
    batched_decode_matches_alone_ministral3_sliding,
    prefilled_together_matches_alone_ministral3_sliding => "ministral3-small-f32-sliding", false;
    batched_decode_matches_alone_gpt_oss_sliding_sinks,
    prefilled_together_matches_alone_gpt_oss_sliding_sinks => "gpt_oss-small-f32", false;
    batched_decode_equals_alone_granite, prefilled_together_equals_alone_granite
        => "granite-small-f32", true;
    batched_decode_equals_alone_olmo2, prefilled_together_equals_alone_olmo2
        => "olmo2-small-f32", true;
    batched_decode_matches_alone_olmo3_sliding, prefilled_together_matches_alone_olmo3_sliding
        => "olmo3-small-f32", false;
    batched_decode_equals_alone_smollm3_nope, prefilled_together_equals_alone_smollm3_nope
        => "smollm3-small-f32", true;
    batched_decode_equals_alone_starcoder2, prefilled_together_equals_alone_starcoder2
        => "starcoder2-small-f32", true;
    batched_decode_equals_alone_seed_oss, prefilled_together_equals_alone_seed_oss
        => "seed_oss-small-f32", true;
    // Issue 26, dense and MoE families.
    batched_decode_equals_alone_olmoe, prefilled_together_equals_alone_olmoe
        => "olmoe-small-f32", true;
    batched_decode_equals_alone_mimo, prefilled_together_equals_alone_mimo
        => "mimo-small-f32", true;
    batched_decode_equals_alone_helium, prefilled_together_equals_alone_helium
        => "helium-small-f32", true;
    batched_decode_equals_alone_ernie4_5, prefilled_together_equals_alone_ernie4_5
        => "ernie4_5-small-f32", true;
    batched_decode_equals_alone_internlm3, prefilled_together_equals_alone_internlm3
        => "internlm3-small-f32", true;
    batched_decode_equals_alone_glm4_moe, prefilled_together_equals_alone_glm4_moe
        => "glm4_moe-small-f32", true;
    batched_decode_equals_alone_solar_open, prefilled_together_equals_alone_solar_open
        => "solar_open-small-f32", true;
    batched_decode_equals_alone_ernie4_5_moe, prefilled_together_equals_alone_ernie4_5_moe
        => "ernie4_5_moe-small-f32", true;
    batched_decode_equals_alone_qwen2_vl, prefilled_together_equals_alone_qwen2_vl
        => "qwen2_vl-small-f32", true;
    batched_decode_equals_alone_qwen3_vl, prefilled_together_equals_alone_qwen3_vl
        => "qwen3_vl-small-f32", true;
    batched_decode_equals_alone_hunyuan_v1_dense, prefilled_together_equals_alone_hunyuan_v1_dense
        => "hunyuan_v1_dense-small-f32", true;
    // Issue 26, multi-head latent attention families.
    batched_decode_equals_alone_deepseek_v3, prefilled_together_equals_alone_deepseek_v3
        => "deepseek_v3-small-f32", true;
    batched_decode_equals_alone_kimi_k25, prefilled_together_equals_alone_kimi_k25
        => "kimi_k25-small-f32", true;
    batched_decode_equals_alone_glm4_moe_lite, prefilled_together_equals_alone_glm4_moe_lite
        => "glm4_moe_lite-small-f32", true;
    batched_decode_equals_alone_deepseek_v2, prefilled_together_equals_alone_deepseek_v2
        => "deepseek_v2-small-f32", true;
    batched_decode_equals_alone_minicpm3, prefilled_together_equals_alone_minicpm3
        => "minicpm3-small-f32", true;
    // The indexer of a batch sees the rows' left padding (masked out) and picks among
    // as many positions as the longest row, so the attended positions are the same but
    // gathered in another order than alone (as in mlx-lm): equal to float rounding.
    batched_decode_matches_alone_deepseek_v32_indexer,
    prefilled_together_matches_alone_deepseek_v32_indexer => "deepseek_v32-small-f32", false;
    batched_decode_matches_alone_glm_moe_dsa_indexer,
    prefilled_together_matches_alone_glm_moe_dsa_indexer => "glm_moe_dsa-small-f32", false;
    batched_decode_equals_alone_lfm2_moe, prefilled_together_equals_alone_lfm2_moe
        => "lfm2_moe-small-f32", true;
    // Issue 26, wave 2 part B.
    batched_decode_equals_alone_phi, prefilled_together_equals_alone_phi
        => "phi-small-f32", true;
    batched_decode_equals_alone_phimoe, prefilled_together_equals_alone_phimoe
        => "phimoe-small-f32-longrope", true;
    batched_decode_equals_alone_granitemoe, prefilled_together_equals_alone_granitemoe
        => "granitemoe-small-f32", true;
    batched_decode_equals_alone_internlm2, prefilled_together_equals_alone_internlm2
        => "internlm2-small-f32-bias", true;
    batched_decode_equals_alone_exaone, prefilled_together_equals_alone_exaone
        => "exaone-small-f32", true;
    batched_decode_equals_alone_cohere, prefilled_together_equals_alone_cohere
        => "cohere-small-f32-qknorm", true;
    batched_decode_equals_alone_minicpm, prefilled_together_equals_alone_minicpm
        => "minicpm-small-f32", true;
    batched_decode_equals_alone_nemotron, prefilled_together_equals_alone_nemotron
        => "nemotron-small-f32", true;
    batched_decode_equals_alone_gpt_neox, prefilled_together_equals_alone_gpt_neox
        => "gpt_neox-small-f32", true;
    batched_decode_equals_alone_gpt2, prefilled_together_equals_alone_gpt2
        => "gpt2-small-f32", true;
    batched_decode_equals_alone_gpt_bigcode, prefilled_together_equals_alone_gpt_bigcode
        => "gpt_bigcode-small-f32", true;
    batched_decode_equals_alone_stablelm, prefilled_together_equals_alone_stablelm
        => "stablelm-small-f32-qknorm", true;
    batched_decode_equals_alone_qwen3_vl_moe, prefilled_together_equals_alone_qwen3_vl_moe
        => "qwen3_vl_moe-small-f32", true;
    batched_decode_equals_alone_dots1, prefilled_together_equals_alone_dots1
        => "dots1-small-f32", true;
    batched_decode_equals_alone_minimax, prefilled_together_equals_alone_minimax
        => "minimax-small-f32", true;
    // Sliding layers (rotating caches), as exaone4's hybrid: within 1e-4, same tokens.
    batched_decode_matches_alone_exaone_moe_hybrid,
    prefilled_together_matches_alone_exaone_moe_hybrid => "exaone_moe-small-f32", false;
    // OLMo: attention written out with plain ops under the batch caches' array masks.
    batched_decode_equals_alone_olmo, prefilled_together_equals_alone_olmo
        => "olmo-small-f32", true;
    // Hunyuan: cross-layer attention (every layer its own cache, the odd ones filled
    // from the k/v projections of the layer before).
    batched_decode_equals_alone_hunyuan_cla, prefilled_together_equals_alone_hunyuan_cla
        => "hunyuan-small-f32", true;
    // Apertus: XieLU MLPs, q/k norms before RoPE.
    batched_decode_equals_alone_apertus, prefilled_together_equals_alone_apertus
        => "apertus-small-f32", true;
    // Qwen (v1): one c_attn split in three, a biased head.
    batched_decode_equals_alone_qwen, prefilled_together_equals_alone_qwen
        => "qwen-small-f32", true;
    // GPT-J: parallel attention and MLP, partial traditional RoPE.
    batched_decode_equals_alone_gptj, prefilled_together_equals_alone_gptj
        => "gptj-small-f32", true;
    // GLM: traditional RoPE, fused gate_up_proj.
    batched_decode_equals_alone_glm, prefilled_together_equals_alone_glm
        => "glm-small-f32", true;
    // OpenELM: per-layer head counts (per-layer cache shapes) and FFN widths.
    batched_decode_equals_alone_openelm, prefilled_together_equals_alone_openelm
        => "openelm-small-f32", true;
    // nanochat: weightless norms, q/k normed after RoPE, soft-capped logits.
    batched_decode_equals_alone_nanochat, prefilled_together_equals_alone_nanochat
        => "nanochat-small-f32", true;
    // Mistral 4: latent attention decoding, prompts through the concatenated halves,
    // Llama 4's query scale at each row's offset.
    batched_decode_equals_alone_mistral4, prefilled_together_equals_alone_mistral4
        => "mistral4-small-f32", true;
    // DeepSeek-MoE v1: softmax experts beside shared ones.
    batched_decode_equals_alone_deepseek, prefilled_together_equals_alone_deepseek
        => "deepseek-small-f32", true;
    // DBRX: the clipped fused Wqkv, experts run token by token.
    batched_decode_equals_alone_dbrx, prefilled_together_equals_alone_dbrx
        => "dbrx-small-f32", true;
    // Phixtral: parallel attention (float32 queries) and SwitchMLP experts.
    batched_decode_equals_alone_phixtral, prefilled_together_equals_alone_phixtral
        => "phixtral-small-f32", true;
    // TeleChat3: Llama-shaped, untied.
    batched_decode_equals_alone_telechat3, prefilled_together_equals_alone_telechat3
        => "telechat3-small-f32", true;
    // Nanbeige: the layers run twice, a cache per layer and run.
    batched_decode_equals_alone_nanbeige, prefilled_together_equals_alone_nanbeige
        => "nanbeige-small-f32", true;
    // Lille 130M: the fused qkv_proj, traditional RoPE, norms inside the blocks, tied.
    batched_decode_equals_alone_lille_130m, prefilled_together_equals_alone_lille_130m
        => "lille-130m-small-f32", true;
    // Pixtral: a Llama text model under language_model, untied.
    batched_decode_equals_alone_pixtral, prefilled_together_equals_alone_pixtral
        => "pixtral-small-f32", true;
    // LFM2-VL: LFM2 under language_model, its convolution states and KV caches.
    batched_decode_equals_alone_lfm2_vl, prefilled_together_equals_alone_lfm2_vl
        => "lfm2-vl-small-f32", true;
    // Kimi-VL: DeepSeek-V3's MLA and routed experts under language_model.
    batched_decode_equals_alone_kimi_vl, prefilled_together_equals_alone_kimi_vl
        => "kimi_vl-small-f32", true;
    // Nemotron-NAS: a full layer, then one without attention (a linear FFN).
    batched_decode_equals_alone_nemotron_nas, prefilled_together_equals_alone_nemotron_nas
        => "nemotron-nas-small-f32", true;
    // Youtu-LLM: keys expanded from the compressed projection, traditional RoPE, tied.
    batched_decode_equals_alone_youtu_llm, prefilled_together_equals_alone_youtu_llm
        => "youtu_llm-small-f32", true;
    // Klear: sigmoid-routed experts with expert_bias, shared experts mixed by coefficients.
    batched_decode_equals_alone_klear, prefilled_together_equals_alone_klear
        => "Klear-small-f32", true;
    // Mellum: a sliding layer (rotating cache of 4) and a global one, experts in both;
    // within 1e-4 with the same tokens, as the other sliding models.
    batched_decode_matches_alone_mellum_sliding, prefilled_together_matches_alone_mellum_sliding
        => "mellum-small-f32", false;
    // Talkie: weightless norms, negated-frequency RoPE, gains, the embedding skip.
    batched_decode_equals_alone_talkie, prefilled_together_equals_alone_talkie
        => "talkie-small-f32", true;
    // PLaMo: parallel layers, key heads tiled after the cache.
    batched_decode_equals_alone_plamo, prefilled_together_equals_alone_plamo
        => "plamo-small-f32", true;
    // IQuest-Loop-Coder: two runs of the layers, the second over rotating caches of 4.
    batched_decode_matches_alone_iquestloopcoder, prefilled_together_matches_alone_iquestloopcoder
        => "iquestloopcoder-small-f32", false;
    // Muse Glimmer: sliding RoPE layers and a NoPE full one, a gated attention output.
    batched_decode_matches_alone_muse_glimmer_sliding,
    prefilled_together_matches_alone_muse_glimmer_sliding => "muse_glimmer-small-f32", false;
    // Spark 2.5: sliding and full layers with partial RoPE, one gate per head.
    batched_decode_matches_alone_spark2_5_sliding,
    prefilled_together_matches_alone_spark2_5_sliding => "spark2_5-small-f32", false;
    // Laguna: per-layer query heads, a softplus gate per head, sliding and full layers,
    // routed experts plus a shared one.
    batched_decode_matches_alone_laguna_sliding,
    prefilled_together_matches_alone_laguna_sliding => "laguna-small-f32", false;
    // MiMo-V2-Flash: sliding layers with sinks and their own head sizes, a full one,
    // grouped experts plus shared ones.
    batched_decode_matches_alone_mimo_v2_flash_sliding,
    prefilled_together_matches_alone_mimo_v2_flash_sliding => "mimo_v2_flash-small-f32", false;
    // AFMoE: sandwich norms, RoPE on the sliding layers only, a gated attention output,
    // grouped sigmoid-routed experts plus a shared one.
    batched_decode_matches_alone_afmoe_sliding,
    prefilled_together_matches_alone_afmoe_sliding => "afmoe-small-f32", false;
    // Step 3.5: sliding layers with their own heads, a sigmoid gate per head, clamped
    // SwiGLUs, routed experts plus a shared one.
    batched_decode_matches_alone_step3p5_sliding,
    prefilled_together_matches_alone_step3p5_sliding => "step3p5-small-f32", false;
    // Bailing MoE: the fused query_key_value split per row, routed experts.
    batched_decode_equals_alone_bailing_moe, prefilled_together_equals_alone_bailing_moe
        => "bailing_moe-small-f32", true;
    // Gemma 4: fewer caches than layers (the KV-shared layers read an earlier layer's).
    batched_decode_matches_alone_gemma4_text_shared_kv,
    prefilled_together_matches_alone_gemma4_text_shared_kv => "gemma4_text-small-f32", false;
    batched_decode_matches_alone_gemma4_text_experts,
    prefilled_together_matches_alone_gemma4_text_experts => "gemma4_text-small-f32-moe", false;
    batched_decode_matches_alone_gemma3n,
    prefilled_together_matches_alone_gemma3n => "gemma3n-small-f32", false;
}

// PLaMo 3: offset norms, a sliding layer and a full one. mlx-lm masks the sliding layers
// with a window of `window_size + 1` over a `RotatingKVCache(window_size)`, which keeps
// `window_size - 1` earlier positions for a multi-token call: a prompt prefilled in
// chunks sees one position fewer at each later chunk's start than one prefilled at once
// (in mlx-lm as here), so only batched decoding is compared with alone; the chunked,
// right-padded prefill is checked against mlx-lm's `batch_generate` (mlx-engine's
// batch_generate test).
#[test]
fn batched_decode_matches_alone_plamo3_sliding() {
    check_model("plamo3-small-f32", false, false);
}

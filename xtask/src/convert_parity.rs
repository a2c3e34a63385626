//! The convert section of `cargo xtask parity`: `mlx_lm.convert` against `mlx-convert`.
//!
//! For tiny checkpoints of the parity set (given a small tokenizer by
//! `xtask/py/convert_oracle.py prepare`), both converters run with the same flags (every
//! mode, bit width, mixed recipe, `--dtype`, `-d`, quantized sources, and flag sets mlx-lm
//! refuses). Checked per case: the same tensors (names, dtypes, shapes, bytes), configs
//! equal up to key order, the same index and model card, or both refusing. Then mlx-lm
//! loads our outputs and we load mlx-lm's, and both greedy-decode the same prompt: all
//! four token sequences must agree. Last, the default SmolLM2 GGUF is converted by us
//! (plain and `-d`), compared with mlx-lm's conversion of the same import, and loaded and
//! run by mlx-lm. `MLX_CONVERT_FILTER=a,b` runs only the cases whose name contains one
//! of those strings.
use anyhow::{bail, Context, Result};
use mlx_array::quant::QuantMode;
use mlx_array::{Array, Dtype};
use mlx_quant::{convert, ConvertOptions, Recipe};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const ORACLE: &str = "xtask/py/convert_oracle.py";
const PROMPT: [i32; 7] = [1, 17, 33, 2, 90, 5, 64];
const STEPS: usize = 6;
const SMOL_TEXT: &str = "The capital of France is";
const SMOL_STEPS: usize = 8;

/// (label, parity variant, torch_dtype written into the copy's config).
///
/// gemma2's tiny config has `query_pre_attn_scalar: 16.0`, which mlx-lm's strict
/// dataclass refuses (it wants an int) while our loader accepts it; the copy gets `16`.
const SOURCES: &[(&str, &str, Option<&str>)] = &[
    ("llama", "llama-f32-untied-bias-gqa4", None),
    ("llama-tied", "llama-f32-tied", None),
    ("llama-td-bf16", "llama-f32-tied", Some("bfloat16")),
    ("llama-bf16-td-f32", "llama-bf16", Some("float32")),
    ("mistral-sharded", "mistral-f32-sharded", None),
    ("qwen2", "qwen2-f32-tied", None),
    ("qwen3", "qwen3-f32-untied-gqa4", None),
    ("phi3", "phi3-f32", None),
    ("gemma2", "gemma2-f32", None),
    ("gemma3_text", "gemma3_text-f32-untied", None),
    ("gemma3-mm", "gemma3-f32-multimodal", None),
    ("qwen3_moe", "qwen3_moe-f32", None),
    ("mixtral", "mixtral-f32", None),
    ("granite", "granite-f32-untied-bias", None),
    ("smollm3", "smollm3-f32-tied", None),
    ("olmo2", "olmo2-f32", None),
    ("olmo3", "olmo3-f32", None),
    ("starcoder2", "starcoder2-f32-untied-mha", None),
    ("gemma", "gemma-f32", None),
    ("gpt_oss", "gpt_oss-f32", None),
    ("glm4", "glm4-f32", None),
    ("qwen2_moe", "qwen2_moe-f32", None),
    ("exaone4", "exaone4-f32-hybrid", None),
    ("seed_oss", "seed_oss-f32-untied-out-bias", None),
    ("cohere2", "cohere2-f32-bias-pattern2", None),
    ("ministral3", "ministral3-f32-sliding-untied", None),
    ("mistral3-mm", "mistral3-f32-ministral3", None),
    ("mistral3-mistral", "mistral3-f32-mistral", None),
    ("gpt_oss-hf-mxfp4", "gpt_oss-bf16-hf-mxfp4", None),
    ("q-llama-q4", "llama-q4-g32", None),
    ("q-llama-mixed", "llama-q4-mixed", None),
    ("q-llama-mxfp4", "llama-mxfp4", None),
    ("q-llama-bf16-q4", "llama-bf16-q4", None),
    ("q-qwen3_moe", "qwen3_moe-q4", None),
    // Issue 26, dense and MoE families.
    ("olmoe", "olmoe-f32-untied-bias-normtopk", None),
    ("mimo", "mimo-f32-mtp", None),
    ("helium", "helium-f32", None),
    ("ernie4_5", "ernie4_5-f32-bias-untied-hd8", None),
    ("internlm3", "internlm3-f32-bias-tied-dynamic", None),
    ("glm4_moe", "glm4_moe-f32-mtp", None),
    // Not the list-valued layer indices: transformers' strict config class refuses those
    // in mlx_lm.convert (mlx-lm's model and ours read them).
    ("ernie4_5_moe", "ernie4_5_moe-f32-mtp", None),
    ("qwen2_5_vl", "qwen2_5_vl-f32-nested-untied", None),
    ("qwen3_vl", "qwen3_vl-f32-nested-untied", None),
    ("hunyuan_v1_dense", "hunyuan_v1_dense-f32-tied-noqk", None),
    // Issue 26, wave 2 part B.
    ("phi", "phi-f32-mha-rotary04", None),
    ("phimoe", "phimoe-f32-longrope", None),
    ("granitemoe", "granitemoe-f32-untied-bias", None),
    ("internlm2", "internlm2-f32-bias-tied-gqa4-dynamic", None),
    ("exaone", "exaone-f32-tied-bias-llama3", None),
    ("cohere", "cohere-f32-bias-noqknorm", None),
    ("minicpm", "minicpm-f32-traditional-linear", None),
    ("nemotron", "nemotron-f32-tied-bias-linear", None),
    ("gpt_neox", "gpt_neox-f32", None),
    ("gpt2", "gpt2-f32", None),
    ("gpt_bigcode", "gpt_bigcode-f32-mha-untied-nobias", None),
    ("stablelm", "stablelm-f32-qknorm", None),
    ("qwen3_vl_moe", "qwen3_vl_moe-f32-nested", None),
    ("dots1", "dots1-f32-tied-one-group", None),
    // Issue 26, hybrid and state-space families.
    ("qwen3_next", "qwen3_next-f32", None),
    ("qwen3_5", "qwen3_5-f32", None),
    ("qwen3_5_moe", "qwen3_5_moe-f32", None),
    ("lfm2", "lfm2-f32", None),
    ("mamba2", "mamba2-f32", None),
    ("granitemoehybrid", "granitemoehybrid-f32", None),
    ("nemotron_h", "nemotron_h-f32", None),
    ("mamba", "mamba-f32", None),
    ("lfm2_moe", "lfm2_moe-f32", None),
    ("falcon_h1", "falcon_h1-f32-rmsnorm-untied-biases", None),
    ("q-qwen3_next", "qwen3_next-q4", None),
    // Issue 26, multi-head latent attention families.
    ("deepseek_v3", "deepseek_v3-f32", None),
    ("kimi_k25", "kimi_k25-f32", None),
    ("glm4_moe_lite", "glm4_moe_lite-f32-mtp", None),
    (
        "deepseek_v2",
        "deepseek_v2-f32-noqlora-grouplimited-bias-hd32",
        None,
    ),
    ("q-deepseek_v3-kvb", "deepseek_v3-bf16-q4-kvb", None),
    ("minicpm3", "minicpm3-f32", None),
    // Issue 26, chunked attention.
    ("llama4", "llama4-f32", None),
    ("llama4_text", "llama4_text-f32", None),
    ("q-llama4", "llama4-q4", None),
    ("minimax", "minimax-f32", None),
    ("minimax-fp8", "minimax-fp8", None),
    ("exaone_moe", "exaone_moe-f32", None),
    ("olmo", "olmo-f32", None),
    ("olmo-tied", "olmo-f32-tied-ratio-traditional", None),
    ("q-olmo", "olmo-q4", None),
    ("hunyuan", "hunyuan-f32", None),
    ("hunyuan-fused", "hunyuan-f32-dense-fused", None),
    ("q-hunyuan", "hunyuan-q4", None),
    ("baichuan_m1", "baichuan_m1-f32", None),
    ("q-baichuan_m1", "baichuan_m1-q4", None),
    (
        "bailing_moe",
        "bailing_moe-f32-sigmoid-groups-bias-qknorm-partial",
        None,
    ),
    (
        "bailing_moe-normhead",
        "bailing_moe-f32-normhead-noshared",
        None,
    ),
    ("q-bailing_moe", "bailing_moe-q4", None),
    ("glm_moe_dsa", "glm_moe_dsa-f32-mtp", None),
    ("solar_open", "solar_open-f32-mtp", None),
    ("apertus", "apertus-f32", None),
    ("q-apertus", "apertus-q4", None),
    ("qwen-v1", "qwen-f32-bias", None),
    ("q-qwen-v1", "qwen-q4", None),
    ("gptj", "gptj-f32", None),
    ("q-gptj", "gptj-q4", None),
    ("glm-dense", "glm-f32", None),
    ("q-glm-dense", "glm-q4", None),
    ("openelm", "openelm-f32", None),
    ("q-openelm", "openelm-q4", None),
    ("nanochat", "nanochat-f32", None),
    ("q-nanochat", "nanochat-q4", None),
    ("mistral4", "mistral4-f32", None),
    ("fp8-mistral4", "mistral4-fp8", None),
    ("deepseek", "deepseek-f32", None),
    ("q-deepseek", "deepseek-q4", None),
    ("dbrx", "dbrx-f32", None),
    ("q-dbrx", "dbrx-q4", None),
    ("phixtral", "phixtral-f32", None),
    ("q-phixtral", "phixtral-q4", None),
    ("telechat3", "telechat3-f32", None),
    ("q-telechat3", "telechat3-q4", None),
    ("nanbeige", "nanbeige-f32", None),
    ("q-nanbeige", "nanbeige-q4", None),
    ("lille-130m", "lille-130m-f32", None),
    ("q-lille-130m", "lille-130m-q4", None),
    ("pixtral", "pixtral-f32", None),
    ("q-pixtral", "pixtral-q4", None),
    ("lfm2-vl", "lfm2-vl-f32", None),
    ("kimi_vl", "kimi_vl-f32", None),
    ("nemotron-nas", "nemotron-nas-f32", None),
    ("q-nemotron-nas", "nemotron-nas-q4", None),
    ("youtu_llm", "youtu_llm-f32", None),
    ("q-youtu_llm", "youtu_llm-q4", None),
    ("Klear", "Klear-f32", None),
    ("q-Klear", "Klear-q4", None),
    ("mellum", "mellum-f32", None),
    ("q-mellum", "mellum-q4", None),
    ("talkie", "talkie-f32", None),
    ("q-talkie", "talkie-q4", None),
    ("plamo", "plamo-f32", None),
    ("q-plamo", "plamo-q4", None),
    ("iquestloopcoder", "iquestloopcoder-f32", None),
    ("q-iquestloopcoder", "iquestloopcoder-q4", None),
    ("plamo3", "plamo3-f32", None),
    ("q-plamo3", "plamo3-q4", None),
    ("muse_glimmer", "muse_glimmer-f32", None),
    ("q-muse_glimmer", "muse_glimmer-q4", None),
    (
        "muse_glimmer-nested",
        "muse_glimmer-f32-nested-tied-layertypes",
        None,
    ),
    ("spark2_5", "spark2_5-f32", None),
    ("q-spark2_5", "spark2_5-q4", None),
    (
        "spark2_5-hf",
        "spark2_5-f32-bias-untied-layertypes-hd32",
        None,
    ),
    ("laguna", "laguna-f32", None),
    ("q-laguna", "laguna-q4", None),
    (
        "laguna-prefixed",
        "laguna-f32-softcap-sqrtsoftplus-nogate-tied-hd32",
        None,
    ),
    ("mimo_v2_flash", "mimo_v2_flash-f32", None),
    ("q-mimo_v2_flash", "mimo_v2_flash-q4", None),
    (
        "mimo_v2_flash-fp8",
        "mimo_v2_flash-f32-fp8-sinks-noshared",
        None,
    ),
    ("afmoe", "afmoe-f32", None),
    ("q-afmoe", "afmoe-q4", None),
    ("jamba", "jamba-f32", None),
    ("q-jamba", "jamba-q4", None),
    ("olmo_hybrid", "olmo_hybrid-f32", None),
    ("q-olmo_hybrid", "olmo_hybrid-q4", None),
    ("recurrent_gemma", "recurrent_gemma-f32", None),
    ("q-recurrent_gemma", "recurrent_gemma-q4", None),
    (
        "recurrent_gemma-tied",
        "recurrent_gemma-f32-altnames-tied-hd32",
        None,
    ),
    ("step3p5", "step3p5-f32", None),
    ("q-step3p5", "step3p5-q4", None),
    ("plamo2", "plamo2-f32", None),
    ("q-plamo2", "plamo2-q4", None),
    // Attention layers only: transformers refuses "conv_mixer" in `layer_types` when
    // mlx_lm.convert loads the tokenizer.
    ("gear", "gear-f32-attention-only", None),
    ("q-gear", "gear-q4-attention-only", None),
    ("rwkv7", "rwkv7-f32", None),
    ("q-rwkv7", "rwkv7-q4", None),
    ("longcat_flash", "longcat_flash-f32", None),
    ("q-lfm2-vl", "lfm2-vl-q4", None),
    ("deepseek_v32", "deepseek_v32-f32", None),
    // Issue 26, Gemma 4 (KV caches shared between layers).
    ("gemma4_text", "gemma4_text-f32", None),
    ("gemma4_text-moe", "gemma4_text-f32-moe-keqv-untied", None),
    ("gemma4-mm", "gemma4-f32-multimodal", None),
    ("q-gemma4_text-moe", "gemma4_text-bf16-moe-q4", None),
    ("gemma3n", "gemma3n-f32", None),
];

fn cases() -> Vec<(String, &'static str, Vec<String>)> {
    let mut out: Vec<(String, &'static str, Vec<String>)> = Vec::new();
    let mut add = |src: &'static str, flags: &str| {
        let name = format!(
            "{src}{}",
            flags
                .split_whitespace()
                .map(|f| f.trim_start_matches('-'))
                .fold(String::new(), |acc, f| acc + "_" + f)
        );
        out.push((
            name,
            src,
            flags.split_whitespace().map(str::to_string).collect(),
        ));
    };
    // The main model (untied head, biases): every flag.
    for flags in [
        "",
        "--dtype float16",
        "--dtype bfloat16",
        "--dtype float32",
        "-q",
        "-q --q-bits 2 --q-group-size 32",
        "-q --q-bits 3",
        "-q --q-bits 5 --q-group-size 32",
        "-q --q-bits 6",
        "-q --q-bits 8 --q-group-size 32",
        "-q --q-group-size 128",
        "-q --q-mode mxfp4",
        "-q --q-mode nvfp4",
        "-q --q-mode mxfp8",
        "-q --q-mode nvfp4 --dtype bfloat16",
        "-q --dtype bfloat16",
        "-q --dtype float16 --q-bits 8",
        "-q --quant-predicate mixed_2_6",
        "-q --quant-predicate mixed_3_4 --q-group-size 32",
        "-q --quant-predicate mixed_3_6",
        "-q --quant-predicate mixed_4_6 --q-group-size 64",
        "-q --quant-predicate mixed_3_6 --dtype bfloat16",
        "--quant-predicate mixed_3_6",
        "-q --q-mode mxfp4 --quant-predicate mixed_3_6",
        "-q -d",
        "-d",
    ] {
        add("llama", flags);
    }
    for src in [
        "llama-tied",
        "qwen2",
        "qwen3",
        "phi3",
        "gemma2",
        "gemma3_text",
    ] {
        for flags in ["", "-q", "-q --quant-predicate mixed_3_6 --q-group-size 32"] {
            add(src, flags);
        }
    }
    for flags in ["", "-q --q-group-size 32", "-q --q-mode mxfp8"] {
        add("gemma3-mm", flags);
        add("qwen3_moe", flags);
        add("mixtral", flags);
    }
    add(
        "qwen3_moe",
        "-q --quant-predicate mixed_2_6 --q-group-size 32",
    );
    // granite's own quant_predicate (8 bits for o_proj, down_proj, lm_head), which a
    // recipe replaces.
    for flags in [
        "",
        "-q",
        "-q --q-mode nvfp4",
        "-q --quant-predicate mixed_3_6 --q-group-size 32",
    ] {
        add("granite", flags);
    }
    // gpt_oss: its 8-bit router predicate; the original MXFP4 layout kept or dequantized.
    for flags in ["", "-q", "-q --q-mode mxfp4"] {
        add("gpt_oss", flags);
    }
    add("gpt_oss-hf-mxfp4", "");
    add("gpt_oss-hf-mxfp4", "-d");
    for src in [
        "smollm3",
        "olmo2",
        "olmo3",
        "starcoder2",
        "gemma",
        "ministral3",
        "mistral3-mm",
        "mistral3-mistral",
        "glm4",
        "qwen2_moe",
        "exaone4",
        "seed_oss",
        "cohere2",
        // Issue 26, dense and MoE families.
        "olmoe",
        "mimo",
        "helium",
        "ernie4_5",
        "internlm3",
        "glm4_moe",
        "ernie4_5_moe",
        "qwen2_5_vl",
        "qwen3_vl",
        "hunyuan_v1_dense",
        // Issue 26, wave 2 part B.
        "phi",
        "phimoe",
        "granitemoe",
        "internlm2",
        "exaone",
        "cohere",
        "minicpm",
        "nemotron",
        "gpt_neox",
        "gpt2",
        "gpt_bigcode",
        "stablelm",
        "qwen3_vl_moe",
        "dots1",
    ] {
        add(src, "");
        add(src, "-q");
    }
    // glm4_moe's cast_predicate: e_score_correction_bias keeps float32.
    add("glm4_moe", "--dtype bfloat16");
    add("mistral-sharded", "");
    add("mistral-sharded", "-q --q-bits 8");
    add("llama-td-bf16", "");
    add("llama-td-bf16", "-q");
    add("llama-td-bf16", "--dtype float32");
    add("llama-bf16-td-f32", "");
    add("llama-bf16-td-f32", "-q --q-group-size 32");
    for src in [
        "q-llama-q4",
        "q-llama-mixed",
        "q-llama-mxfp4",
        "q-llama-bf16-q4",
        "q-qwen3_moe",
    ] {
        for flags in ["", "-d", "-d --dtype float16", "-q", "--dtype bfloat16"] {
            add(src, flags);
        }
    }
    // Hybrid / state-space models: their 8-bit router predicates and the parameters
    // their cast_predicate keeps in float32.
    for src in [
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "lfm2",
        "mamba2",
        "granitemoehybrid",
        "nemotron_h",
        "mamba",
        "lfm2_moe",
        "falcon_h1",
    ] {
        for flags in ["", "-q", "--dtype bfloat16", "-q --dtype bfloat16"] {
            add(src, flags);
        }
    }
    // Multi-head latent attention: `MultiLinear` quantized where its input width allows
    // (group size 32 reaches every layer of the tiny models); the MoE ones keep
    // `e_score_correction_bias` in float32 (their cast_predicate).
    for src in [
        "deepseek_v3",
        "kimi_k25",
        "kimi_vl",
        "glm4_moe_lite",
        "deepseek_v2",
        "minicpm3",
        "deepseek_v32",
    ] {
        for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
            add(src, flags);
        }
    }
    // A checkpoint from before mlx-lm split `kv_b_proj`: sanitize splits and requantizes
    // it. Not `-d`: mlx-lm's dequantize_model skips `QuantizedMultiLinear` (its output
    // keeps packed `embed_q` / `unembed_out` without a `quantization` section and no
    // longer loads); ours dequantizes them.
    for flags in ["", "-q", "--dtype float32"] {
        add("q-deepseek_v3-kvb", flags);
    }
    // LongCat-Flash: HF's experts stacked, kv_b_proj split into MultiLinear, its
    // classifier at 8 bits, e_score_correction_bias in its dtype. Not `-d` of a quantized
    // one: mlx-lm's dequantize_model skips `QuantizedMultiLinear` (see q-deepseek_v3-kvb).
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("longcat_flash", flags);
    }
    add("q-qwen3_next", "-d");
    add("q-qwen3_next", "-q");
    // Llama 4: HF's fused expert tensors split by sanitize, the vision weights dropped,
    // the router quantized with the rest.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("llama4", flags);
        add("llama4_text", flags);
    }
    add("q-llama4", "-d");
    // MiniMax: the 8-bit router (its quant_predicate), the correction bias kept in
    // float32 (its cast_predicate), FP8 weights dequantized by sanitize.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("minimax", flags);
    }
    add("minimax-fp8", "");
    add("minimax-fp8", "-q");
    // EXAONE MoE: sanitize drops the MTP block, moves the correction bias under the gate
    // and stacks the experts; the bias stays float32 (its cast_predicate).
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("exaone_moe", flags);
    }
    // OLMo: hf_olmo's names as they are (no sanitize), the embedding padded past the
    // vocabulary, quantized with the head or as the tied head; a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("olmo", flags);
    }
    add("olmo-tied", "-q");
    add("q-olmo", "-d");
    // Hunyuan: per-expert tensors stacked, HF's fused qkv_proj / gate_and_up_proj split
    // by sanitize; a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("hunyuan", flags);
    }
    add("hunyuan-fused", "");
    add("hunyuan-fused", "-q");
    add("q-hunyuan", "-d");
    // Baichuan-M1: the convolution weights kept (not quantizable), lm_head normalized by
    // sanitize before it is quantized or cast; a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("baichuan_m1", flags);
    }
    add("q-baichuan_m1", "-d");
    // Bailing MoE: per-expert tensors stacked and the router renamed by sanitize, the
    // router at 8 bits (its quant_predicate), `expert_bias` kept in float32 (its
    // cast_predicate); a norm_head source (the head normalized before it is written); a
    // quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("bailing_moe", flags);
    }
    add("bailing_moe-normhead", "");
    add("bailing_moe-normhead", "--dtype bfloat16");
    add("q-bailing_moe", "-d");
    // GLM-5 (DeepSeek-V3.2 from GLM's config) and Solar Open (glm4_moe from its own):
    // the MTP layer dropped, experts stacked (kv_b_proj split), the correction bias kept in
    // float32 (their cast_predicate).
    for src in ["glm_moe_dsa", "solar_open"] {
        for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
            add(src, flags);
        }
    }
    // Gemma 4: the router's 8-bit predicate; per-layer embeddings quantized where their
    // width allows; the multimodal towers dropped; a quantized MoE source.
    for src in ["gemma4_text", "gemma4_text-moe", "gemma4-mm"] {
        for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
            add(src, flags);
        }
    }
    for flags in ["", "-d", "-q"] {
        add("q-gemma4_text-moe", flags);
    }
    // Gemma 3n: AltUp's coefficient layers stay dense (their input is 4 wide).
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("gemma3n", flags);
    }
    // Apertus: HF's one-element XieLU alphas squeezed by sanitize, the activation's
    // scalars never quantized; a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("apertus", flags);
    }
    add("q-apertus", "-d");
    // Qwen (v1): HF's names as mlx-lm's; biases on c_attn, c_proj, the MLP and the head.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("qwen-v1", flags);
    }
    add("q-qwen-v1", "-d");
    // GPT-J: HF's transformer.* names moved to model.*, its attention buffers dropped.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("gptj", flags);
    }
    add("q-gptj", "-d");
    // GLM: rotary buffers and the tied head dropped.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("glm-dense", flags);
    }
    add("q-glm-dense", "-d");
    // OpenELM: per-layer widths; at group size 64 the 32- and 80-wide proj_2 stay dense.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("openelm", flags);
    }
    add("q-openelm", "-d");
    // nanochat: no norm weights at all; the soft-capped head quantized like any other.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("nanochat", flags);
    }
    add("q-nanochat", "-d");
    // Mistral 4: fused experts split, kv_b_proj split into MultiLinear (quantized
    // with the rest, the router too); an FP8 source
    // (dequantized by sanitize). Not `-d` of a quantized one: mlx-lm's dequantize_model
    // skips `QuantizedMultiLinear` (see q-deepseek_v3-kvb).
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("mistral4", flags);
    }
    for flags in ["", "-q"] {
        add("fp8-mistral4", flags);
    }
    // DeepSeek-MoE v1: per-expert weights stacked, the router's plain weight never
    // quantized; a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("deepseek", flags);
    }
    add("q-deepseek", "-d");
    // DBRX: HF's fused experts split into separate MLPs, each quantized (the router
    // too); a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("dbrx", flags);
    }
    add("q-dbrx", "-d");
    // Phixtral: HF's per-expert fc1 / fc2 (weights and biases) stacked, each quantized
    // (the router too); a quantized source.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("phixtral", flags);
    }
    add("q-phixtral", "-d");
    // TeleChat3: Llama-shaped, untied.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("telechat3", flags);
    }
    add("q-telechat3", "-d");
    // Nanbeige: two runs of the layers, rotary buffers dropped.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("nanbeige", flags);
    }
    add("q-nanbeige", "-d");
    // Lille 130M: the fused qkv_proj, norms inside the blocks, always tied.
    for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
        add("lille-130m", flags);
    }
    add("q-lille-130m", "-d");
    // Pixtral and LFM2-VL (the text model under language_model, the towers dropped),
    // Nemotron-NAS (per-layer blocks: full, linear, absent), Youtu-LLM (DeepSeek-V2's
    // expanded low-rank attention, dense MLPs, tied), Klear (its router kept at 8 bits,
    // expert_bias in its dtype), Mellum (its router kept at 8 bits), Talkie (a bare
    // lm_head parameter, never quantized; rotary buffers dropped), PLaMo (parallel
    // layers under model.layers.layers), IQuest-Loop-Coder (its gate projections), PLaMo 3
    // (fused qkv_proj / gate_up_proj, offset norms, a tied head), Muse Glimmer (its
    // attention's gate_proj quantized too), Spark 2.5 (its per-head g_proj left dense by
    // quant_predicate), Laguna (the original layout's experts stacked, its router kept at
    // 8 bits, e_score_correction_bias in its dtype), MiMo-V2-Flash (HF's experts stacked,
    // the MTP layer dropped, e_score_correction_bias in its dtype), AFMoE (HF's experts
    // stacked, its router kept at 8 bits, expert_bias in its dtype), Jamba (HF's
    // convolutions moved and experts stacked, its routers kept at 8 bits), OLMo Hybrid
    // (HF's convolutions moved), RecurrentGemma (HF's convolutions moved), Step 3.5 (the
    // original layout renamed, its norms plus one, MTP tensors dropped, its routers kept
    // at 8 bits, router_bias in its dtype), PLaMo 2 (HF's convolutions moved, its layers
    // under model.layers.layers), Gear (sandwich norms, soft caps; its attention layers
    // alone, see the sources), RWKV-7 (HF's flat k_k / k_a / g_norm reshaped, its LoRAs'
    // up projections and embeddings at 8 bits by quant_predicate).
    for (src, quantized) in [
        ("pixtral", "q-pixtral"),
        ("lfm2-vl", "q-lfm2-vl"),
        ("nemotron-nas", "q-nemotron-nas"),
        ("youtu_llm", "q-youtu_llm"),
        ("Klear", "q-Klear"),
        ("mellum", "q-mellum"),
        ("talkie", "q-talkie"),
        ("plamo", "q-plamo"),
        ("iquestloopcoder", "q-iquestloopcoder"),
        ("plamo3", "q-plamo3"),
        ("muse_glimmer", "q-muse_glimmer"),
        ("spark2_5", "q-spark2_5"),
        ("laguna", "q-laguna"),
        ("mimo_v2_flash", "q-mimo_v2_flash"),
        ("afmoe", "q-afmoe"),
        ("jamba", "q-jamba"),
        ("olmo_hybrid", "q-olmo_hybrid"),
        ("recurrent_gemma", "q-recurrent_gemma"),
        ("step3p5", "q-step3p5"),
        ("plamo2", "q-plamo2"),
        ("gear", "q-gear"),
        ("rwkv7", "q-rwkv7"),
    ] {
        for flags in ["", "-q", "-q --q-group-size 32", "--dtype bfloat16"] {
            add(src, flags);
        }
        add(quantized, "-d");
    }
    // Muse Glimmer's nested layout: text_config over the top-level keys, the text model
    // lifted out of language_model.* and the vision weights dropped by sanitize.
    add("muse_glimmer-nested", "");
    add("muse_glimmer-nested", "-q");
    // Spark 2.5 with biases, an untied head, embed_tokens renamed to embedding and the
    // rotary buffers dropped by sanitize.
    add("spark2_5-hf", "");
    add("spark2_5-hf", "-q");
    // Laguna with every tensor under language_model. and a tied head.
    add("laguna-prefixed", "");
    add("laguna-prefixed", "-q");
    // RecurrentGemma without lm_head in the checkpoint (sanitize drops the head).
    add("recurrent_gemma-tied", "");
    add("recurrent_gemma-tied", "-q");
    // MiMo-V2-Flash's FP8 block-scaled checkpoint, dequantized by sanitize.
    add("mimo_v2_flash-fp8", "");
    add("mimo_v2_flash-fp8", "-q");
    // `MLX_CONVERT_FILTER=a,b`: only the cases whose name contains one of them.
    if let Ok(f) = std::env::var("MLX_CONVERT_FILTER") {
        let keys: Vec<&str> = f.split(',').filter(|k| !k.is_empty()).collect();
        out.retain(|(name, _, _)| keys.iter().any(|k| name.contains(k)));
    }
    out
}

fn run_py(py: &Path, root: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new(py)
        .arg(root.join(ORACLE))
        .args(args)
        .status()
        .with_context(|| format!("running {ORACLE}"))?;
    if !status.success() {
        bail!("{ORACLE} {} failed ({status})", args.first().unwrap_or(&""));
    }
    Ok(())
}

/// Our `ConvertOptions` for mlx_lm.convert CLI flags.
fn options(src: &Path, out: &Path, flags: &[String]) -> Result<ConvertOptions> {
    let mut o = ConvertOptions {
        hf_path: src.to_string_lossy().into_owned(),
        mlx_path: out.to_path_buf(),
        ..Default::default()
    };
    let mut it = flags.iter();
    while let Some(f) = it.next() {
        let mut val = || it.next().cloned().context("flag without a value");
        match f.as_str() {
            "-q" => o.quantize = true,
            "-d" => o.dequantize = true,
            "--q-bits" => o.q_bits = Some(val()?.parse()?),
            "--q-group-size" => o.q_group_size = Some(val()?.parse()?),
            "--q-mode" => o.q_mode = QuantMode::parse(&val()?)?,
            "--quant-predicate" => o.quant_predicate = Some(Recipe::parse(&val()?)?),
            "--dtype" => o.dtype = Dtype::from_name(&val()?),
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(o)
}

fn tensors(dir: &Path) -> Result<BTreeMap<String, Array>> {
    let mut all = BTreeMap::new();
    for f in mlx_models::loader::weight_files(dir)? {
        all.extend(mlx_array::io::load_safetensors(&f)?.0);
    }
    Ok(all)
}

/// Differences between two converted directories (empty: identical).
fn compare_dirs(py: &Path, rs: &Path) -> Result<Vec<String>> {
    let mut diffs = Vec::new();
    let (a, b) = (tensors(py)?, tensors(rs)?);
    let (ka, kb): (Vec<_>, Vec<_>) = (a.keys().collect(), b.keys().collect());
    if ka != kb {
        let only_py: Vec<_> = ka.iter().filter(|k| !b.contains_key(**k)).collect();
        let only_rs: Vec<_> = kb.iter().filter(|k| !a.contains_key(**k)).collect();
        diffs.push(format!(
            "tensor names differ: only mlx-lm {only_py:?}, only ours {only_rs:?}"
        ));
    }
    for (k, x) in &a {
        let Some(y) = b.get(k) else { continue };
        if x.dtype() != y.dtype() || x.shape() != y.shape() {
            diffs.push(format!(
                "{k}: {:?}{:?} vs ours {:?}{:?}",
                x.dtype(),
                x.shape(),
                y.dtype(),
                y.shape()
            ));
        } else if x.to_bytes()? != y.to_bytes()? {
            diffs.push(format!("{k}: values differ"));
        }
    }
    let json = |d: &Path, f: &str| -> Result<Value> {
        let p = d.join(f);
        let text = std::fs::read_to_string(&p).with_context(|| format!("{}", p.display()))?;
        Ok(serde_json::from_str(&text)?)
    };
    for f in ["config.json", "model.safetensors.index.json"] {
        if json(py, f)? != json(rs, f)? {
            diffs.push(format!("{f} differs"));
        }
    }
    let card = |d: &Path| std::fs::read_to_string(d.join("README.md")).unwrap_or_default();
    if card(py) != card(rs) {
        diffs.push("README.md differs".into());
    }
    for f in ["tokenizer.json", "generation_config.json"] {
        if !rs.join(f).is_file() {
            diffs.push(format!("ours lacks {f}"));
        }
    }
    Ok(diffs)
}

/// Greedy continuation with full forward passes (no cache), like the oracle's.
fn greedy(dir: &Path, prompt: &[i32], steps: usize) -> Result<Vec<i64>> {
    let (model, _) = mlx_models::load_model(dir)?;
    let mut tokens = prompt.to_vec();
    for _ in 0..steps {
        let x = Array::from_slice(&tokens, &[1, tokens.len() as i32])?;
        let logits = model.forward(&x, &mut [])?;
        let l = logits.dim(1)?;
        let next = logits
            .slice_axis(1, l - 1, l)?
            .argmax(Some(-1), false)?
            .astype(Dtype::Int32)?
            .to_vec::<i32>()?;
        tokens.push(*next.first().context("empty argmax")?);
    }
    Ok(tokens[prompt.len()..].iter().map(|&t| t as i64).collect())
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

fn python(root: &Path) -> PathBuf {
    match std::env::var_os("MLX_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None if root.join(".venv/bin/python").is_file() => root.join(".venv/bin/python"),
        None => PathBuf::from("python3"),
    }
}

/// After a full `cargo xtask parity` run (not with `--only`, `--goldens`,
/// `--no-convert`, `--gen-only` or `--spec-only`): the convert section.
pub fn after_parity(root: &Path, args: &[String]) -> Result<()> {
    if crate::parity::section_skipped(args, "--no-convert") {
        return Ok(());
    }
    run(root, &python(root), &root.join(".cache/parity/models"))
}

/// `cargo xtask parity --convert-only`: makes the tiny checkpoints it needs if they are
/// missing, then runs the section.
pub fn run_section(root: &Path) -> Result<()> {
    let py = python(root);
    let models = root.join(".cache/parity/models");
    let cases = cases();
    let missing: Vec<&str> = SOURCES
        .iter()
        .filter(|(label, _, _)| cases.iter().any(|c| c.1 == *label))
        .map(|s| s.1)
        .filter(|v| !models.join(v).join("config.json").is_file())
        .collect();
    if !missing.is_empty() {
        let status = Command::new(&py)
            .arg(root.join("xtask/py/make_tiny_models.py"))
            .arg(&models)
            .args(["--only", &missing.join(",")])
            .status()?;
        if !status.success() {
            bail!("make_tiny_models.py failed ({status})");
        }
    }
    run(root, &py, &models)
}

/// Runs the section; `models` holds the parity set's tiny checkpoints.
pub fn run(root: &Path, py: &Path, models: &Path) -> Result<()> {
    let work = root.join(".cache/parity/convert");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(work.join("py"))?;
    std::fs::create_dir_all(work.join("rs"))?;
    let cases = cases();
    let specs: Vec<Value> = SOURCES
        .iter()
        .filter(|(label, _, _)| cases.iter().any(|c| c.1 == *label))
        .map(|(label, variant, td)| {
            let config = if *label == "gemma2" {
                json!({"query_pre_attn_scalar": 16})
            } else {
                json!({})
            };
            json!({"src": models.join(variant), "dest": work.join("src").join(label),
                   "torch_dtype": td, "config": config})
        })
        .collect();
    let specs_path = work.join("sources.json");
    std::fs::write(&specs_path, serde_json::to_string(&specs)?)?;
    run_py(py, root, &["prepare", &specs_path.to_string_lossy()])?;

    let list: Vec<Value> = cases
        .iter()
        .map(|(name, src, flags)| {
            json!({"src": work.join("src").join(src), "out": work.join("py").join(name),
                   "args": flags})
        })
        .collect();
    let cases_path = work.join("cases.json");
    std::fs::write(&cases_path, serde_json::to_string(&list)?)?;
    run_py(py, root, &["convert", &cases_path.to_string_lossy()])?;

    let width = cases.iter().map(|c| c.0.len()).max().unwrap_or(10);
    let mut failed = Vec::new();
    let mut loadable = Vec::new();
    println!("\n{:width$}  convert parity", "case");
    for (name, src, flags) in &cases {
        let (pyd, rsd) = (work.join("py").join(name), work.join("rs").join(name));
        let py_err = std::fs::read_to_string(pyd.join("error")).ok();
        let ours = options(&work.join("src").join(src), &rsd, flags)
            .and_then(|o| convert(&o).map_err(anyhow::Error::from));
        let line = match (py_err, ours) {
            (Some(pe), Err(e)) => format!("ok (both refuse: mlx-lm `{pe}`; ours `{e}`)"),
            (Some(pe), Ok(_)) => format!("DIFFERS: mlx-lm refuses ({pe}), ours converts"),
            (None, Err(e)) => format!("DIFFERS: ours fails: {e:#}"),
            (None, Ok(r)) => match compare_dirs(&pyd, &rsd) {
                Ok(d) if d.is_empty() => {
                    loadable.push(name.clone());
                    format!(
                        "ok ({} tensors identical{})",
                        r.weights.tensors,
                        r.bits_per_weight
                            .map(|b| format!(", {b:.3} bpw"))
                            .unwrap_or_default()
                    )
                }
                Ok(d) => format!("DIFFERS: {}", d.join("; ")),
                Err(e) => format!("DIFFERS: comparing: {e:#}"),
            },
        };
        if !line.starts_with("ok") {
            failed.push(name.clone());
        }
        println!("{name:width$}  {line}");
    }

    // Cross-loading: mlx-lm on ours and on its own, us on its and on ours.
    let gen_path = work.join("generate.json");
    let mut dirs: Vec<String> = Vec::new();
    for n in &loadable {
        for side in ["py", "rs"] {
            dirs.push(work.join(side).join(n).to_string_lossy().into_owned());
        }
    }
    let mut args: Vec<&str> = vec!["generate", gen_path.to_str().unwrap_or_default()];
    args.extend(dirs.iter().map(String::as_str));
    run_py(py, root, &args)?;
    let oracle: Value = serde_json::from_str(&std::fs::read_to_string(&gen_path)?)?;
    let mut gen_ok = 0;
    let mut cpu_limited = Vec::new();
    for n in &loadable {
        let (pyd, rsd) = (work.join("py").join(n), work.join("rs").join(n));
        if let Some(e) = oracle[rsd.to_string_lossy().as_ref()].get("error") {
            // mlx-lm cannot run it here (MLX's CPU GatherMM is float32-only): check that
            // we load it at least.
            let ours = greedy(&pyd, &PROMPT, STEPS).and_then(|_| greedy(&rsd, &PROMPT, STEPS));
            cpu_limited.push(format!(
                "{n} (mlx-lm: {}; ours: {})",
                e.as_str().unwrap_or_default(),
                match ours {
                    Ok(_) => "runs".to_string(),
                    Err(e) => format!("{e:#}"),
                }
            ));
            continue;
        }
        let lm_on_ours = ids(&oracle[rsd.to_string_lossy().as_ref()]);
        let lm_on_lm = ids(&oracle[pyd.to_string_lossy().as_ref()]);
        let res = greedy(&pyd, &PROMPT, STEPS).and_then(|a| Ok((a, greedy(&rsd, &PROMPT, STEPS)?)));
        match res {
            Ok((us_on_lm, us_on_ours))
                if lm_on_ours.len() == STEPS
                    && [&lm_on_lm, &us_on_lm, &us_on_ours]
                        .iter()
                        .all(|t| **t == lm_on_ours) =>
            {
                gen_ok += 1
            }
            Ok((a, b)) => {
                failed.push(format!("{n} (generation)"));
                println!(
                    "{n}: generation differs: mlx-lm on ours {lm_on_ours:?}, on its own \
                     {lm_on_lm:?}; ours on mlx-lm's {a:?}, on ours {b:?}"
                );
            }
            Err(e) => {
                failed.push(format!("{n} (loading)"));
                println!("{n}: we cannot load or run mlx-lm's output: {e:#}");
            }
        }
    }
    println!(
        "cross-loading: {gen_ok} of {} converted models generate the same {STEPS} tokens in \
         mlx-lm and here, from either converter's output",
        loadable.len()
    );
    for c in &cpu_limited {
        println!("  not run by mlx-lm on this CPU: {c}");
    }

    if std::env::var_os("MLX_CONVERT_FILTER").is_none() {
        smollm2(root, py, &work, &mut failed)?;
    }
    if !failed.is_empty() {
        bail!(
            "convert parity: {} failures: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    println!(
        "convert parity: all {} cases identical to mlx_lm.convert",
        cases.len()
    );
    Ok(())
}

/// The default model's GGUF through our converter, against mlx-lm's convert of the same
/// import, then loaded and run by mlx-lm and by us.
fn smollm2(root: &Path, py: &Path, work: &Path, failed: &mut Vec<String>) -> Result<()> {
    let gguf = mlx_hub::fetch_default_gguf(&work.join("gguf")).context("fetching SmolLM2")?;
    let import = mlx_quant::resolve_source(&gguf.to_string_lossy(), &work.join("smol-import"))?;
    for (name, flags) in [("smollm2", ""), ("smollm2-d", "-d")] {
        let rsd: PathBuf = work.join("rs").join(name);
        let pyd: PathBuf = work.join("py").join(name);
        let flags: Vec<String> = flags.split_whitespace().map(str::to_string).collect();
        convert(&options(&gguf, &rsd, &flags)?)?;
        let case = json!([{"src": import.dir, "out": pyd, "args": flags}]);
        let cases_path = work.join(format!("{name}.json"));
        std::fs::write(&cases_path, case.to_string())?;
        run_py(py, root, &["convert", &cases_path.to_string_lossy()])?;
        let mut diffs = compare_dirs(&pyd, &rsd)?;
        // The import directory is a scratch path, so only the cards' wording may differ.
        diffs.retain(|d| !d.starts_with("README"));
        let out = work.join(format!("{name}-gen.json"));
        run_py(
            py,
            root,
            &[
                "generate-text",
                &out.to_string_lossy(),
                &rsd.to_string_lossy(),
                SMOL_TEXT,
                &SMOL_STEPS.to_string(),
            ],
        )?;
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
        let prompt: Vec<i32> = ids(&v["prompt"]).into_iter().map(|t| t as i32).collect();
        let lm = ids(&v["tokens"]);
        let ours = greedy(&rsd, &prompt, SMOL_STEPS)?;
        if lm != ours {
            diffs.push(format!("generation: mlx-lm {lm:?}, ours {ours:?}"));
        }
        if diffs.is_empty() {
            println!(
                "{name}: GGUF -> ours identical to mlx_lm.convert of the import; mlx-lm and we \
                 generate {lm:?} from it"
            );
            // Both conversions of the 135M model (~650 MB for -d) are kept only on failure.
            for d in [&rsd, &pyd] {
                std::fs::remove_dir_all(d)?;
            }
        } else {
            println!("{name}: DIFFERS: {}", diffs.join("; "));
            failed.push(name.to_string());
        }
    }
    Ok(())
}

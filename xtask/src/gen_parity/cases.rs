//! The cases of the generation parity check: which flags, on which models.
use std::path::{Path, PathBuf};

/// Tiny generation models (names of make_tiny_models.py's variants; see gen_oracle.py).
pub const TINY: &[&str] = &[
    "llama-f32-tied",
    "llama-bf16",
    "llama-f32-hd32",
    "llama-f32-sliding",
    "llama-q4-g32",
    "mistral-f32-sharded",
    "qwen2-f32-tied",
    "qwen3-f32-tied",
    "qwen3-f32-hd32",
    "qwen3-q8",
    "phi3-f32",
    "gemma2-f32",
    "gemma3_text-f32-tied",
    "gemma3-f32-multimodal",
    "qwen3_moe-f32",
    "mixtral-f32",
    "smollm3-f32-tied",
    "granite-f32-tied",
    "olmo2-f32",
    "olmo3-f32",
    "starcoder2-f32-tied",
    "gemma-f32",
    "gpt_oss-f32",
    "ministral3-f32-sliding-untied",
    "mistral3-f32-ministral3",
    "glm4-f32",
    "qwen2_moe-f32",
    "exaone4-f32-hybrid",
    "seed_oss-f32-tied-bias",
    "cohere2-f32",
    // Issue 26, dense and MoE families.
    "olmoe-f32",
    "mimo-f32-mtp",
    "helium-f32",
    "ernie4_5-f32-tied",
    "internlm3-f32",
    "glm4_moe-f32-mtp",
    "ernie4_5_moe-f32-mtp",
    "qwen2_vl-f32-flat",
    "qwen3_vl-f32-nested-untied",
    "hunyuan_v1_dense-f32",
    // Issue 26, wave 2 part B.
    "phi-f32",
    "phimoe-f32-longrope",
    "granitemoe-f32-tied",
    "internlm2-f32",
    "exaone-f32",
    "cohere-f32-qknorm",
    "minicpm-f32",
    "nemotron-f32",
    "gpt_neox-f32",
    "gpt2-f32",
    "gpt_bigcode-f32-mqa",
    "stablelm-f32-qknorm",
    "qwen3_vl_moe-f32-nested",
    "dots1-f32",
    // Issue 26, hybrid and state-space families.
    "qwen3_next-f32",
    "qwen3_5-f32",
    "qwen3_5_moe-f32",
    "lfm2-f32",
    "lfm2_moe-f32",
    "falcon_h1-f32",
    "mamba2-f32",
    "granitemoehybrid-f32",
    "nemotron_h-f32",
    "mamba-f32",
    // Issue 26, multi-head latent attention families.
    "deepseek_v3-f32",
    "deepseek_v32-f32",
    "kimi_k25-f32",
    "glm4_moe_lite-f32-mtp",
    "deepseek_v2-f32",
    "minicpm3-f32",
    // Issue 26, chunked attention (ChunkedKVCache).
    "llama4-f32",
    "llama4_text-f32",
    "minimax-f32",
    "exaone_moe-f32",
    "olmo-f32",
    "hunyuan-f32",
    "baichuan_m1-f32",
    "bailing_moe-f32",
    "glm_moe_dsa-f32-mtp",
    "solar_open-f32-mtp",
    "apertus-f32",
    "qwen-f32",
    "gptj-f32",
    "glm-f32",
    "openelm-f32",
    "nanochat-f32",
    "mistral4-f32",
    "deepseek-f32",
    "dbrx-f32",
    "phixtral-f32",
    "telechat3-f32",
    "nanbeige-f32",
    "lille-130m-f32",
    "pixtral-f32",
    "lfm2-vl-f32",
    "kimi_vl-f32",
    "nemotron-nas-f32",
    "youtu_llm-f32",
    "Klear-f32",
    "mellum-f32",
    "talkie-f32",
    "plamo-f32",
    "iquestloopcoder-f32",
    "plamo3-f32",
    "muse_glimmer-f32",
    "spark2_5-f32",
    "laguna-f32",
    "mimo_v2_flash-f32",
    "afmoe-f32",
    "jamba-f32",
    "olmo_hybrid-f32",
    "recurrent_gemma-f32",
    "step3p5-f32",
    "plamo2-f32",
    // Attention layers only: transformers refuses "conv_mixer" in `layer_types` when
    // mlx_lm loads the tokenizer.
    "gear-f32-attention-only",
    "rwkv7-f32",
    "longcat_flash-f32",
    // Issue 26, Gemma 4 (KV caches shared between layers).
    "gemma4_text-f32",
    "gemma4_text-f32-moe-keqv-untied",
    "gemma4-f32-multimodal",
    // Not gemma3n-f32-sizes-noclip: transformers' strict config class (the tokenizer
    // loading goes through it) refuses its `final_logit_softcapping: null`.
    "gemma3n-f32",
];
/// Head dim 32: the KV cache can be quantized with group size 32.
const HD32: &[&str] = &["llama-f32-hd32", "qwen3-f32-hd32", "llama4-f32"];
/// Prompt-cache cases run on these.
const PROMPT_CACHE: &[&str] = &[
    "llama-f32-tied",
    "qwen3-f32-tied",
    "gemma3_text-f32-tied",
    "llama-f32-hd32",
    "qwen3_next-f32",
    "lfm2-f32",
    // The latent KV of multi-head latent attention in a plain KVCache.
    "deepseek_v3-f32",
    // Chunked caches (ChunkedKVCache) beside plain ones.
    "llama4-f32",
    // A CacheList (latent KV and the indexer's keys).
    "deepseek_v32-f32",
    // A CacheList (recurrent state and KV).
    "falcon_h1-f32",
    // CacheLists of a convolution state and KV, rotating on the sliding layers.
    "baichuan_m1-f32",
    // Fewer caches than layers (the KV-shared layers have none).
    "gemma4_text-f32",
    "gemma3n-f32",
];
/// Top-k and min-p run on these (top-p on all).
const ALL_SAMPLERS: &[&str] = &[
    "llama-f32-tied",
    "qwen3-f32-tied",
    "phi3-f32",
    "gemma3_text-f32-tied",
    "qwen3_moe-f32",
    "qwen3_next-f32",
];
/// Which mlx-lm command a case runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// `mlx_lm generate` vs `mlx-generate`.
    Generate,
    /// `mlx_lm cache_prompt` (py_args) or `mlx-cache-prompt` (our_args).
    CachePrompt,
    /// Tensor-by-tensor comparison of two prompt-cache files (py_args: the paths).
    CompareCaches,
    /// `mlx_lm perplexity` vs `mlx-perplexity`: the printed report and the exact values.
    Perplexity,
}

impl Cmd {
    /// The oracle's name for it.
    pub fn oracle_name(self) -> &'static str {
        match self {
            Cmd::Generate => "generate",
            Cmd::CachePrompt => "cache_prompt",
            Cmd::CompareCaches => "compare_caches",
            Cmd::Perplexity => "perplexity",
        }
    }
}

/// One comparison: mlx-lm with `py_args`, ours with `our_args`.
pub struct Case {
    /// Table row.
    pub row: String,
    /// Table column.
    pub col: &'static str,
    /// What runs.
    pub cmd: Cmd,
    /// mlx-lm's arguments (empty: mlx-lm does not run).
    pub py_args: Vec<String>,
    /// Our arguments (empty: ours does not run).
    pub our_args: Vec<String>,
    /// Standard input for both.
    pub stdin: Option<String>,
    /// Uses `--seed`.
    pub seeded: bool,
    /// A deliberate difference: reported, not a failure.
    pub known: Option<&'static str>,
}

impl Case {
    /// `row/col`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.row, self.col)
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// A path as an argument.
pub fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn cat(parts: &[&[&str]]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .map(|x| x.to_string())
        .collect()
}

/// A case run with the same flags on both sides (plus `ours_extra` on ours).
fn same(row: &str, col: &'static str, args: Vec<String>, ours_extra: &[&str]) -> Case {
    let mut our_args = args.clone();
    our_args.extend(s(ours_extra));
    let seeded = args.iter().any(|a| a == "--seed");
    Case {
        row: row.into(),
        col,
        cmd: Cmd::Generate,
        py_args: args,
        our_args,
        stdin: None,
        seeded,
        known: None,
    }
}

fn with_model(model: &Path, rest: &[String]) -> Vec<String> {
    let mut v = vec!["--model".to_string(), p(model)];
    v.extend(rest.iter().cloned());
    v
}

const CHAT: &[&str] = &["--prompt", "Tell me a story", "--max-tokens", "12"];
const RAW: &[&str] = &[
    "--prompt",
    "Once upon a time",
    "--ignore-chat-template",
    "--max-tokens",
    "12",
];
const QUIET: &[&str] = &["--verbose", "False"];
/// A raw prompt of 16 tokens, then 24 new ones through a 20-position window.
const WINDOW: &[&str] = &[
    "--prompt",
    "Once upon a time, there was",
    "--ignore-chat-template",
    "--max-kv-size",
    "20",
    "--max-tokens",
    "24",
];

/// The cases of every tiny model.
pub fn tiny_cases(models: &Path, pc_dir: &Path, have_cache_prompt: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for &name in TINY {
        let dir = models.join(name);
        // Both sides run with the same flags: a quantized model stays quantized on the
        // CPU by default, as in mlx-lm.
        let extra: &[&str] = &[];
        let mut add = |col: &'static str, rest: Vec<String>| {
            cases.push(same(name, col, with_model(&dir, &rest), extra));
        };
        add("greedy", cat(&[CHAT]));
        add("raw", cat(&[RAW, QUIET]));
        add(
            "top-p",
            cat(&[
                CHAT,
                QUIET,
                &["--temp", "0.8", "--top-p", "0.9", "--seed", "7"],
            ]),
        );
        if ALL_SAMPLERS.contains(&name) {
            let top_k = &["--temp", "1.0", "--top-k", "5", "--seed", "3"];
            add("top-k", cat(&[CHAT, QUIET, top_k]));
            let min_p = &["--temp", "0.7", "--min-p", "0.1", "--seed", "11"];
            add("min-p", cat(&[CHAT, QUIET, min_p]));
        }
        add("kv-size", cat(&[WINDOW, QUIET]));
        if HD32.contains(&name) {
            let kv = &[
                "--kv-bits",
                "4",
                "--kv-group-size",
                "32",
                "--quantized-kv-start",
                "8",
            ];
            add("kv-bits", cat(&[CHAT, QUIET, kv]));
        }
        // A prompt of 16 tokens through an 8-position window: mlx-lm keeps the first 4
        // tokens and a sliding window (models with their own caches ignore the flag).
        let mut short = cat(&[WINDOW, QUIET]);
        if let Some(i) = short.iter().position(|a| a == "20") {
            short[i] = "8".into();
        }
        add("kv-size<prompt", short);
        if PROMPT_CACHE.contains(&name) {
            let kv: &[&str] = if HD32.contains(&name) {
                &[
                    "--kv-bits",
                    "8",
                    "--kv-group-size",
                    "32",
                    "--quantized-kv-start",
                    "0",
                ]
            } else {
                &[]
            };
            prompt_cache_cases(&mut cases, name, &dir, pc_dir, kv, extra, have_cache_prompt);
        }
    }
    cases
}

/// `cache_prompt` by mlx-lm and by ours, the two files compared, and generation from
/// each file on both sides. `kv` goes to cache_prompt; generation gets its bits and
/// group size.
fn prompt_cache_cases(
    cases: &mut Vec<Case>,
    row: &str,
    dir: &Path,
    pc_dir: &Path,
    kv: &[&str],
    extra: &[&str],
    have_cache_prompt: bool,
) {
    let py_file = pc_dir.join(format!("{row}.mlx-lm.safetensors"));
    let our_file = pc_dir.join(format!("{row}.ours.safetensors"));
    let make = |file: &Path| {
        let mut a = with_model(dir, &s(&["--prompt", "Tell me a story"]));
        a.extend(["--prompt-cache-file".to_string(), p(file)]);
        a.extend(s(kv));
        a
    };
    let gen_kv: Vec<String> = kv
        .chunks(2)
        .filter(|f| matches!(f[0], "--kv-bits" | "--kv-group-size"))
        .flat_map(|f| f.iter().map(|x| x.to_string()))
        .collect();
    let gen = |file: &Path| {
        // No --model: both take it from the file's metadata.
        let mut a = cat(&[&["--prompt", " about dragons", "--max-tokens", "6"], QUIET]);
        a.extend(["--prompt-cache-file".to_string(), p(file)]);
        a.extend(gen_kv.iter().cloned());
        a
    };
    let plain = |col: &'static str, cmd: Cmd, py_args: Vec<String>, our_args: Vec<String>| Case {
        row: row.into(),
        col,
        cmd,
        py_args,
        our_args,
        stdin: None,
        seeded: false,
        known: None,
    };
    cases.push(plain(
        "pc-write",
        Cmd::CachePrompt,
        make(&py_file),
        Vec::new(),
    ));
    cases.push(same(row, "pc-mlx-lm", gen(&py_file), extra));
    if have_cache_prompt {
        let mut ours = make(&our_file);
        ours.extend(s(extra));
        cases.push(plain("pc-ours-file", Cmd::CachePrompt, Vec::new(), ours));
        cases.push(plain(
            "pc-files-equal",
            Cmd::CompareCaches,
            vec![p(&py_file), p(&our_file)],
            Vec::new(),
        ));
        cases.push(same(row, "pc-ours", gen(&our_file), extra));
    }
}

/// The entries of `sweep.json` (`xtask/py/sweep_models.py`'s manifest).
pub fn read_sweep(sweep: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    use anyhow::Context;
    let manifest = sweep.join("sweep.json");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Sweep configs whose loading takes another number of keys from MLX's global sequence
/// than mlx-lm's (`mlx_models::model::mlx_lm_init_key_draws` against the count
/// `sweep_models.py` measured in mlx-lm): a seeded sampler would then see other keys.
pub fn sweep_key_draw_mismatches(
    sweep: &Path,
    entries: &[serde_json::Value],
) -> anyhow::Result<Vec<String>> {
    let mut bad = Vec::new();
    for e in entries {
        let name = e.get("name").and_then(|v| v.as_str()).unwrap_or_default();
        let theirs = e.get("key_draws").and_then(|v| v.as_u64());
        let ours = mlx_models::model::mlx_lm_init_key_draws(&sweep.join(name))?;
        if theirs != Some(ours as u64) {
            bad.push(format!(
                "sweep {name}: loading takes {ours} keys, mlx-lm's {theirs:?}"
            ));
        }
    }
    Ok(bad)
}

/// The seeded config sweep (`xtask/py/sweep_models.py`: three tiny configs of every
/// architecture, each switch of its config drawn from a fixed seed; `sweep.json` lists
/// them): greedy decoding with mlx-lm's default flags, and seeded sampling.
pub fn sweep_cases(sweep: &Path, entries: &[serde_json::Value]) -> Vec<Case> {
    let mut cases = Vec::new();
    for e in entries {
        let field = |k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        let (name, switches) = (field("name"), field("switches"));
        let seed = e
            .get("seed")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
            .to_string();
        let dir = sweep.join(name);
        let row = format!("sweep {name} ({switches})");
        cases.push(same(&row, "greedy", with_model(&dir, &s(CHAT)), &[]));
        let seeded = cat(&[CHAT, QUIET, &["--temp", "0.9", "--seed", &seed]]);
        cases.push(same(&row, "seeded", with_model(&dir, &seeded), &[]));
    }
    cases
}

/// Prompt and template flags, on one model.
pub fn flag_cases(models: &Path) -> Vec<Case> {
    let dir = models.join("llama-f32-tied");
    let row = "flags(llama-f32-tied)";
    let mut cases = Vec::new();
    let mut add = |col: &'static str, rest: Vec<String>| {
        cases.push(same(row, col, with_model(&dir, &rest), &[]))
    };
    add(
        "system",
        cat(&[CHAT, QUIET, &["--system-prompt", "Be brief."]]),
    );
    add(
        "prefill",
        cat(&[CHAT, QUIET, &["--prefill-response", "Sure, here"]]),
    );
    add(
        "escapes",
        cat(&[
            &["--prompt", "line one\\nline\\ttwo", "--max-tokens", "8"],
            QUIET,
        ]),
    );
    add("step-3", cat(&[CHAT, QUIET, &["--prefill-step-size", "3"]]));
    add(
        "eos",
        cat(&[CHAT, QUIET, &["--extra-eos-token", "Ġt", "e"]]),
    );
    add(
        "tmpl-cfg",
        cat(&[
            CHAT,
            QUIET,
            &[
                "--use-default-chat-template",
                "--chat-template-config",
                "{\"x\": 1}",
            ],
        ]),
    );
    add(
        "xtc",
        cat(&[
            CHAT,
            QUIET,
            &[
                "--temp",
                "1.0",
                "--xtc-probability",
                "0.5",
                "--xtc-threshold",
                "0.01",
                "--seed",
                "9",
            ],
        ]),
    );
    add(
        "min-keep",
        cat(&[
            CHAT,
            QUIET,
            &[
                "--temp",
                "1.0",
                "--min-p",
                "0.5",
                "--min-tokens-to-keep",
                "4",
                "--seed",
                "2",
            ],
        ]),
    );
    add(
        "top-p+k",
        cat(&[
            CHAT,
            QUIET,
            &[
                "--temp", "0.6", "--top-p", "0.5", "--top-k", "20", "--seed", "4",
            ],
        ]),
    );
    let stdin_args = with_model(
        &dir,
        &cat(&[&["--prompt", "-", "--max-tokens", "8"], QUIET]),
    );
    let mut stdin = same(row, "stdin", stdin_args, &[]);
    stdin.stdin = Some("From standard input: héllo\n".into());
    cases.push(stdin);
    cases
}

/// The default model (its 4-bit directory, kept quantized on both sides, as a user runs
/// it; `--model` left out once on ours so the default is resolved), and once with
/// `--cpu-dequantize`, which must give mlx-lm's tokens on a float32 copy of the model.
/// Short prompts and few tokens: a 135M model on 2 CPU cores.
pub fn default_cases(q4: &Path, f32: &Path, pc_dir: &Path, have_cache_prompt: bool) -> Vec<Case> {
    let row = "SmolLM2-135M";
    let mut cases = Vec::new();
    let raw: &[&str] = &[
        "--prompt",
        "The capital of France is",
        "--ignore-chat-template",
        "--max-tokens",
        "8",
    ];
    let on_q4 = |col: &'static str, rest: Vec<String>| same(row, col, with_model(q4, &rest), &[]);
    let chat_args = cat(&[&["--prompt", "Hi", "--max-tokens", "8"]]);
    let mut chat = on_q4("chat-no-model-flag", chat_args.clone());
    chat.our_args = chat_args;
    cases.push(chat);
    cases.push(on_q4(
        "top-p",
        cat(&[
            raw,
            QUIET,
            &["--temp", "0.8", "--top-p", "0.9", "--seed", "42"],
        ]),
    ));
    cases.push(on_q4(
        "kv-bits",
        cat(&[raw, QUIET, &["--kv-bits", "8", "--quantized-kv-start", "4"]]),
    ));
    cases.push(on_q4(
        "kv-size",
        cat(&[raw, QUIET, &["--max-kv-size", "8"]]),
    ));
    // The opt-in float32 path is mlx-lm's arithmetic on a dequantized copy.
    let mut dequantized = same(
        row,
        "cpu-dequantize",
        with_model(f32, &cat(&[raw, QUIET])),
        &[],
    );
    dequantized.our_args = with_model(q4, &cat(&[raw, QUIET, &["--cpu-dequantize"]]));
    cases.push(dequantized);
    prompt_cache_cases(&mut cases, row, q4, pc_dir, &[], &[], have_cache_prompt);
    cases
}

/// Words of the perplexity datasets' rows.
const WORDS: &[&str] = &[
    "the", "dragon", "lived", "in", "a", "castle", "by", "sea", "and", "every", "morning", "she",
    "flew", "over", "quiet", "town", "story", "small", "model", "writes", "about", "brown", "fox",
    "jumps", "lazy", "dog", "hello", "there", "how", "are", "you", "today",
];

/// A deterministic sentence of `n` words (a linear congruential walk over [`WORDS`]).
fn sentence(state: &mut u64, n: usize) -> String {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.push(WORDS[(*state >> 33) as usize % WORDS.len()]);
    }
    let mut s = out.join(" ");
    s.push('.');
    s
}

/// Writes the perplexity datasets (mlx-lm's local layout: `<dir>/<format>/train.jsonl`)
/// and returns their directories by format name.
pub fn write_perplexity_data(dir: &Path) -> std::io::Result<Vec<(&'static str, PathBuf)>> {
    use serde_json::json;
    let mut state = 7u64;
    let mut out = Vec::new();
    for format in ["text", "chat", "completions"] {
        let mut lines = Vec::new();
        for i in 0..14 {
            let n = 6 + (i * 5) % 17;
            let a = sentence(&mut state, n);
            let b = sentence(&mut state, 3 + i % 7);
            let row = match format {
                "text" => json!({"text": format!("{a} {b}")}),
                "chat" if i % 4 == 0 => json!({"messages": [
                    {"role": "system", "content": "You tell short stories."},
                    {"role": "user", "content": b},
                    {"role": "assistant", "content": a},
                ]}),
                "chat" => json!({"messages": [
                    {"role": "user", "content": b},
                    {"role": "assistant", "content": a},
                ]}),
                _ => json!({"prompt": b, "completion": a}),
            };
            lines.push(row.to_string());
        }
        let d = dir.join(format);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("train.jsonl"), lines.join("\n") + "\n")?;
        out.push((format, d));
    }
    Ok(out)
}

/// `mlx_lm perplexity` vs `mlx-perplexity` on the datasets of
/// [`write_perplexity_data`]: text, chat and completions rows, a partial last batch,
/// another seed; tiny models and the default model (its 4-bit directory on both sides).
pub fn perplexity_cases(models: &Path, data: &[(&'static str, PathBuf)], q4: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    let base = |model: &Path, data: &Path, rest: &[&str]| {
        let mut v = with_model(model, &s(&["--data-path"]));
        v.push(p(data));
        v.extend(s(rest));
        v
    };
    let case = |row: &str, col: &'static str, py: Vec<String>, ours: Vec<String>| Case {
        row: row.into(),
        col,
        cmd: Cmd::Perplexity,
        py_args: py,
        our_args: ours,
        stdin: None,
        seeded: false,
        known: None,
    };
    let mut add = |c: Case| cases.push(c);
    let small = [
        "--sequence-length",
        "32",
        "--num-samples",
        "6",
        "--batch-size",
        "4",
    ];
    for (name, extra) in [
        ("llama-f32-tied", &[][..]),
        ("qwen3-f32-tied", &[]),
        ("gemma3_text-f32-tied", &[]),
        ("qwen3_moe-f32", &[]),
        ("llama-q4-g32", &[]),
    ] {
        let dir = models.join(name);
        for (format, d) in data {
            let col = match *format {
                "text" => "ppl-text",
                "chat" => "ppl-chat",
                _ => "ppl-completions",
            };
            let py = base(&dir, d, &small);
            let mut ours = py.clone();
            ours.extend(s(extra));
            add(case(name, col, py, ours));
        }
    }
    let dir = models.join("llama-f32-tied");
    let text = &data[0].1;
    let py = base(
        &dir,
        text,
        &[
            "--sequence-length",
            "16",
            "--num-samples",
            "5",
            "--batch-size",
            "2",
            "--seed",
            "7",
        ],
    );
    add(case("llama-f32-tied", "ppl-seed", py.clone(), py));
    let all = base(
        &dir,
        text,
        &["--sequence-length", "24", "--num-samples", "-1"],
    );
    add(Case {
        known: Some(
            "mlx-lm's --num-samples -1 reads past the last row (IndexError); ours uses every row",
        ),
        ..case("llama-f32-tied", "ppl-all", all.clone(), all)
    });
    let chat = &data[1].1;
    let flags = [
        "--sequence-length",
        "32",
        "--num-samples",
        "4",
        "--batch-size",
        "2",
    ];
    let py = base(q4, chat, &flags);
    add(case("SmolLM2-135M", "ppl-chat", py.clone(), py));
    cases
}

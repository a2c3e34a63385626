//! Generation parity (part of `cargo xtask parity`): the text `mlx-generate` prints
//! against `python -m mlx_lm generate` with the same flags.
//!
//! Models: tiny seeded checkpoints of every architecture (make_tiny_models.py's
//! variants, written by `xtask/py/gen_oracle.py models` with the default model's
//! tokenizer and a matching vocab_size, into `.cache/parity/generate/models`), and the
//! default model (SmolLM2-135M-Instruct): ours dequantized vs mlx-lm on a float32 copy,
//! plus one short `--keep-quantized` run vs mlx-lm's 4-bit path.
//!
//! Cases: greedy (verbose output, timing numbers masked), raw prompt, seeded top-p /
//! top-k / min-p / XTC, `--kv-bits` with a small `--quantized-kv-start`, `--max-kv-size`
//! crossed by generation, `--prompt-cache-file` written by `mlx_lm cache_prompt` and by
//! our `mlx-cache-prompt` (both files loaded by both sides, and compared tensor by
//! tensor), and the prompt/template flags. mlx-lm runs all cases in one process
//! (`gen_oracle.py run`, the same `main()` as the CLI); its answers are cached by a hash
//! of the cases. A seeded case that differs is run again by mlx-lm with the PRNG
//! seeded after loading: "PRNG" in the table means only the random keys mlx-lm's
//! model construction draws make the difference.
//!
//! Options (after `cargo xtask parity`): `--gen-only`, `--no-gen`, `--gen-filter S`
//! (cases whose id contains S), `--no-build` (use the binaries as they are).
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GEN_ORACLE: &str = "xtask/py/gen_oracle.py";
const MAKE: &str = "xtask/py/make_tiny_models.py";
const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// Tiny generation models (names of make_tiny_models.py variants, see gen_oracle.py).
const TINY: &[&str] = &[
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
];
/// Head dim 32: the KV cache can be quantized with group size 32.
const HD32: &[&str] = &["llama-f32-hd32", "qwen3-f32-hd32"];
/// Prompt-cache cases run on these.
const PROMPT_CACHE: &[&str] = &[
    "llama-f32-tied",
    "qwen3-f32-tied",
    "gemma3_text-f32-tied",
    "llama-f32-hd32",
];
const QUANTIZED: &[&str] = &["llama-q4-g32", "qwen3-q8"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cmd {
    Generate,
    CachePrompt,
    CompareCaches,
}

impl Cmd {
    fn oracle_name(self) -> &'static str {
        match self {
            Cmd::Generate => "generate",
            Cmd::CachePrompt => "cache_prompt",
            Cmd::CompareCaches => "compare_caches",
        }
    }
}

/// One comparison: mlx-lm with `py_args`, ours with `our_args`.
struct Case {
    /// Table row.
    row: String,
    /// Table column.
    col: &'static str,
    cmd: Cmd,
    py_args: Vec<String>,
    our_args: Vec<String>,
    stdin: Option<String>,
    seeded: bool,
    /// Ours runs before the oracle (it writes a file mlx-lm reads).
    ours_first: bool,
}

impl Case {
    fn id(&self) -> String {
        format!("{}/{}", self.row, self.col)
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A case run with the same flags on both sides.
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
        ours_first: false,
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

fn cat(parts: &[&[&str]]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .map(|x| x.to_string())
        .collect()
}

fn tiny_cases(models: &Path, pc_dir: &Path, have_cache_prompt: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for &name in TINY {
        let dir = models.join(name);
        let extra: &[&str] = if QUANTIZED.contains(&name) {
            &["--keep-quantized"]
        } else {
            &[]
        };
        let add = |cases: &mut Vec<Case>, col: &'static str, rest: Vec<String>| {
            cases.push(same(name, col, with_model(&dir, &rest), extra));
        };
        add(&mut cases, "greedy", cat(&[CHAT]));
        add(&mut cases, "raw", cat(&[RAW, QUIET]));
        add(
            &mut cases,
            "top-p",
            cat(&[
                CHAT,
                QUIET,
                &["--temp", "0.8", "--top-p", "0.9", "--seed", "7"],
            ]),
        );
        add(
            &mut cases,
            "top-k",
            cat(&[
                CHAT,
                QUIET,
                &["--temp", "1.0", "--top-k", "5", "--seed", "3"],
            ]),
        );
        add(
            &mut cases,
            "min-p",
            cat(&[
                CHAT,
                QUIET,
                &["--temp", "0.7", "--min-p", "0.1", "--seed", "11"],
            ]),
        );
        add(
            &mut cases,
            "kv-size",
            cat(&[
                &[
                    "--prompt",
                    "Once upon a time, there was",
                    "--ignore-chat-template",
                ],
                &["--max-kv-size", "12", "--max-tokens", "20"],
                QUIET,
            ]),
        );
        if HD32.contains(&name) {
            add(
                &mut cases,
                "kv-bits",
                cat(&[
                    CHAT,
                    QUIET,
                    &[
                        "--kv-bits",
                        "4",
                        "--kv-group-size",
                        "32",
                        "--quantized-kv-start",
                        "8",
                    ],
                ]),
            );
        }
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
            let gen_kv: &[&str] = if kv.is_empty() {
                &[]
            } else {
                &["--kv-bits", "8", "--kv-group-size", "32"]
            };
            prompt_cache_cases(
                &mut cases,
                name,
                &dir,
                pc_dir,
                kv,
                gen_kv,
                extra,
                have_cache_prompt,
            );
        }
    }
    cases
}

#[allow(clippy::too_many_arguments)]
fn prompt_cache_cases(
    cases: &mut Vec<Case>,
    row: &str,
    dir: &Path,
    pc_dir: &Path,
    kv: &[&str],
    gen_kv: &[&str],
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
    let gen = |file: &Path| {
        // No --model: both take it from the file's metadata.
        let mut a = s(&[
            "--prompt",
            " about dragons",
            "--max-tokens",
            "10",
            "--verbose",
            "False",
        ]);
        a.extend(["--prompt-cache-file".to_string(), p(file)]);
        a.extend(s(gen_kv));
        a
    };
    cases.push(Case {
        row: row.into(),
        col: "pc-write",
        cmd: Cmd::CachePrompt,
        py_args: make(&py_file),
        our_args: Vec::new(),
        stdin: None,
        seeded: false,
        ours_first: false,
    });
    cases.push(same(row, "pc-mlx-lm", gen(&py_file), extra));
    if have_cache_prompt {
        let mut our_args = make(&our_file);
        our_args.extend(s(extra));
        cases.push(Case {
            row: row.into(),
            col: "pc-ours-file",
            cmd: Cmd::CachePrompt,
            py_args: Vec::new(),
            our_args,
            stdin: None,
            seeded: false,
            ours_first: true,
        });
        cases.push(Case {
            row: row.into(),
            col: "pc-files-equal",
            cmd: Cmd::CompareCaches,
            py_args: vec![p(&py_file), p(&our_file)],
            our_args: Vec::new(),
            stdin: None,
            seeded: false,
            ours_first: false,
        });
        cases.push(same(row, "pc-ours", gen(&our_file), extra));
    }
}

/// Prompt and template flags, on one model.
fn flag_cases(models: &Path) -> Vec<Case> {
    let name = "llama-f32-tied";
    let dir = models.join(name);
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
        cat(&[CHAT, QUIET, &["--extra-eos-token", "Ġthe", "Ġa"]]),
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
    let mut stdin = same(
        row,
        "stdin",
        with_model(
            &dir,
            &cat(&[&["--prompt", "-", "--max-tokens", "8"], QUIET]),
        ),
        &[],
    );
    stdin.stdin = Some("From standard input: héllo\n".into());
    cases.push(stdin);
    cases
}

/// The default model: ours (dequantized on load) vs mlx-lm on a float32 copy.
fn default_cases(q4: &Path, f32: &Path, pc_dir: &Path, have_cache_prompt: bool) -> Vec<Case> {
    let row = "SmolLM2-135M";
    let mut cases = Vec::new();
    let chat: &[&str] = &[
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "16",
    ];
    let both = |col: &'static str, rest: Vec<String>, ours_q4: bool| {
        let mut c = same(row, col, with_model(f32, &rest), &[]);
        if ours_q4 {
            c.our_args = with_model(q4, &rest);
        }
        c
    };
    cases.push(both("greedy", cat(&[chat]), true));
    cases.push(both("greedy-f32", cat(&[chat, QUIET]), false));
    let mut dflt = both("default", cat(&[chat, QUIET]), false);
    dflt.our_args = cat(&[chat, QUIET]);
    cases.push(dflt);
    cases.push(both(
        "top-p",
        cat(&[
            chat,
            QUIET,
            &["--temp", "0.8", "--top-p", "0.9", "--seed", "42"],
        ]),
        true,
    ));
    cases.push(both(
        "kv-bits",
        cat(&[
            chat,
            QUIET,
            &["--kv-bits", "8", "--quantized-kv-start", "8"],
        ]),
        true,
    ));
    cases.push(both(
        "kv-size",
        cat(&[chat, QUIET, &["--max-kv-size", "40", "--max-tokens", "24"]]),
        true,
    ));
    let q4_args = cat(&[
        &[
            "--prompt",
            "hello",
            "--ignore-chat-template",
            "--max-tokens",
            "4",
        ],
        QUIET,
    ]);
    cases.push(same(
        row,
        "q4-keep",
        with_model(q4, &q4_args),
        &["--keep-quantized"],
    ));
    prompt_cache_cases(
        &mut cases,
        row,
        f32,
        pc_dir,
        &[],
        &[],
        &[],
        have_cache_prompt,
    );
    cases
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Builds (unless `--no-build`) and finds our binaries: release if built, else debug.
fn binaries(root: &Path, build: bool) -> Result<(PathBuf, Option<PathBuf>)> {
    let target = target_dir(root);
    let release = target.join("release/mlx-generate").is_file();
    let profile_dir = target.join(if release { "release" } else { "debug" });
    let has_cp_src = root.join("bins/src/bin/mlx-cache-prompt.rs").is_file();
    if build {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(root).args([
            "build",
            "--quiet",
            "-p",
            "mlx-bins",
            "--bin",
            "mlx-generate",
        ]);
        if has_cp_src {
            cmd.args(["--bin", "mlx-cache-prompt"]);
        }
        if release {
            cmd.arg("--release");
        }
        crate::parity::run(&mut cmd)?;
    }
    let gen = profile_dir.join("mlx-generate");
    if !gen.is_file() {
        bail!("{} is not built (cargo build -p mlx-bins)", gen.display());
    }
    let cp = profile_dir.join("mlx-cache-prompt");
    Ok((gen, cp.is_file().then_some(cp)))
}

/// `<mlx-rs cache>/models/SmolLM2-135M-Instruct` (mlx-hub's rule), fetched by running
/// our binary once if it is not there yet.
fn default_model(gen: &Path) -> Result<PathBuf> {
    let var = |v: &str| {
        std::env::var_os(v)
            .filter(|x| !x.is_empty())
            .map(PathBuf::from)
    };
    let cache = var("MLX_RS_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("mlx-rs")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/mlx-rs")))
        .context("no cache directory (MLX_RS_CACHE, XDG_CACHE_HOME, HOME)")?;
    let dir = cache.join("models").join(DEFAULT_MODEL_NAME);
    if !dir.join("tokenizer.json").is_file() {
        eprintln!("parity: fetching the default model");
        crate::parity::run(Command::new(gen).args(["--max-tokens", "1", "--verbose", "False"]))?;
    }
    Ok(dir)
}

fn hash_files(h: &mut impl Hasher, files: &[PathBuf]) {
    for f in files {
        std::fs::read(f).unwrap_or_default().hash(h);
    }
}

fn hex(h: impl Hasher) -> String {
    format!("{:016x}", h.finish())
}

/// Writes the tiny models and the float32 copy of the default model when stale.
fn prepare_models(root: &Path, py: &Path, gen_dir: &Path, default: &Path) -> Result<()> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash_files(
        &mut h,
        &[
            root.join(MAKE),
            root.join(GEN_ORACLE),
            default.join("tokenizer.json"),
        ],
    );
    TINY.hash(&mut h);
    let stamp = gen_dir.join(".stamp");
    let key = hex(h);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == key) {
        return Ok(());
    }
    eprintln!(
        "parity: writing generation models into {}",
        gen_dir.display()
    );
    if gen_dir.exists() {
        std::fs::remove_dir_all(gen_dir)
            .with_context(|| format!("clearing {}", gen_dir.display()))?;
    }
    std::fs::create_dir_all(gen_dir)?;
    crate::parity::run(Command::new(py).arg(root.join(GEN_ORACLE)).args([
        "models",
        &p(&gen_dir.join("models")),
        "--tokenizer",
        &p(default),
    ]))?;
    crate::parity::run(Command::new(py).arg(root.join(GEN_ORACLE)).args([
        "dequantize",
        &p(default),
        &p(&gen_dir.join("smollm2-f32")),
    ]))?;
    std::fs::write(&stamp, key)?;
    Ok(())
}

/// What one side printed.
#[derive(Debug, Clone)]
struct Output {
    stdout: String,
    error: Option<String>,
}

fn json_str(v: &serde_json::Value, k: &str) -> Option<String> {
    v.get(k).and_then(|x| x.as_str()).map(str::to_string)
}

/// Runs the mlx-lm side for `cases` (cached by a hash of the cases and the files they read).
fn oracle(
    root: &Path,
    py: &Path,
    gen_dir: &Path,
    cases: &[serde_json::Value],
    extra_hash: &str,
) -> Result<HashMap<String, Output>> {
    let text = serde_json::to_string_pretty(cases)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    extra_hash.hash(&mut h);
    hash_files(&mut h, &[root.join(GEN_ORACLE)]);
    let key = hex(h);
    let answers = gen_dir.join(format!("oracle-{key}.json"));
    if !answers.is_file() {
        for e in std::fs::read_dir(gen_dir)?.flatten() {
            if e.file_name().to_string_lossy().starts_with("oracle-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let cases_file = gen_dir.join("cases.json");
        std::fs::write(&cases_file, &text)?;
        let tmp = gen_dir.join("oracle.tmp.json");
        eprintln!("parity: running {} mlx-lm cases", cases.len());
        crate::parity::run(Command::new(py).arg(root.join(GEN_ORACLE)).args([
            "run",
            &p(&cases_file),
            &p(&tmp),
        ]))?;
        std::fs::rename(&tmp, &answers)?;
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&answers)?)?;
    let mut out = HashMap::new();
    if let Some(obj) = v.as_object() {
        for (k, r) in obj {
            out.insert(
                k.clone(),
                Output {
                    stdout: json_str(r, "stdout").unwrap_or_default(),
                    error: json_str(r, "error"),
                },
            );
        }
    }
    Ok(out)
}

fn ours(bin: &Path, args: &[String], stdin: Option<&str>) -> Result<Output> {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin.unwrap_or_default().as_bytes());
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Ok(Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        error: (!out.status.success()).then(|| format!("{} {stderr}", out.status)),
    })
}

/// Masks the timing numbers of verbose output (token counts stay).
fn normalize(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            let masked = |prefix: &str| {
                line.strip_prefix(prefix)
                    .and_then(|rest| rest.split_once(" tokens, "))
                    .map(|(n, _)| format!("{prefix}{n} tokens, <tps>"))
            };
            if line.starts_with("Peak memory: ") {
                "Peak memory: <gb>".to_string()
            } else {
                masked("Prompt: ")
                    .or_else(|| masked("Generation: "))
                    .unwrap_or_else(|| line.to_string())
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where two texts first differ, for the report.
fn first_difference(a: &str, b: &str) -> String {
    let i = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let tail = |t: &str| {
        t.chars()
            .skip(i.saturating_sub(8))
            .take(24)
            .collect::<String>()
    };
    format!("char {i}: ours {:?} vs mlx-lm {:?}", tail(a), tail(b))
}

fn oracle_case(c: &Case, reseed: bool) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": if reseed { format!("{}#reseed", c.id()) } else { c.id() },
        "cmd": c.cmd.oracle_name(),
        "args": c.py_args,
    });
    if let Some(s) = &c.stdin {
        v["stdin"] = serde_json::json!(s);
    }
    if reseed {
        v["reseed"] = serde_json::json!(true);
    }
    v
}

/// Runs the generation parity check and prints its table.
pub fn run_gen_parity(root: &Path, py: &Path, args: &[String]) -> Result<()> {
    let flag = |f: &str| args.iter().any(|a| a == f);
    let filter = args
        .iter()
        .position(|a| a == "--gen-filter")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let start = std::time::Instant::now();
    let (gen_bin, cp_bin) = binaries(root, !flag("--no-build"))?;
    let default = default_model(&gen_bin)?;
    let gen_dir = root.join(".cache/parity/generate");
    prepare_models(root, py, &gen_dir, &default)?;
    let pc_dir = gen_dir.join("prompt-caches");
    std::fs::create_dir_all(&pc_dir)?;

    let models = gen_dir.join("models");
    let have_cp = cp_bin.is_some();
    let mut cases = tiny_cases(&models, &pc_dir, have_cp);
    cases.extend(flag_cases(&models));
    cases.extend(default_cases(
        &default,
        &gen_dir.join("smollm2-f32"),
        &pc_dir,
        have_cp,
    ));
    cases.retain(|c| filter.is_empty() || c.id().contains(&filter));

    // Our prompt-cache files first: mlx-lm reads them.
    let mut results: BTreeMap<String, Option<Output>> = BTreeMap::new();
    let mut extra = std::collections::hash_map::DefaultHasher::new();
    for c in cases.iter().filter(|c| c.ours_first) {
        let Some(cp) = &cp_bin else { continue };
        let out = ours(cp, &c.our_args, c.stdin.as_deref())?;
        if let Some(f) = c
            .our_args
            .iter()
            .skip_while(|a| *a != "--prompt-cache-file")
            .nth(1)
        {
            hash_files(&mut extra, &[PathBuf::from(f)]);
        }
        results.insert(c.id(), Some(out));
    }
    let oracle_cases: Vec<serde_json::Value> = cases
        .iter()
        .filter(|c| !c.py_args.is_empty())
        .flat_map(|c| {
            let mut v = vec![oracle_case(c, false)];
            if c.seeded {
                v.push(oracle_case(c, true));
            }
            v
        })
        .collect();
    let expected = oracle(root, py, &gen_dir, &oracle_cases, &hex(extra))?;

    let mut table: BTreeMap<String, Vec<(&'static str, String)>> = BTreeMap::new();
    let mut row_order: Vec<String> = Vec::new();
    let mut details = Vec::new();
    let mut failed = 0;
    for c in &cases {
        let id = c.id();
        let py = expected.get(&id).cloned();
        let cell = match c.cmd {
            Cmd::CompareCaches => match py {
                Some(o) if o.stdout == "identical" => "ok".to_string(),
                Some(o) => {
                    details.push(format!("{id}: {}{}", o.stdout, o.error.unwrap_or_default()));
                    "DIFF".into()
                }
                None => "-".into(),
            },
            Cmd::CachePrompt if c.ours_first => match results.get(&id).cloned().flatten() {
                Some(Output { error: Some(e), .. }) => {
                    details.push(format!("{id}: ours failed: {e}"));
                    "ERR".into()
                }
                _ => "ok".into(),
            },
            Cmd::CachePrompt => match py.and_then(|o| o.error) {
                Some(e) => {
                    details.push(format!("{id}: mlx-lm failed: {e}"));
                    "ERR".into()
                }
                None => "ok".into(),
            },
            Cmd::Generate => {
                let mine = ours(&gen_bin, &c.our_args, c.stdin.as_deref())?;
                compare(
                    c,
                    &mine,
                    py.as_ref(),
                    expected.get(&format!("{id}#reseed")),
                    &mut details,
                )
            }
        };
        if cell != "ok" {
            failed += 1;
        }
        if !table.contains_key(&c.row) {
            row_order.push(c.row.clone());
        }
        table.entry(c.row.clone()).or_default().push((c.col, cell));
    }
    print_table(&row_order, &table);
    for d in &details {
        println!("  {d}");
    }
    if !have_cp {
        println!("  (mlx-cache-prompt is not built: our prompt-cache files were not checked)");
    }
    let n = cases.len();
    let secs = start.elapsed().as_secs_f64();
    if failed > 0 {
        println!(
            "  PRNG = ours equals mlx-lm once mlx-lm's model-construction key draws are taken out"
        );
        bail!("generation parity: {failed} of {n} cases differ from mlx-lm ({secs:.0} s)");
    }
    println!("generation parity: all {n} cases identical to mlx-lm ({secs:.0} s)");
    Ok(())
}

fn compare(
    c: &Case,
    mine: &Output,
    py: Option<&Output>,
    reseeded: Option<&Output>,
    details: &mut Vec<String>,
) -> String {
    let id = c.id();
    let Some(py) = py else { return "-".into() };
    match (&mine.error, &py.error) {
        (Some(a), Some(b)) => {
            details.push(format!("{id}: both failed: ours {a} | mlx-lm {b}"));
            return "ERR".into();
        }
        (Some(a), None) => {
            details.push(format!("{id}: ours failed: {a}"));
            return "ERR".into();
        }
        (None, Some(b)) => {
            details.push(format!("{id}: mlx-lm failed: {b}"));
            return "ERR".into();
        }
        (None, None) => {}
    }
    let (a, b) = (normalize(&mine.stdout), normalize(&py.stdout));
    if a == b {
        return "ok".into();
    }
    if reseeded.is_some_and(|r| r.error.is_none() && normalize(&r.stdout) == a) {
        details.push(format!(
            "{id}: equal to mlx-lm seeded after loading; {}",
            first_difference(&a, &b)
        ));
        return "PRNG".into();
    }
    details.push(format!("{id}: {}", first_difference(&a, &b)));
    "DIFF".into()
}

fn print_table(rows: &[String], table: &BTreeMap<String, Vec<(&'static str, String)>>) {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(10);
    println!(
        "\n{:width$}  generation (mlx-generate vs mlx_lm generate)",
        "model"
    );
    for row in rows {
        let cells: Vec<String> = table
            .get(row)
            .map(|v| {
                v.iter()
                    .map(|(col, cell)| format!("{col}:{cell}"))
                    .collect()
            })
            .unwrap_or_default();
        println!("{row:width$}  {}", cells.join(" "));
    }
}

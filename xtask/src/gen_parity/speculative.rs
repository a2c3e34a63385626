//! Speculative-decoding parity (part of the generation check): `mlx-generate
//! --draft-model` against `mlx_lm generate --draft-model` (mlx-lm's
//! `speculative_generate_step`) on tiny target / draft pairs that share one tokenizer
//! and differ in shape or architecture, greedy and seeded, with `--kv-bits`, with
//! prompt-cache files holding both models' caches, and with several draft lengths.
//! Two more kinds of case compare ours against mlx-lm *without* speculation: greedy
//! speculative output (a draft model or our prompt lookup) must equal plain greedy
//! output, and a target whose sliding-window cache wraps falls back to plain decoding
//! (mlx-lm keeps speculating there on an untrimmable cache: `known`).
//!
//! Models (`xtask/py/spec_oracle.py models`) live in `.cache/parity/speculative`, apart
//! from the main generation models; mlx-lm's answers are cached there by a hash of the
//! cases. `--gen-filter S` keeps the cases whose `row/col` contains S.
use super::cases::{p, Case, Cmd};
use super::{binaries, compare_generation, hash_files, hex, ours, report, Verdict};
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::hash::Hash;
use std::path::Path;
use std::process::Command;

const SPEC_ORACLE: &str = "xtask/py/spec_oracle.py";

const CHAT: &[&str] = &["--prompt", "Tell me a story", "--max-tokens", "16"];
const RAW: &[&str] = &[
    "--prompt",
    "Once upon a time",
    "--ignore-chat-template",
    "--max-tokens",
    "24",
];
/// A prompt that repeats itself: prompt lookup finds drafts in it.
const REPEAT: &[&str] = &[
    "--prompt",
    "the cat sat on the mat. the cat sat on the mat. the cat sat on the",
    "--ignore-chat-template",
    "--max-tokens",
    "32",
];
const QUIET: &[&str] = &["--verbose", "False"];
const SEEDED: &[&str] = &["--temp", "0.8", "--top-p", "0.9", "--seed", "7"];
const KV4: &[&str] = &[
    "--kv-bits",
    "4",
    "--kv-group-size",
    "32",
    "--quantized-kv-start",
    "8",
];

/// Target / draft pairs: same tokenizer, other shapes or architectures.
const PAIRS: &[(&str, &str)] = &[
    ("llama-f32-tied", "llama-f32-hd32"),
    ("llama-f32-tied", "llama-f32-tied"),
    ("llama-f32-tied", "llama-q4-g32"),
    ("llama-f32-tied", "llama-f32-1layer"),
    ("qwen3-f32-tied", "qwen2-f32-tied"),
    ("qwen2-f32-tied", "qwen3-f32-tied"),
    // A sliding-window target whose window (128) the generation never fills.
    ("llama-f32-sliding128", "llama-f32-tied"),
];
/// Pairs whose heads (32) take `--kv-group-size 32`.
const KV_PAIRS: &[(&str, &str)] = &[
    ("llama-f32-hd32", "qwen3-f32-hd32"),
    ("qwen3-f32-hd32", "qwen3-f32-hd32"),
];

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn cat(parts: &[&[&str]]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .map(|x| x.to_string())
        .collect()
}

fn case(row: &str, col: &'static str, py_args: Vec<String>, our_args: Vec<String>) -> Case {
    let seeded = py_args.iter().any(|a| a == "--seed");
    Case {
        row: row.into(),
        col,
        cmd: Cmd::Generate,
        py_args,
        our_args,
        stdin: None,
        seeded,
        known: None,
    }
}

fn model_args(dir: &Path, draft: Option<&Path>, rest: &[String]) -> Vec<String> {
    let mut v = vec!["--model".to_string(), p(dir)];
    if let Some(d) = draft {
        v.extend(["--draft-model".to_string(), p(d)]);
    }
    v.extend(rest.iter().cloned());
    v
}

/// The cases (see the module docs).
fn spec_cases(models: &Path, pc_dir: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    let m = |n: &str| models.join(n);
    for &(target, draft) in PAIRS.iter().chain(KV_PAIRS) {
        let row = format!("spec {target} <- {draft}");
        let (t, d) = (m(target), m(draft));
        let both = |rest: Vec<String>| model_args(&t, Some(&d), &rest);
        let mut same = |col: &'static str, rest: Vec<String>| {
            cases.push(case(&row, col, both(rest.clone()), both(rest)));
        };
        let kv = KV_PAIRS.contains(&(target, draft));
        if kv {
            same("kv-bits", cat(&[CHAT, KV4]));
            same("kv-bits-seeded", cat(&[RAW, QUIET, KV4, SEEDED]));
        } else {
            same("greedy", cat(&[CHAT]));
            same("seeded", cat(&[CHAT, QUIET, SEEDED]));
            same("k1", cat(&[RAW, QUIET, &["--num-draft-tokens", "1"]]));
            same(
                "k5-topk",
                cat(&[
                    RAW,
                    QUIET,
                    &[
                        "--num-draft-tokens",
                        "5",
                        "--temp",
                        "1.0",
                        "--top-k",
                        "5",
                        "--seed",
                        "3",
                    ],
                ]),
            );
            same(
                "max3",
                cat(&[
                    RAW,
                    QUIET,
                    &["--max-tokens", "3", "--num-draft-tokens", "4"],
                ]),
            );
        }
        // Greedy speculative output is plain greedy output (mlx-lm without a draft).
        let rest = cat(&[RAW, QUIET]);
        cases.push(case(
            &row,
            "=plain",
            model_args(&t, None, &rest),
            model_args(&t, Some(&d), &rest),
        ));
    }
    // Prompt-cache files holding the target's caches, then the draft's.
    for (target, draft, kv) in [
        ("llama-f32-tied", "llama-f32-hd32", &[][..]),
        ("qwen3-f32-tied", "qwen2-f32-tied", &[][..]),
        (
            "llama-f32-hd32",
            "qwen3-f32-hd32",
            &[
                "--kv-bits",
                "8",
                "--kv-group-size",
                "32",
                "--quantized-kv-start",
                "0",
            ][..],
        ),
    ] {
        let row = format!("spec {target} <- {draft}");
        let (t, d) = (m(target), m(draft));
        let file = pc_dir.join(format!("{target}+{draft}.safetensors"));
        let mut write = model_args(&t, Some(&d), &s(&["--prompt", "Tell me a story"]));
        write.extend(["--prompt-cache-file".to_string(), p(&file)]);
        write.extend(s(kv));
        cases.push(Case {
            cmd: Cmd::CachePrompt,
            ..case(&row, "pc-write", write, Vec::new())
        });
        let gen_kv: Vec<String> = kv
            .chunks(2)
            .filter(|f| matches!(f[0], "--kv-bits" | "--kv-group-size"))
            .flat_map(|f| f.iter().map(|x| x.to_string()))
            .collect();
        for (col, extra) in [("pc", &[][..]), ("pc-seeded", SEEDED)] {
            // No --model: both take it from the file's metadata.
            let mut a = cat(&[
                &["--prompt", " about dragons", "--max-tokens", "10"],
                QUIET,
                extra,
            ]);
            a.extend(["--draft-model".to_string(), p(&d)]);
            a.extend(["--prompt-cache-file".to_string(), p(&file)]);
            a.extend(gen_kv.iter().cloned());
            cases.push(case(&row, col, a.clone(), a));
        }
    }
    // A sliding-window target whose window (4) fills: ours falls back to plain decoding
    // (equal to mlx-lm without a draft); mlx-lm keeps speculating on a cache it can no
    // longer trim.
    for (target, draft) in [
        ("gemma3_text-f32-tied", "llama-f32-tied"),
        ("gemma3_text-f32-tied", "gemma3_text-f32-tied"),
    ] {
        let row = format!("spec {target} <- {draft}");
        let (t, d) = (m(target), m(draft));
        let rest = cat(&[RAW, QUIET]);
        cases.push(case(
            &row,
            "fallback=plain",
            model_args(&t, None, &rest),
            model_args(&t, Some(&d), &rest),
        ));
        let both = model_args(&t, Some(&d), &rest);
        cases.push(Case {
            known: Some(
                "mlx-lm cannot trim a wrapped rotating cache and keeps the rejected drafts in \
                 it; ours falls back to plain decoding",
            ),
            ..case(&row, "vs-mlx-lm", both.clone(), both)
        });
    }
    // Prompt lookup (ours): greedy output is plain greedy output.
    for target in [
        "llama-f32-tied",
        "qwen3-f32-tied",
        "gemma3_text-f32-tied",
        "llama-f32-sliding128",
    ] {
        let row = format!("lookup {target}");
        let t = m(target);
        for (col, rest) in [
            ("=plain", cat(&[REPEAT, QUIET])),
            ("=plain-chat", cat(&[CHAT, QUIET])),
        ] {
            let mut ours = model_args(&t, None, &rest);
            ours.extend(s(&[
                "--prompt-lookup-ngram",
                "2",
                "--prompt-lookup-tokens",
                "4",
            ]));
            cases.push(case(&row, col, model_args(&t, None, &rest), ours));
        }
    }
    cases
}

fn prepare(root: &Path, py: &Path, dir: &Path) -> Result<()> {
    let tokenizer = root.join(super::TOKENIZER);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash_files(
        &mut h,
        &[
            root.join(SPEC_ORACLE),
            root.join(super::GEN_ORACLE),
            root.join(super::MAKE),
            tokenizer.join("tokenizer.json"),
        ],
    );
    "spec-models-1".hash(&mut h);
    let stamp = dir.join(".stamp");
    let key = hex(h);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == key) {
        return Ok(());
    }
    eprintln!(
        "parity: writing speculative-decoding models into {}",
        dir.display()
    );
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    crate::parity::run(Command::new(py).arg(root.join(SPEC_ORACLE)).args([
        "models",
        &p(&dir.join("models")),
        "--tokenizer",
        &p(&tokenizer),
    ]))?;
    std::fs::write(&stamp, key)?;
    Ok(())
}

/// Runs the speculative-decoding parity check and prints its table.
pub fn run_spec_parity(root: &Path, py: &Path, args: &[String]) -> Result<()> {
    let flag = |f: &str| args.iter().any(|a| a == f);
    let filter = args
        .iter()
        .position(|a| a == "--gen-filter")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let start = std::time::Instant::now();
    let (gen_bin, _) = binaries(root, !flag("--no-build"))?;
    let dir = root.join(".cache/parity/speculative");
    prepare(root, py, &dir)?;
    let pc_dir = dir.join("prompt-caches");
    std::fs::create_dir_all(&pc_dir)?;
    let mut cases = spec_cases(&dir.join("models"), &pc_dir);
    cases.retain(|c| filter.is_empty() || c.id().contains(&filter));
    if cases.is_empty() {
        return Ok(());
    }
    let oracle_cases: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            let cmd = match c.cmd {
                Cmd::CachePrompt => "cache_prompt_draft",
                other => other.oracle_name(),
            };
            serde_json::json!({"id": c.id(), "cmd": cmd, "args": c.py_args})
        })
        .collect();
    let expected = super::oracle_with(SPEC_ORACLE, root, py, &dir, "spec", &oracle_cases, "")?;
    let mut verdicts: HashMap<String, Verdict> = HashMap::new();
    let total = cases.iter().filter(|c| c.cmd == Cmd::Generate).count();
    let mut done = 0;
    for c in &cases {
        let id = c.id();
        let py_out = expected.get(&id);
        let v = match c.cmd {
            Cmd::Generate => {
                done += 1;
                eprint!("\rparity: speculative mlx-generate {done}/{total}");
                let mine = ours(&gen_bin, &c.our_args, None)?;
                compare_generation(c, &mine, py_out)
            }
            _ => match py_out.and_then(|o| o.error.clone()) {
                Some(e) => Verdict::bad("ERR", format!("{id}: mlx-lm failed: {e}")),
                None if py_out.is_none() => Verdict::bad("-", format!("{id}: no mlx-lm answer")),
                None => Verdict::ok(),
            },
        };
        verdicts.insert(id, v);
    }
    eprintln!();
    let failed = report(&cases, &verdicts);
    let (n, secs) = (verdicts.len(), start.elapsed().as_secs_f64());
    if failed > 0 {
        bail!("speculative parity: {failed} of {n} cases differ from mlx-lm ({secs:.0} s)");
    }
    println!("speculative parity: all {n} cases match mlx-lm ({secs:.0} s)");
    Ok(())
}

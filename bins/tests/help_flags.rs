//! `mlx-generate --help` lists every flag of `mlx_lm generate --help` (recorded in
//! goldens/generate/mlx_lm_generate_help.txt by `xtask/py/gen_oracle.py goldens`), and
//! only a few of its own.
mod common;

use std::collections::BTreeSet;

/// Flags of our own, beyond mlx-lm's.
/// Flags of ours where mlx-lm has no such concept (README, docs/structured-output.md,
/// docs/parity.md): the float32 CPU path, constrained decoding, prompt-lookup drafting,
/// speculation that steps aside when its drafts are rejected.
const OURS_ONLY: &[&str] = &[
    "--cpu-dequantize",
    "--version",
    "-V",
    "--json-schema",
    "--grammar",
    "--regex",
    "--prompt-lookup-ngram",
    "--prompt-lookup-tokens",
    "--draft-min-acceptance",
];

/// Every `-x` / `--name` token in a help text.
fn flags(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || matches!(c, '[' | ']' | ',' | '(' | ')' | '='))
        .filter(|t| {
            let name = t.trim_start_matches('-');
            t.starts_with('-')
                && !name.is_empty()
                && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        })
        .map(|t| t.trim_end_matches(['.', ':', '\'']).to_string())
        .collect()
}

fn mlx_lm_flags() -> BTreeSet<String> {
    let path = common::goldens().join("mlx_lm_generate_help.txt");
    let text = std::fs::read_to_string(&path).expect("goldens/generate/mlx_lm_generate_help.txt");
    let found = flags(&text);
    assert!(
        found.len() > 30,
        "too few flags parsed from mlx-lm's help: {found:?}"
    );
    found
}

fn our_help() -> String {
    let out = common::generate(&["--help"], b"");
    assert!(
        out.status.success(),
        "--help failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn help_lists_every_mlx_lm_generate_flag() {
    let ours = flags(&our_help());
    let missing: Vec<String> = mlx_lm_flags()
        .into_iter()
        .filter(|f| !ours.contains(f))
        .collect();
    assert!(missing.is_empty(), "mlx-generate --help lacks {missing:?}");
}

#[test]
fn help_adds_only_known_flags_of_its_own() {
    let theirs = mlx_lm_flags();
    let extra: Vec<String> = flags(&our_help())
        .into_iter()
        .filter(|f| !theirs.contains(f) && !OURS_ONLY.contains(&f.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "flags mlx_lm generate does not have: {extra:?}"
    );
}

/// Whether `flag` takes a value in mlx-lm's help (an upper-case metavar follows it).
fn takes_value(help: &str, flag: &str) -> bool {
    let mut tokens = help.split(|c: char| c.is_whitespace() || matches!(c, '[' | ']' | ','));
    while let Some(t) = tokens.by_ref().next() {
        if t == flag {
            return tokens.next().is_some_and(|m| {
                !m.is_empty() && m.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            });
        }
    }
    false
}

#[test]
fn every_mlx_lm_flag_parses() {
    // Parsing must get past every flag (and its value); the run then stops at
    // --max-tokens 0, an error raised after argument parsing.
    let help = std::fs::read_to_string(common::goldens().join("mlx_lm_generate_help.txt"))
        .expect("golden help");
    for flag in mlx_lm_flags() {
        if matches!(flag.as_str(), "-h" | "--help") {
            continue;
        }
        let mut args = vec![flag.as_str()];
        if takes_value(&help, &flag) {
            args.push("1");
        }
        args.extend(["--max-tokens", "0"]);
        let out = common::generate(&args, b"");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
        assert!(
            !stderr.contains("unexpected argument") && !stderr.contains("invalid value"),
            "{args:?} does not parse: {stderr}"
        );
        assert!(
            !out.status.success(),
            "{args:?} with --max-tokens 0 succeeded"
        );
    }
}

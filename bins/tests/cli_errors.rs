//! `mlx-generate` on bad input: every case exits non-zero with one `error:` line on
//! stderr (clap's usage errors add its usage lines) and never panics.
mod common;

use common::TempDir;
use std::process::Output;

/// The checks every error shares; returns stderr.
fn assert_error(out: &Output, expect: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "expected a failure, got success; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    assert!(
        stderr.starts_with("error: "),
        "stderr does not start with `error: `: {stderr}"
    );
    for e in expect {
        assert!(stderr.contains(e), "stderr lacks {e:?}: {stderr}");
    }
    assert!(
        out.stdout.is_empty(),
        "stdout is not empty: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// A runtime error: exit code 1 and exactly one line.
fn assert_one_line_error(out: &Output, expect: &[&str]) {
    let stderr = assert_error(out, expect);
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
}

fn model_arg(name: &str) -> String {
    common::golden_model(name).to_string_lossy().into_owned()
}

#[test]
fn unknown_flag_is_a_usage_error_naming_it() {
    let out = common::generate(&["--no-such-flag"], b"");
    let stderr = assert_error(&out, &["--no-such-flag"]);
    // argparse and clap both exit 2 on usage errors.
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("error")).count(),
        1,
        "{stderr}"
    );
}

#[test]
fn flag_value_of_the_wrong_type_is_a_usage_error() {
    let out = common::generate(&["--max-tokens", "many"], b"");
    let stderr = assert_error(&out, &["--max-tokens", "many"]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
}

#[test]
fn missing_model_directory_is_an_error_naming_it() {
    let tmp = TempDir::new("missing-model");
    let missing = tmp.0.join("no-such-model");
    let missing = missing.to_string_lossy();
    let out = common::generate(&["--model", &missing, "--max-tokens", "2"], b"");
    assert_one_line_error(&out, &["no-such-model"]);
}

#[test]
fn malformed_config_json_is_an_error_naming_the_file() {
    let tmp = TempDir::new("bad-config");
    let dir = tmp.copy_model("llama-small-f32");
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"llama\", ").expect("write");
    let out = common::generate(
        &["--model", &dir.to_string_lossy(), "--max-tokens", "2"],
        b"",
    );
    assert_one_line_error(&out, &["config.json"]);
}

#[test]
fn unknown_model_type_is_an_error_naming_it() {
    let tmp = TempDir::new("unknown-type");
    let dir = tmp.copy_model("llama-small-f32");
    let path = dir.join("config.json");
    let config = std::fs::read_to_string(&path).expect("config");
    let config = config.replace(
        "\"model_type\": \"llama\"",
        "\"model_type\": \"no_such_arch\"",
    );
    assert!(
        config.contains("no_such_arch"),
        "config.json changed shape: {config}"
    );
    std::fs::write(&path, config).expect("write");
    let out = common::generate(
        &["--model", &dir.to_string_lossy(), "--max-tokens", "2"],
        b"",
    );
    assert_one_line_error(&out, &["no_such_arch"]);
}

#[test]
fn missing_weights_are_an_error() {
    let tmp = TempDir::new("no-weights");
    let dir = tmp.copy_model("llama-small-f32");
    std::fs::remove_file(dir.join("model.safetensors")).expect("remove");
    let out = common::generate(
        &["--model", &dir.to_string_lossy(), "--max-tokens", "2"],
        b"",
    );
    assert_one_line_error(&out, &["safetensors"]);
}

#[test]
fn prompt_longer_than_max_kv_size_runs_with_a_warning() {
    // qwen3 has no make_cache in mlx-lm, so --max-kv-size gives it a rotating cache;
    // mlx-lm runs a longer prompt through it (parity checks the tokens).
    let prompt = "Once upon a time, there was a tiny model that could only say a few words";
    let model = model_arg("qwen3-small-bf16");
    let args = [
        "--model",
        &model,
        "--prompt",
        prompt,
        "--ignore-chat-template",
        "--max-kv-size",
        "8",
        "--max-tokens",
        "4",
        "--verbose",
        "False",
    ];
    let out = common::generate(&args, b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {stderr}");
    assert!(!out.stdout.is_empty(), "no text");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("falls out of the attention window"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning line expected: {stderr}");
    assert!(warnings[0].contains("--max-kv-size 8"), "{stderr}");
}

#[test]
fn max_kv_size_below_one_is_an_error() {
    let model = model_arg("qwen3-small-bf16");
    let out = common::generate(
        &["--model", &model, "--prompt", "hi", "--max-kv-size", "0"],
        b"",
    );
    assert_one_line_error(&out, &["--max-kv-size", "at least 1"]);
}

#[test]
fn non_utf8_standard_input_is_an_error() {
    let model = model_arg("llama-small-f32");
    let out = common::generate(
        &["--model", &model, "--prompt", "-", "--max-tokens", "2"],
        b"ok \xff\xfe",
    );
    assert_one_line_error(&out, &["UTF-8"]);
}

#[test]
fn zero_max_tokens_is_an_error() {
    let model = model_arg("llama-small-f32");
    let out = common::generate(&["--model", &model, "--max-tokens", "0"], b"");
    assert_one_line_error(&out, &["--max-tokens"]);
}

#[test]
fn negative_max_tokens_other_than_minus_one_is_an_error() {
    let model = model_arg("llama-small-f32");
    let out = common::generate(&["--model", &model, "--max-tokens", "-5"], b"");
    assert_one_line_error(&out, &["--max-tokens", "-5"]);
}

#[test]
fn unsupported_flags_say_not_yet_supported() {
    let model = model_arg("llama-small-f32");
    let cases: [(&[&str], &str); 3] = [
        (&["-qa"], "--quantize-activations"),
        (&["--quantize-activations"], "--quantize-activations"),
        (&["--image", "cat.png"], "--image"),
    ];
    for (flags, name) in cases {
        let mut args = vec!["--model", model.as_str(), "--max-tokens", "2"];
        args.extend_from_slice(flags);
        let out = common::generate(&args, b"");
        assert_one_line_error(&out, &[name, "not yet supported"]);
    }
}

#[test]
fn a_missing_draft_model_is_an_error_naming_it() {
    let model = model_arg("llama-small-f32");
    let out = common::generate(
        &[
            "--model",
            &model,
            "--max-tokens",
            "2",
            "--draft-model",
            "no/such-draft",
        ],
        b"",
    );
    assert_one_line_error(&out, &["loading the draft model no/such-draft"]);
}

#[test]
fn a_missing_adapter_path_is_an_error_naming_it() {
    let model = model_arg("llama-small-f32");
    let out = common::generate(
        &[
            "--model",
            &model,
            "--max-tokens",
            "2",
            "--adapter-path",
            "/nonexistent/adapters",
        ],
        b"",
    );
    assert_one_line_error(
        &out,
        &["/nonexistent/adapters: the adapter path does not exist"],
    );
}

#[test]
fn chat_template_config_that_is_not_a_json_object_is_an_error() {
    let model = model_arg("llama-small-f32");
    for bad in ["{not json", "[1, 2]"] {
        let args = [
            "--model",
            &model,
            "--max-tokens",
            "2",
            "--chat-template-config",
            bad,
        ];
        let out = common::generate(&args, b"");
        assert_one_line_error(&out, &["--chat-template-config"]);
    }
}

#[test]
fn missing_prompt_cache_file_is_an_error_naming_it() {
    let tmp = TempDir::new("no-cache-file");
    let file = tmp.0.join("no-such-cache.safetensors");
    let out = common::generate(
        &[
            "--prompt-cache-file",
            &file.to_string_lossy(),
            "--max-tokens",
            "2",
        ],
        b"",
    );
    assert_one_line_error(&out, &["no-such-cache.safetensors"]);
}

#[test]
fn prompt_cache_of_another_model_is_an_error() {
    let pc = common::goldens().join("llama-small-f32.prompt-cache.safetensors");
    let other = model_arg("qwen3-small-bf16");
    let args = [
        "--model",
        &other,
        "--prompt-cache-file",
        &pc.to_string_lossy(),
        "--max-tokens",
        "2",
    ];
    let out = common::generate(&args, b"");
    assert_one_line_error(&out, &["different model"]);
}

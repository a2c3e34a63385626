//! `mlx-generate --adapter-path` against `python -m mlx_lm generate --adapter-path` with
//! adapters made by mlx-lm (LoRA, DoRA, full fine-tune) on float32 and 4-bit models:
//! the same text, greedy and seeded sampling (so the keys mlx-lm's adapter layers take
//! at load are taken here too), and a different text from the model without adapters.
mod common;

use common::TempDir;
use std::process::Command;

fn text(out: &std::process::Output) -> String {
    // The generated text is the line after the first `==========`.
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines()
        .skip_while(|l| *l != "==========")
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

fn case(model: &str, kind: &str) {
    let py = common::mlx_lm_python("mlx_lm.generate");
    let tmp = TempDir::new(&format!("adapters-{model}-{kind}"));
    let m = common::golden_model(model);
    let a = tmp.0.join("adapters");
    common::make_adapters(&py, &m, &a, kind);
    let (m, a) = (m.display().to_string(), a.display().to_string());
    for sampling in [&["--temp", "0"][..], &["--temp", "0.9", "--seed", "5"][..]] {
        let base = ["--model", &m, "--prompt", "hello world", "-m", "16"];
        let with: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--adapter-path", a.as_str()])
            .chain(sampling.iter().copied())
            .collect();
        let ours = common::run(env!("CARGO_BIN_EXE_mlx-generate"), &with, b"");
        common::check(&ours, "mlx-generate");
        let theirs = Command::new(&py)
            .args(["-m", "mlx_lm", "generate"])
            .args(&with)
            .output()
            .unwrap();
        common::check(&theirs, "mlx_lm generate");
        assert_eq!(text(&ours), text(&theirs), "{model} {kind} {sampling:?}");
        let plain: Vec<&str> = base
            .iter()
            .copied()
            .chain(sampling.iter().copied())
            .collect();
        let without = common::run(env!("CARGO_BIN_EXE_mlx-generate"), &plain, b"");
        common::check(&without, "mlx-generate without adapters");
        assert!(!text(&ours).is_empty());
        assert_ne!(
            text(&ours),
            text(&without),
            "{model} {kind}: the adapters changed nothing"
        );
    }
}

#[test]
fn lora_dense_generates_as_mlx_lm() {
    case("llama-small-f32", "lora");
}

#[test]
fn dora_dense_generates_as_mlx_lm() {
    case("llama-small-f32", "dora");
}

#[test]
fn full_fine_tune_generates_as_mlx_lm() {
    case("llama-small-f32", "full");
}

#[test]
fn lora_4bit_generates_as_mlx_lm() {
    case("llama-small-q4-g32", "lora");
}

#[test]
fn dora_4bit_generates_as_mlx_lm() {
    case("llama-small-q4-g32", "dora");
}

#[test]
fn adapters_for_another_model_are_refused_by_name() {
    let py = common::mlx_lm_python("mlx_lm.generate");
    let tmp = TempDir::new("adapters-mismatch");
    let a = tmp.0.join("adapters");
    common::make_adapters(&py, &common::golden_model("llama-small-q4-g32"), &a, "full");
    let m = common::golden_model("llama-small-f32")
        .display()
        .to_string();
    let out = common::run(
        env!("CARGO_BIN_EXE_mlx-generate"),
        &[
            "--model",
            &m,
            "--adapter-path",
            a.to_str().unwrap(),
            "--prompt",
            "hi",
            "-m",
            "2",
        ],
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the adapters do not fit the model")
            && err.contains("model.layers.0.mlp.down_proj.scales: not a parameter of the model"),
        "{err}"
    );
}

/// POSTs `body` to `path` on 127.0.0.1:`port` (HTTP/1.1, connection closed after).
fn post(port: u16, path: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

#[test]
fn the_server_answers_with_the_adapters() {
    // The adapters are used on the server's engine thread, not the one that loaded them.
    let py = common::mlx_lm_python("mlx_lm.generate");
    let tmp = TempDir::new("adapters-server");
    let m = common::golden_model("llama-small-f32");
    let a = tmp.0.join("adapters");
    common::make_adapters(&py, &m, &a, "lora");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_mlx-server"))
        .args([
            "--model",
            m.to_str().unwrap(),
            "--adapter-path",
            a.to_str().unwrap(),
        ])
        .args(["--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let body = r#"{"prompt": "hello world", "max_tokens": 16, "temperature": 0}"#;
    let mut answer = None;
    for _ in 0..100 {
        if let Some(r) = post(port, "/v1/completions", body) {
            answer = Some(r);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = server.kill();
    let _ = server.wait();
    let answer = answer.expect("the server answered");
    let v: serde_json::Value =
        serde_json::from_str(answer.trim()).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let got = v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_string();
    let m = m.display().to_string();
    let args = [
        "--model",
        &m,
        "--adapter-path",
        a.to_str().unwrap(),
        "--prompt",
        "hello world",
        "-m",
        "16",
        "--temp",
        "0",
        "--ignore-chat-template",
    ];
    let gen = common::run(env!("CARGO_BIN_EXE_mlx-generate"), &args, b"");
    common::check(&gen, "mlx-generate");
    assert_eq!(got, text(&gen));
}

//! Standard output closed by its reader (`mlx-generate ... | head -c 1`): the command
//! stops quietly with the shell's SIGPIPE status (141), without a panic message.
mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

/// Runs `bin` with `args`, reads one byte of its output, closes the pipe, and returns
/// the exit code and what it wrote on stderr.
fn read_one_byte_then_close(bin: &str, args: &[&str], stdin: &[u8]) -> (Option<i32>, String) {
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(common::root())
        .env_remove("MLX_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin);
    }
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte).expect("one byte of output");
    drop(stdout);
    let out = child.wait_with_output().expect("the binary finishes");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn model() -> String {
    common::golden_model("llama-small-f32")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn generate_into_a_closed_pipe_exits_quietly_with_status_141() {
    let model = model();
    // Verbose: the text streams token by token, so writes go on after the reader left.
    let args = ["--model", &model, "--prompt", "hi", "--max-tokens", "2000"];
    let (code, stderr) = read_one_byte_then_close(env!("CARGO_BIN_EXE_mlx-generate"), &args, b"");
    assert_eq!(code, Some(141), "stderr: {stderr}");
    assert!(stderr.is_empty(), "stderr: {stderr}");
}

#[test]
fn chat_into_a_closed_pipe_exits_quietly_with_status_141() {
    let model = model();
    let args = ["--model", &model, "--max-tokens", "50"];
    let input = b"hello\nhow are you\nq\n";
    let (code, stderr) = read_one_byte_then_close(env!("CARGO_BIN_EXE_mlx-chat"), &args, input);
    assert_eq!(code, Some(141), "stderr: {stderr}");
    assert!(stderr.is_empty(), "stderr: {stderr}");
}

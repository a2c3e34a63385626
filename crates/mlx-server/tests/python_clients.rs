//! The official `openai` and `anthropic` Python SDKs against the server
//! (`xtask/py/server_clients.py`, run with the repository's `.venv/bin/python`; the
//! script installs the SDKs with pip when they are missing).
mod common;

use common::*;
use mlx_server::ServerConfig;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn official_python_sdks_work_against_the_server() {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "no Python at {}: create the repository's virtual environment (e.g. scripts/setup) to run the SDK checks",
        python.display()
    );
    let cfg = ServerConfig {
        api_key: Some("test-key".into()),
        ..Default::default()
    };
    let server = scripted_server(cfg, Duration::ZERO).await;
    let base = format!("http://{}", server.local_addr());
    let script = root.join("xtask/py/server_clients.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .args(["--base-url", &base, "--api-key", "test-key"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(900), run)
        .await
        .expect("the SDK checks timed out")
        .expect("running the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("checks passed") && !stdout.contains("FAIL"),
        "{stdout}"
    );
    server.shutdown().await.unwrap();
}

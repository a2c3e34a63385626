//! Per-request `adapters` on one server: LoRA adapters kept resident on the shared base
//! model (mlx-lm's server reloads the model with them instead). A request with adapters
//! X gets the tokens of a server started with `--adapter-path X` (whose tokens
//! `adapters.rs` checks against mlx-lm), requests with adapters X, Y and none running
//! at once each get the tokens they get alone, and missing or misfitting adapters get a
//! clear 404 / 400 while the server keeps serving.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use common::TempDir;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

/// A running `mlx-server`, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Server {
    start_program(Command::new(env!("CARGO_BIN_EXE_mlx-server")).args(args))
}

/// Starts `program` with `--port` and a free port, and waits until it listens.
fn start_program(program: &mut Command) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = program
        .args(["--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server { child, port };
    for _ in 0..300 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return server;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the server on port {port} did not start");
}

/// Sends `method path` with `body`: the status and the body.
fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, rest) = out.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, rest.to_string())
}

/// POSTs `body` to `/v1/completions`: the status and the JSON answer.
fn post(port: u16, body: &Value) -> (u16, Value) {
    let (status, rest) = request(port, "POST", "/v1/completions", &body.to_string());
    let v = serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{e}: {rest}"));
    (status, v)
}

/// The value of counter `name` in `/metrics`.
fn counter(port: u16, name: &str) -> f64 {
    let (status, text) = request(port, "GET", "/metrics", "");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// The greedy completion of `prompt` (with `adapters` when given).
fn complete(port: u16, prompt: &str, adapters: Option<&str>) -> String {
    complete_on(port, "default_model", prompt, adapters)
}

/// [`complete`] on the model `model`.
fn complete_on(port: u16, model: &str, prompt: &str, adapters: Option<&str>) -> String {
    let mut body = json!({"model": model, "prompt": prompt, "max_tokens": 48, "temperature": 0});
    if let Some(a) = adapters {
        body["adapters"] = json!(a);
    }
    let (status, v) = post(port, &body);
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

fn case(model: &str) {
    let py = common::mlx_lm_python("mlx_lm.generate");
    let tmp = TempDir::new(&format!("resident-adapters-{model}"));
    let m = common::golden_model(model);
    let (x, y) = (tmp.0.join("x"), tmp.0.join("y"));
    common::make_adapters_seeded(&py, &m, &x, "lora", 7);
    common::make_adapters_seeded(&py, &m, &y, "lora", 11);
    let (m, x, y) = (
        m.display().to_string(),
        x.display().to_string(),
        y.display().to_string(),
    );
    let prompts = ["hello world", "the quick brown fox"];
    // The reference: servers started with the adapters applied at load.
    let mut own = Vec::new();
    for a in [&x, &y] {
        let s = start(&["--model", &m, "--adapter-path", a]);
        own.push(prompts.map(|p| complete(s.port, p, None)));
    }
    let shared = start(&["--model", &m]);
    let plain = prompts.map(|p| complete(shared.port, p, None));
    // (a) Alone, each adapter as its own server; the base model unchanged between.
    for (a, want) in [&x, &y].iter().zip(&own) {
        for (p, w) in prompts.iter().zip(want) {
            assert_eq!(&complete(shared.port, p, Some(a)), w, "{model} {a} {p:?}");
        }
    }
    assert_eq!(prompts.map(|p| complete(shared.port, p, None)), plain);
    assert_ne!(own[0], plain, "{model}: adapters X changed nothing");
    assert_ne!(
        own[0], own[1],
        "{model}: adapters X and Y give the same text"
    );
    // Both kept resident on the one model: no model of their own was loaded.
    let (_, models) = request(shared.port, "GET", "/v1/models", "");
    let models: Value = serde_json::from_str(models.trim()).unwrap();
    let entries = models["data"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .all(|e| !e["id"].as_str().unwrap().contains('@')),
        "{models}"
    );
    let base = entries.iter().find(|e| e["id"] == json!(m)).unwrap();
    assert_eq!(base["resident_adapters"], json!([x, y]), "{models}");
    // (b) X, Y and none at once (twice each, two prompts): one batch on one model.
    let steps = counter(shared.port, "mlx_server_decode_steps_total");
    let rows = counter(shared.port, "mlx_server_decode_rows_total");
    let mut jobs = Vec::new();
    for round in 0..2 {
        for (k, a) in [Some(x.clone()), Some(y.clone()), None]
            .into_iter()
            .enumerate()
        {
            let p = prompts[(round + k) % 2];
            let want = match k {
                0 | 1 => own[k][(round + k) % 2].clone(),
                _ => plain[(round + k) % 2].clone(),
            };
            let port = shared.port;
            jobs.push(std::thread::spawn(move || {
                (complete(port, p, a.as_deref()), want, a, p)
            }));
        }
    }
    for j in jobs {
        let (got, want, a, p) = j.join().unwrap();
        assert_eq!(got, want, "{model}: {a:?} {p:?} in a mixed batch");
    }
    // Rows shared decoding steps (six requests, each with 48 tokens to decode).
    let steps = counter(shared.port, "mlx_server_decode_steps_total") - steps;
    let rows = counter(shared.port, "mlx_server_decode_rows_total") - rows;
    assert!(rows > steps * 1.5, "{model}: {rows} rows in {steps} steps");
}

#[test]
fn resident_lora_on_a_dense_base_matches_its_own_server() {
    case("llama-small-f32");
}

#[test]
fn resident_lora_on_a_4bit_base_matches_its_own_server() {
    case("llama-small-q4-g32");
}

#[test]
fn missing_and_misfitting_adapters_are_refused_and_the_server_keeps_serving() {
    let py = common::mlx_lm_python("mlx_lm.generate");
    let tmp = TempDir::new("resident-adapters-errors");
    let m = common::golden_model("llama-small-f32");
    let (good, other, dora) = (tmp.0.join("good"), tmp.0.join("other"), tmp.0.join("dora"));
    common::make_adapters(&py, &m, &good, "lora");
    // Adapters of a model with other shapes (head_dim 32: wider attention projections).
    common::make_adapters(
        &py,
        &common::golden_model("llama-small-f32-hd32"),
        &other,
        "lora",
    );
    common::make_adapters(&py, &m, &dora, "dora");
    let m = m.display().to_string();
    // A models file naming the good adapters `support` on a second model.
    let config = tmp.0.join("models.json");
    std::fs::write(
        &config,
        json!({"models": [{"id": "tiny", "path": m,
                           "resident_adapters": {"support": good}}]})
        .to_string(),
    )
    .unwrap();
    let s = start(&["--model", &m, "--models-config", config.to_str().unwrap()]);
    let before = complete(s.port, "hello world", Some(good.to_str().unwrap()));
    assert_eq!(
        complete_on(s.port, "tiny", "hello world", Some("support")),
        before,
        "adapters named in the models file"
    );

    let missing = tmp.0.join("nowhere").display().to_string();
    let (status, v) = post(
        s.port,
        &json!({"prompt": "hi", "max_tokens": 2, "adapters": missing}),
    );
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 404, "{v}");
    assert!(
        msg.contains(&missing) && msg.contains("could not be found"),
        "{v}"
    );

    let (status, v) = post(
        s.port,
        &json!({"prompt": "hi", "max_tokens": 2, "adapters": other.to_str().unwrap()}),
    );
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 400, "{v}");
    assert!(
        msg.contains("do not fit the model") && msg.contains("q_proj"),
        "{v}"
    );
    assert_eq!(v["error"]["param"], "adapters", "{v}");

    // DoRA cannot share the base: it is served as a model of its own, with mlx-lm's
    // tokens (those of a server started with it).
    let d = dora.to_str().unwrap();
    let got = complete(s.port, "hello world", Some(d));
    let own = start(&["--model", &m, "--adapter-path", d]);
    assert_eq!(got, complete(own.port, "hello world", None));

    // Still serving, with the same answers.
    assert_eq!(
        complete(s.port, "hello world", Some(good.to_str().unwrap())),
        before
    );
}

/// The adapters `/v1/models` lists as resident on the model `model`.
fn resident(port: u16, model: &str) -> Value {
    let (status, models) = request(port, "GET", "/v1/models", "");
    assert_eq!(status, 200, "{models}");
    let models: Value = serde_json::from_str(models.trim()).unwrap();
    let entries = models["data"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .all(|e| !e["id"].as_str().unwrap().contains('@')),
        "an adapter loaded as a model of its own: {models}"
    );
    let base = entries.iter().find(|e| e["id"] == json!(model)).unwrap();
    assert_eq!(base["state"], "loaded", "{models}");
    base.get("resident_adapters")
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn with_one_resident_adapter_the_least_recently_used_is_evicted_and_reloaded() {
    let py = common::mlx_lm_python("mlx_lm.generate");
    let tmp = TempDir::new("resident-adapters-evict");
    let m = common::golden_model("llama-small-f32");
    let (x, y) = (tmp.0.join("x"), tmp.0.join("y"));
    common::make_adapters_seeded(&py, &m, &x, "lora", 7);
    common::make_adapters_seeded(&py, &m, &y, "lora", 11);
    let (m, x, y) = (
        m.display().to_string(),
        x.display().to_string(),
        y.display().to_string(),
    );
    let prompt = "the quick brown fox";
    let own: Vec<String> = [&x, &y]
        .iter()
        .map(|a| {
            let s = start(&["--model", &m, "--adapter-path", a]);
            complete(s.port, prompt, None)
        })
        .collect();
    assert_ne!(own[0], own[1], "adapters X and Y give the same text");

    let s = start(&["--model", &m, "--max-resident-adapters", "1"]);
    let plain = complete(s.port, prompt, None);
    assert_eq!(resident(s.port, &m), Value::Null);
    // X, then Y (X is evicted to make room), then X again (Y is evicted, X reloaded):
    // each answer is that of the server started with those adapters.
    for (a, want) in [(&x, &own[0]), (&y, &own[1]), (&x, &own[0])] {
        assert_eq!(&complete(s.port, prompt, Some(a)), want, "adapters {a}");
        assert_eq!(resident(s.port, &m), json!([a]), "after a request with {a}");
    }
    // Twice in a row: kept, not reloaded; the base model is unchanged by all this.
    assert_eq!(&complete(s.port, prompt, Some(&x)), &own[0]);
    assert_eq!(resident(s.port, &m), json!([x]));
    assert_eq!(complete(s.port, prompt, None), plain);
}

#[test]
fn seeded_sampling_with_request_adapters_gives_mlx_lm_servers_tokens() {
    // mlx-lm's server loads the model with the request's adapters (building the LoRA
    // layers draws keys from MLX's global sequence), then seeds that sequence with the
    // request's seed and samples from it: the load's draws do not reach the answer.
    // Ours keeps the adapters resident and gives each seeded request its own sequence
    // from `mx.random.seed(seed)`: the same tokens, every one of them.
    let py = common::mlx_lm_python("mlx_lm.server");
    let tmp = TempDir::new("resident-adapters-seeded");
    let m = common::golden_model("llama-small-f32");
    let x = tmp.0.join("x");
    common::make_adapters_seeded(&py, &m, &x, "lora", 7);
    let (m, x) = (m.display().to_string(), x.display().to_string());
    let theirs = start_program(
        Command::new(&py)
            .args(["-m", "mlx_lm.server", "--model", &m])
            .current_dir(common::root()),
    );
    let ours = start(&["--model", &m]);
    let ask = |port: u16, seed: u64, adapters: Option<&str>| {
        let mut body = json!({"model": m, "prompt": "hello world", "max_tokens": 16,
                              "temperature": 0.9, "seed": seed});
        if let Some(a) = adapters {
            body["adapters"] = json!(a);
        }
        let (status, v) = post(port, &body);
        assert_eq!(status, 200, "{v}");
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let mut answers = Vec::new();
    for adapters in [Some(x.as_str()), None, Some(x.as_str())] {
        for seed in [3, 5] {
            let want = ask(theirs.port, seed, adapters);
            assert_eq!(
                ask(ours.port, seed, adapters),
                want,
                "seed {seed} {adapters:?}"
            );
            answers.push(want);
        }
    }
    assert_ne!(answers[0], answers[1], "seeds 3 and 5 give the same text");
    assert_ne!(answers[0], answers[2], "the adapters changed nothing");
    assert_eq!(answers[0], answers[4], "a seeded answer changed");
}

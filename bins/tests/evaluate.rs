//! `mlx-evaluate` end to end against `mlx_lm.evaluate` on a committed tiny model: three
//! local lm_eval tasks (`dataset_path: json` with local `data_files`): multiple choice,
//! `loglikelihood_rolling` perplexity and `generate_until`. Both write the results file
//! with the same name and the same metrics. mlx-lm runs through
//! `xtask/py/eval_mlx_lm.py` (its own main(), plus the include path it lacks).
//!
//! Needs lm_eval in the Python of mlx-lm (scripts/setup.sh installs the pinned one);
//! where it is missing the test says so and skips.
mod common;

use std::path::Path;
use std::process::Command;

const MC: &[&str] = &[
    r#"{"question": "The sky is", "choices": [" blue", " green", " loud"], "label": 0}"#,
    r#"{"question": "Two plus two is", "choices": [" four", " five"], "label": 0}"#,
    r#"{"question": "Fire is", "choices": [" cold", " hot", " wet", " purple"], "label": 1}"#,
    r#"{"question": "A cat says", "choices": [" meow", " moo"], "label": 0}"#,
];
const TEXT: &[&str] = &[
    r#"{"text": "The quick brown fox jumps over the lazy dog."}"#,
    r#"{"text": "hello world, this is a longer text to score as a whole"}"#,
    r#"{"text": "a b c"}"#,
];
const GEN: &[&str] = &[
    r#"{"question": "Say hello:", "answer": "hello"}"#,
    r#"{"question": "Count: one two", "answer": "three"}"#,
];

fn write_tasks(dir: &Path) {
    let data = |name: &str, rows: &[&str]| {
        let p = dir.join(format!("{name}.jsonl"));
        std::fs::write(&p, rows.join("\n") + "\n").unwrap();
        p.display().to_string()
    };
    let mc = data("mc", MC);
    let text = data("text", TEXT);
    let gen = data("gen", GEN);
    std::fs::write(
        dir.join("tiny_mc.yaml"),
        format!(
            "task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {mc}\n\
             test_split: test\noutput_type: multiple_choice\n\
             doc_to_text: \"{{{{question}}}}\"\ndoc_to_choice: \"{{{{choices}}}}\"\n\
             doc_to_target: label\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("tiny_ppl.yaml"),
        format!(
            "task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {text}\n\
             test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: \"\"\n\
             doc_to_target: \"{{{{text}}}}\"\nmetric_list:\n  - metric: word_perplexity\n\
             \x20 - metric: byte_perplexity\n  - metric: bits_per_byte\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("tiny_gen.yaml"),
        format!(
            "task: tiny_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {gen}\n\
             test_split: test\noutput_type: generate_until\ndoc_to_text: \"{{{{question}}}}\"\n\
             doc_to_target: \"{{{{answer}}}}\"\ngeneration_kwargs:\n  until: [\"\\n\"]\n\
             \x20 max_gen_toks: 6\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n"
        ),
    )
    .unwrap();
}

fn python_with_lm_eval() -> Option<std::path::PathBuf> {
    let py = common::mlx_lm_python("mlx_lm");
    let ok = Command::new(&py)
        .args(["-c", "import lm_eval"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(py)
    } else {
        eprintln!(
            "SKIPPED: lm_eval is not installed for {} (scripts/setup.sh installs it)",
            py.display()
        );
        None
    }
}

#[test]
fn metrics_equal_mlx_lm_evaluate() {
    let Some(py) = python_with_lm_eval() else {
        return;
    };
    metrics_equal(&py, &common::golden_model("llama-small-f32"), "evaluate");
}

/// The same with the real default model (SmolLM2-135M-Instruct, resolved as every
/// command resolves it, its chat template applied as mlx-lm's default does): a few
/// minutes on a CPU, so run on demand (`cargo nextest run -p mlx-bins --run-ignored
/// only -E 'test(default_model)'`).
#[test]
#[ignore = "slow on a CPU: the default model through mlx-evaluate and mlx_lm.evaluate"]
fn metrics_equal_mlx_lm_evaluate_default_model() {
    let Some(py) = python_with_lm_eval() else {
        return;
    };
    let model = mlx_hub::resolve_model(None)
        .unwrap_or_else(|e| panic!("the default model is not available: {e}"));
    metrics_equal(&py, &model, "evaluate-default");
}

/// `mlx-evaluate` and `mlx_lm.evaluate` on the three local tasks with `model`: the same
/// result file name and the same metrics.
fn metrics_equal(py: &Path, model: &Path, tag: &str) {
    let tmp = common::TempDir::new(tag);
    let tasks = tmp.0.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    write_tasks(&tasks);
    let (ours, theirs) = (tmp.0.join("ours"), tmp.0.join("theirs"));
    let common_args = |out: &Path| -> Vec<String> {
        [
            "--model",
            model.to_str().unwrap(),
            "--tasks",
            "tiny_mc",
            "tiny_ppl",
            "tiny_gen",
            "--include-path",
            tasks.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
            "--batch-size",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    let mut args = common_args(&ours);
    args.extend(["--python".to_string(), py.display().to_string()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-evaluate"))
        .args(&refs)
        .current_dir(common::root())
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mlx-evaluate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new(py)
        .arg(common::root().join("xtask/py/eval_mlx_lm.py"))
        .args(common_args(&theirs))
        .current_dir(common::root())
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mlx_lm.evaluate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&ours), names(&theirs), "result file names");
    let file = &names(&theirs)[0];
    let read = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join(file)).unwrap()).unwrap()
    };
    let (got, want) = (read(&ours), read(&theirs));
    for task in ["tiny_mc", "tiny_ppl", "tiny_gen"] {
        assert!(want.get(task).is_some(), "mlx-lm has no {task}: {want}");
    }
    assert_eq!(got, want, "metrics differ from mlx_lm.evaluate");
}

#[test]
fn missing_lm_eval_is_named() {
    // A Python without lm_eval: the error names the package.
    let py = Command::new("python3")
        .args(["-c", "import lm_eval"])
        .output()
        .is_ok_and(|o| o.status.success());
    if py {
        eprintln!("SKIPPED: the system python3 has lm_eval");
        return;
    }
    let model = common::golden_model("llama-small-f32");
    let out = common::run(
        env!("CARGO_BIN_EXE_mlx-evaluate"),
        &[
            "--model",
            model.to_str().unwrap(),
            "--tasks",
            "x",
            "--python",
            "python3",
            "--output-dir",
            std::env::temp_dir().to_str().unwrap(),
        ],
        b"",
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lm_eval"), "{stderr}");
}

/// A `GET` on 127.0.0.1:`port`: whether the answer is 200.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200")
}

/// mlx-server with `model` on a free port, killed on drop.
struct ServerProcess(std::process::Child, u16);

impl ServerProcess {
    fn start(model: &Path) -> ServerProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_mlx-server"))
            .args(["--model", model.to_str().unwrap()])
            .args(["--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut server = ServerProcess(child, port);
        for _ in 0..300 {
            if healthy(port) {
                return server;
            }
            if let Ok(Some(status)) = server.0.try_wait() {
                panic!("mlx-server exited: {status}");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = server.0.kill();
        panic!("mlx-server did not become healthy");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The one file under `dir` (searched recursively) whose name starts with `prefix`.
fn find_file(dir: &Path, prefix: &str) -> std::path::PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            {
                return p;
            }
        }
    }
    panic!("no {prefix}* under {}", dir.display());
}

/// mlx-lm's `_score_fn` on one token sequence: the float32 log-probability of each
/// token after the first, as the doubles they are.
fn score_fn_oracle(py: &Path, model: &Path, seq: &[u32]) -> Vec<f64> {
    let case = serde_json::json!({"model": model, "score": [seq], "step_size": 2048});
    let v = oracle(py, &case);
    v["score"]["scores"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().parse().unwrap())
        .collect()
}

/// `xtask/py/eval_scores_oracle.py` (mlx-lm's `MLXLM` methods) on `case`.
fn oracle(py: &Path, case: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let mut child = Command::new(py)
        .arg(common::root().join("xtask/py/eval_scores_oracle.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(case.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "oracle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// lm-evaluation-harness's `local-completions` backend against `mlx-server` (prompts
/// sent as batches of token-id lists, `echo` with `logprobs` for scoring) on the three
/// local tasks: the multiple-choice and generation metrics equal `mlx_lm.evaluate`'s on
/// the same model (without the chat template, which `local-completions` does not apply),
/// each generated answer equals mlx-lm's `generate_until`'s, and each perplexity
/// document's log-likelihood equals mlx-lm's `_score_fn` on the tokens the harness
/// sent, bit for bit. (The perplexity metrics themselves differ from
/// `mlx_lm.evaluate`'s by design: the harness's API backend scores the first token too,
/// after a prefix token, where mlx-lm's `loglikelihood_rolling` starts scoring at the
/// second token.)
#[test]
fn lm_eval_local_completions_against_mlx_server_equals_mlx_lm() {
    let Some(py) = python_with_lm_eval() else {
        return;
    };
    let ok = Command::new(&py)
        .args(["-c", "import tenacity, aiohttp, transformers"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: lm_eval's api extra is not installed (scripts/setup.sh installs it)");
        return;
    }
    let tmp = common::TempDir::new("evaluate-local-completions");
    let tasks = tmp.0.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    write_tasks(&tasks);
    let model = common::golden_model("llama-small-f32");
    let server = ServerProcess::start(&model);
    let (ours, theirs) = (tmp.0.join("ours"), tmp.0.join("theirs"));
    let model_args = format!(
        "base_url=http://127.0.0.1:{}/v1/completions,tokenizer={},tokenizer_backend=huggingface,\
         tokenized_requests=True,max_retries=1",
        server.1,
        model.display()
    );
    let out = Command::new(&py)
        .args(["-m", "lm_eval", "run", "--model", "local-completions"])
        .args(["--model_args", &model_args])
        .args(["--tasks", "tiny_mc,tiny_ppl,tiny_gen", "--batch_size", "2"])
        .args(["--include_path", tasks.to_str().unwrap()])
        .args(["--output_path", ours.to_str().unwrap(), "--log_samples"])
        .args(["--seed", "123"])
        .current_dir(common::root())
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
        .output()
        .unwrap();
    drop(server);
    assert!(
        out.status.success(),
        "lm_eval local-completions failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut args: Vec<String> = [
        "--model",
        model.to_str().unwrap(),
        "--tasks",
        "tiny_mc",
        "tiny_gen",
        "--include-path",
        tasks.to_str().unwrap(),
        "--output-dir",
        theirs.to_str().unwrap(),
        "--batch-size",
        "2",
        "--no-apply-chat-template",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.insert(
        0,
        common::root()
            .join("xtask/py/eval_mlx_lm.py")
            .display()
            .to_string(),
    );
    let out = Command::new(&py)
        .args(&args)
        .current_dir(common::root())
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mlx_lm.evaluate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let got = read(&find_file(&ours, "results_"));
    let want = read(&find_file(&theirs, "eval_"));
    for task in ["tiny_mc", "tiny_gen"] {
        let (g, w) = (&got["results"][task], &want[task]);
        let metrics: Vec<&String> = w
            .as_object()
            .unwrap_or_else(|| panic!("mlx-lm has no {task}: {want}"))
            .iter()
            .filter(|(k, v)| k.contains(',') && v.is_number())
            .map(|(k, _)| k)
            .collect();
        assert!(metrics.len() >= 2, "{task}: {w}");
        for m in metrics {
            assert_eq!(
                g[m], w[m],
                "{task} {m}: local-completions {g} vs mlx-lm {w}"
            );
        }
    }

    // Perplexity: each document as the harness sent it (the prefix token, then the
    // text's tokens), its log-likelihood the sum of the echoed prompt log-probabilities.
    let tok = mlx_tokenizer::Tokenizer::from_dir(&model).unwrap();
    let prefix = tok
        .bos_token_id()
        .expect("the tiny model's tokenizer has a BOS token");
    let samples = std::fs::read_to_string(find_file(&ours, "samples_tiny_ppl")).unwrap();
    let mut n = 0;
    for line in samples.lines().filter(|l| !l.trim().is_empty()) {
        let s: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = s["doc"]["text"].as_str().unwrap();
        let mut resp = &s["filtered_resps"];
        while let Some(first) = resp.as_array().and_then(|a| a.first()) {
            resp = first;
        }
        // The harness logs the value as a number or as its string.
        let got = resp
            .as_f64()
            .or_else(|| resp.as_str().and_then(|x| x.parse().ok()))
            .unwrap_or_else(|| panic!("{s}"));
        let mut seq = vec![prefix];
        seq.extend(tok.encode(text, false).unwrap());
        let want: f64 = score_fn_oracle(&py, &model, &seq).iter().sum();
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{text:?}: local-completions {got} vs _score_fn {want}"
        );
        n += 1;
    }
    assert_eq!(n, TEXT.len(), "one sample per perplexity document");

    // Generation: each answer equals mlx-lm's `generate_until` on the same request.
    let samples = std::fs::read_to_string(find_file(&ours, "samples_tiny_gen")).unwrap();
    let (mut reqs, mut got) = (Vec::new(), Vec::new());
    for line in samples.lines().filter(|l| !l.trim().is_empty()) {
        let s: serde_json::Value = serde_json::from_str(line).unwrap();
        let a = &s["arguments"]["gen_args_0"];
        reqs.push(serde_json::json!([a["arg_0"], a["arg_1"]]));
        got.push(s["filtered_resps"][0].clone());
    }
    assert_eq!(reqs.len(), GEN.len());
    let want = oracle(&py, &serde_json::json!({"model": model, "generate": reqs}));
    assert_eq!(serde_json::json!(got), want["generate"], "generated texts");
}

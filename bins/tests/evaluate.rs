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
    let tmp = common::TempDir::new("evaluate");
    let tasks = tmp.0.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    write_tasks(&tasks);
    let model = common::golden_model("llama-small-f32");
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

    let out = Command::new(&py)
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

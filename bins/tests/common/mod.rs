//! Shared helpers of the binary tests: paths, running a binary, temp model dirs.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The workspace root (goldens' relative paths are relative to it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bins/ has a parent")
        .to_path_buf()
}

/// `goldens/generate`.
pub fn goldens() -> PathBuf {
    root().join("goldens/generate")
}

/// A tiny model with a tokenizer, committed in goldens/generate/models.
pub fn golden_model(name: &str) -> PathBuf {
    goldens().join("models").join(name)
}

/// Runs `mlx-generate` in the workspace root with `args`, feeding `stdin`.
pub fn generate(args: &[&str], stdin: &[u8]) -> Output {
    run(env!("CARGO_BIN_EXE_mlx-generate"), args, stdin)
}

/// Runs `bin` in the workspace root.
pub fn run(bin: &str, args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(root())
        .env_remove("MLX_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    if let Some(mut pipe) = child.stdin.take() {
        // The binary may exit before reading: a broken pipe is fine here.
        let _ = pipe.write_all(stdin);
    }
    child.wait_with_output().expect("the binary finishes")
}

/// Runs `bin` in the workspace root with the environment settings `envs`, and panics
/// with its streams unless it succeeded.
pub fn run_env(bin: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let out = Command::new(bin)
        .args(args)
        .current_dir(root())
        .envs(envs.iter().copied())
        .output()
        .expect("the binary runs");
    check(&out, &format!("{bin} {args:?} with {envs:?}"));
    out
}

/// The value `X` of mlx-perplexity's `Perplexity: X ± Y` line.
pub fn perplexity_of(out: &Output) -> f64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Perplexity: "))
        .unwrap_or_else(|| panic!("no perplexity line in {stdout}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// The generated text of mlx-generate's output (between its `==========` lines).
pub fn generated_text(out: &Output) -> String {
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.split("==========").nth(1).unwrap_or(&s).to_string()
}

/// A JSON Lines file in `dir` of the real text the quality gates score: the long
/// paragraphs of `crates/mlx-quant/src/calibration.txt`, one `{"text": ...}` row each.
pub fn calibration_jsonl(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("crates/mlx-quant/src/calibration.txt"))
        .expect("the calibration text");
    let rows: Vec<String> = text
        .split("\n\n")
        .filter(|p| p.len() > 200)
        .map(|p| serde_json::json!({ "text": p }).to_string())
        .collect();
    assert!(
        rows.len() >= 4,
        "calibration text has {} paragraphs",
        rows.len()
    );
    let data = dir.join("text.jsonl");
    std::fs::write(&data, rows.join("\n") + "\n").expect("writing the rows");
    data
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty directory named after `tag` and this process.
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mlx-bins-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    /// A copy of a golden model in this directory.
    pub fn copy_model(&self, name: &str) -> PathBuf {
        let src = golden_model(name);
        let dst = self.0.join(name);
        std::fs::create_dir_all(&dst).expect("model dir");
        for entry in std::fs::read_dir(&src).expect("golden model dir") {
            let entry = entry.expect("dir entry");
            std::fs::copy(entry.path(), dst.join(entry.file_name())).expect("copy");
        }
        dst
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Python with mlx-lm 0.32.2 that can import `module`: `MLX_PYTHON`, else the
/// project's `.venv` (scripts/setup.sh makes it).
pub fn mlx_lm_python(module: &str) -> PathBuf {
    let venv = root().join(".venv/bin/python");
    let candidates: Vec<PathBuf> = std::env::var_os("MLX_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::iter::once(venv))
        .collect();
    for py in &candidates {
        let ok = Command::new(py)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return py.clone();
        }
    }
    panic!("this test needs Python with mlx-lm 0.32.2 (tried {candidates:?}): run scripts/setup.sh or set MLX_PYTHON");
}

/// Makes adapters for `model` in `out` with mlx-lm's own `linear_to_lora_layers`
/// (`kind`: lora, dora or full; rank 4, scale 7.5, the last two layers), their `lora_b`
/// and DoRA magnitudes perturbed (a fresh adapter's `lora_b` is zero) so every adapted
/// weight changes; a full fine-tune perturbs the last two layers' weights.
pub fn make_adapters(py: &Path, model: &Path, out: &Path, kind: &str) {
    make_adapters_seeded(py, model, out, kind, 7)
}

/// [`make_adapters`] with MLX seeded with `seed` (other seeds: other adapters).
pub fn make_adapters_seeded(py: &Path, model: &Path, out: &Path, kind: &str, seed: u64) {
    let made = Command::new(py)
        .args([
            "-c",
            MAKE_ADAPTERS,
            model.to_str().unwrap(),
            out.to_str().unwrap(),
            kind,
            &seed.to_string(),
        ])
        .output()
        .expect("python runs");
    check(&made, "making the adapters");
}

/// Panics with both streams unless `out` succeeded.
pub fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const MAKE_ADAPTERS: &str = r#"
import json, pathlib, sys
import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import load_model
from mlx_lm.tuner.utils import linear_to_lora_layers

model_dir, out, kind = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
num_layers = 2
mx.random.seed(int(sys.argv[4]) if len(sys.argv) > 4 else 7)
model, _ = load_model(pathlib.Path(model_dir))
model.freeze()
params = {"rank": 4, "scale": 7.5, "dropout": 0.0}
if kind == "full":
    for layer in model.layers[-num_layers:]:
        layer.unfreeze()
else:
    linear_to_lora_layers(model, num_layers, params, use_dora=(kind == "dora"))
trained = []
for name, p in tree_flatten(model.trainable_parameters()):
    noise = mx.random.normal(p.shape).astype(p.dtype)
    if name.endswith("lora_b"):
        p = 0.05 * noise
    elif name.endswith(".m"):
        p = p * (1 + 0.1 * noise)
    elif kind == "full":
        p = p + 0.01 * noise
    trained.append((name, p))
model.update(tree_unflatten(trained))
out.mkdir(parents=True, exist_ok=True)
mx.save_safetensors(str(out / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))
cfg = {"fine_tune_type": kind, "num_layers": num_layers}
if kind != "full":
    cfg["lora_parameters"] = params
(out / "adapter_config.json").write_text(json.dumps(cfg))
"#;

/// Every tensor of a saved model directory: name -> (dtype, shape, bytes).
pub fn tensors(dir: &Path) -> std::collections::BTreeMap<String, (String, Vec<i32>, Vec<u8>)> {
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let (arrays, _) = mlx_array::io::load_safetensors(&p).unwrap();
            for (k, a) in arrays {
                let v = (
                    a.dtype().name().to_string(),
                    a.shape(),
                    a.to_bytes().unwrap(),
                );
                out.insert(k, v);
            }
        }
    }
    assert!(!out.is_empty(), "no weights saved in {}", dir.display());
    out
}

/// A temporary HOME (under `tmp`) whose mlx-lm cache holds a calibration text of several
/// sequences of 16 or 32 tokens, each unlike the others (so their order shows): what
/// `mlx_lm.gptq` / `mlx_lm.awq` and ours read as `~/.cache/mlx-lm/calibration_v5.txt`.
pub fn calibration_home(tmp: &TempDir) -> PathBuf {
    let home = tmp.0.join("home");
    let cache = home.join(".cache/mlx-lm");
    std::fs::create_dir_all(&cache).unwrap();
    let text = [
        "the quick brown fox jumps over the lazy dog while a small cat sleeps",
        "rivers carry silt to the sea and the delta grows a little every spring",
        "seven bakers argued about bread until the ovens cooled in the night",
        "a lighthouse keeper counted ships and wrote their names in a blue book",
        "numbers like 1024 and 3.14159 appear in code, tables and old letters",
        "when the train stopped, everyone looked out at the snow on the hills",
    ]
    .join(" ");
    std::fs::write(cache.join("calibration_v5.txt"), text).unwrap();
    home
}

/// The `--flag` names a command's `--help` text lists.
pub fn help_flags(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_alphanumeric())
                .to_string()
        })
        .collect()
}

/// A JSON file's value.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `bin` with `args` and `HOME` set to `home` (no `MLX_LOG`).
pub fn run_with_home(bin: &str, home: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("HOME", home)
        .env_remove("MLX_LOG")
        .output()
        .expect("the command starts")
}

/// Asserts that `ours` holds the same tensors, bit for bit, and the same `quantization`
/// and `quantization_config` sections as mlx-lm's output `theirs`; returns our
/// config.json.
pub fn assert_same_quantized_model(theirs: &Path, ours: &Path, tag: &str) -> serde_json::Value {
    let (want, got) = (tensors(theirs), tensors(ours));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{tag}"
    );
    for (k, w) in &want {
        assert!(w == &got[k], "{tag}: {k} differs from mlx-lm's");
    }
    let (wc, gc) = (
        read_json(&theirs.join("config.json")),
        read_json(&ours.join("config.json")),
    );
    assert_eq!(wc["quantization"], gc["quantization"], "{tag}");
    assert_eq!(
        wc["quantization_config"], gc["quantization_config"],
        "{tag}"
    );
    gc
}

/// Asserts that our command `ours` (`--help`) takes every flag mlx-lm's (`python
/// theirs_args... --help`) lists, and has only `extra` besides.
pub fn assert_takes_mlx_lm_flags(py: &Path, theirs_args: &[&str], ours: &str, extra: &[&str]) {
    let theirs_out = Command::new(py)
        .args(theirs_args)
        .arg("--help")
        .output()
        .unwrap();
    check(&theirs_out, &format!("{theirs_args:?} --help"));
    let ours_out = Command::new(ours).arg("--help").output().unwrap();
    check(&ours_out, &format!("{ours} --help"));
    let (theirs, ours_flags) = (
        help_flags(&String::from_utf8_lossy(&theirs_out.stdout)),
        help_flags(&String::from_utf8_lossy(&ours_out.stdout)),
    );
    assert!(theirs.len() >= 10, "{theirs:?}");
    let missing: Vec<_> = theirs.difference(&ours_flags).collect();
    assert!(
        missing.is_empty(),
        "{theirs_args:?} flags {ours} lacks: {missing:?}"
    );
    let own: Vec<_> = ours_flags.difference(&theirs).collect();
    assert_eq!(own, extra, "our own flags");
}

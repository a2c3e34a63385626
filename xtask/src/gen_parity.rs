//! Generation parity (part of `cargo xtask parity`): the text `mlx-generate` prints
//! against `python -m mlx_lm generate` with the same flags.
//!
//! Models: tiny seeded checkpoints of every architecture (make_tiny_models.py's
//! variants, written by `xtask/py/gen_oracle.py models` into
//! `.cache/parity/generate/models` with the committed byte-level BPE tokenizer of
//! `goldens/generate/tokenizer` and a matching vocab_size), and the default model
//! (SmolLM2-135M-Instruct, its real tokenizer; its 4-bit directory on both sides, and
//! our opt-in `--cpu-dequantize` against mlx-lm on a float32 copy). Both sides always run
//! with the same flags: a quantized model stays quantized by default, as in mlx-lm.
//!
//! The config sweep (`xtask/py/sweep_models.py`): three tiny configs of every
//! architecture whose switches (biases, tied heads, GQA ratios, head_dim, rope variants,
//! sliding windows, dtypes, quantization bits and group sizes, where the EOS token is
//! declared) are drawn from a fixed seed, each run greedy with mlx-lm's default flags and
//! with seeded sampling.
//!
//! Cases (see `cases.rs`): greedy (verbose output, timing numbers masked), raw prompt,
//! seeded top-p / top-k / min-p / XTC, `--kv-bits` with a small `--quantized-kv-start`,
//! `--max-kv-size` crossed by generation and shorter than the prompt,
//! `--prompt-cache-file` written by
//! `mlx_lm cache_prompt` and by our `mlx-cache-prompt` (both files loaded by both
//! sides, and compared tensor by tensor), the prompt/template flags, and `mlx-perplexity`
//! against `mlx_lm perplexity` (report and unrounded values). mlx-lm runs
//! all cases in one process (`gen_oracle.py run`, the same `main()` as the CLI); its
//! answers are cached under `.cache/parity/generate` by a hash of the cases.
//!
//! Both sides seed before loading, and our loader takes the keys mlx-lm's model
//! construction draws (`mlx_models::model::mlx_lm_init_key_draws`). A seeded case that
//! differs is run again by mlx-lm with the PRNG seeded after loading: `PRNG` in the
//! table (a failure) means only that key count is off. `known` marks a deliberate
//! difference (not a failure).
//!
//! Options (after `cargo xtask parity`): `--gen-only`, `--no-gen`, `--gen-filter S[,T]`
//! (cases whose `row/col` contains S or T), `--no-build` (use the binaries as built).
use anyhow::{bail, Context, Result};
use cases::{p, Case, Cmd};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod cases;
mod speculative;

const GEN_ORACLE: &str = "xtask/py/gen_oracle.py";
const MAKE: &str = "xtask/py/make_tiny_models.py";
const SWEEP: &str = "xtask/py/sweep_models.py";
const TOKENIZER: &str = "goldens/generate/tokenizer";
const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Builds (unless `--no-build`) and finds our binaries: release if built, else debug.
fn binaries(root: &Path, build: bool) -> Result<(PathBuf, Option<PathBuf>)> {
    let target = target_dir(root);
    let release = target.join("release/mlx-generate").is_file();
    let profile_dir = target.join(if release { "release" } else { "debug" });
    let has_cp_src = root.join("bins/src/bin/mlx-cache-prompt.rs").is_file();
    if build {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(root).args([
            "build",
            "--quiet",
            "-p",
            "mlx-bins",
            "--bin",
            "mlx-generate",
            "--bin",
            "mlx-perplexity",
        ]);
        if has_cp_src {
            cmd.args(["--bin", "mlx-cache-prompt"]);
        }
        if release {
            cmd.arg("--release");
        }
        crate::parity::run(&mut cmd)?;
    }
    let gen = profile_dir.join("mlx-generate");
    if !gen.is_file() {
        bail!("{} is not built (cargo build -p mlx-bins)", gen.display());
    }
    let cp = profile_dir.join("mlx-cache-prompt");
    Ok((gen, cp.is_file().then_some(cp)))
}

/// `<mlx-rs cache>/models/SmolLM2-135M-Instruct` (mlx-hub's rule), fetched by running
/// our binary once if it is not there yet.
fn default_model(gen: &Path) -> Result<PathBuf> {
    let var = |v: &str| {
        std::env::var_os(v)
            .filter(|x| !x.is_empty())
            .map(PathBuf::from)
    };
    let cache = var("MLX_RS_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("mlx-rs")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/mlx-rs")))
        .context("no cache directory (MLX_RS_CACHE, XDG_CACHE_HOME, HOME)")?;
    let dir = cache.join("models").join(DEFAULT_MODEL_NAME);
    if !dir.join("tokenizer.json").is_file() {
        eprintln!("parity: fetching the default model");
        crate::parity::run(Command::new(gen).args(["--max-tokens", "1", "--verbose", "False"]))?;
    }
    Ok(dir)
}

fn hash_files(h: &mut impl Hasher, files: &[PathBuf]) {
    for f in files {
        std::fs::read(f).unwrap_or_default().hash(h);
    }
}

fn hex(h: impl Hasher) -> String {
    format!("{:016x}", h.finish())
}

/// Writes the tiny models and the float32 copy of the default model when stale.
fn prepare_models(root: &Path, py: &Path, gen_dir: &Path, default: &Path) -> Result<()> {
    let tokenizer = root.join(TOKENIZER);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash_files(
        &mut h,
        &[
            root.join(MAKE),
            root.join(GEN_ORACLE),
            root.join(SWEEP),
            tokenizer.join("tokenizer.json"),
        ],
    );
    cases::TINY.hash(&mut h);
    // The sweep over every architecture (sweep_models.py: on unless empty or "0")
    // writes other models.
    std::env::var("MLX_SWEEP_ALL")
        .is_ok_and(|v| !v.is_empty() && v != "0")
        .hash(&mut h);
    let stamp = gen_dir.join(".stamp");
    let key = hex(h);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == key) {
        return Ok(());
    }
    eprintln!(
        "parity: writing generation models into {}",
        gen_dir.display()
    );
    if gen_dir.exists() {
        std::fs::remove_dir_all(gen_dir)
            .with_context(|| format!("clearing {}", gen_dir.display()))?;
    }
    std::fs::create_dir_all(gen_dir)?;
    let oracle = root.join(GEN_ORACLE);
    let models = p(&gen_dir.join("models"));
    crate::parity::run(Command::new(py).arg(&oracle).args([
        "models",
        &models,
        "--tokenizer",
        &p(&tokenizer),
        "--variants",
        &cases::TINY.join(","),
    ]))?;
    eprintln!("parity: writing the config sweep");
    crate::parity::run(Command::new(py).arg(root.join(SWEEP)).args([
        &p(&gen_dir.join("sweep")),
        "--tokenizer",
        &p(&tokenizer),
    ]))?;
    let f32 = p(&gen_dir.join("smollm2-f32"));
    crate::parity::run(
        Command::new(py)
            .arg(&oracle)
            .args(["dequantize", &p(default), &f32]),
    )?;
    std::fs::write(&stamp, key)?;
    Ok(())
}

/// What one side printed.
#[derive(Debug, Clone)]
struct Output {
    stdout: String,
    error: Option<String>,
    /// Perplexity and its standard error, unrounded (perplexity cases).
    exact: Option<(f64, f64)>,
}

/// Runs the mlx-lm side of `cases` (cached by a hash of the cases, the files they
/// read, and `salt`), as the file `oracle-<tag>-<hash>.json`.
fn oracle(
    root: &Path,
    py: &Path,
    gen_dir: &Path,
    tag: &str,
    cases: &[serde_json::Value],
    salt: &str,
) -> Result<HashMap<String, Output>> {
    oracle_with(GEN_ORACLE, root, py, gen_dir, tag, cases, salt)
}

/// [`oracle`] with another oracle script (its `run` subcommand).
fn oracle_with(
    script: &str,
    root: &Path,
    py: &Path,
    gen_dir: &Path,
    tag: &str,
    cases: &[serde_json::Value],
    salt: &str,
) -> Result<HashMap<String, Output>> {
    if cases.is_empty() {
        return Ok(HashMap::new());
    }
    let text = serde_json::to_string_pretty(cases)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    salt.hash(&mut h);
    hash_files(
        &mut h,
        &[
            root.join(GEN_ORACLE),
            root.join(script),
            gen_dir.join(".stamp"),
        ],
    );
    let answers = gen_dir.join(format!("oracle-{tag}-{}.json", hex(h)));
    if !answers.is_file() {
        let prefix = format!("oracle-{tag}-");
        for e in std::fs::read_dir(gen_dir)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let cases_file = gen_dir.join(format!("cases-{tag}.json"));
        std::fs::write(&cases_file, &text)?;
        let tmp = gen_dir.join("oracle.tmp.json");
        eprintln!("parity: running {} mlx-lm cases ({tag})", cases.len());
        crate::parity::run(Command::new(py).arg(root.join(script)).args([
            "run",
            &p(&cases_file),
            &p(&tmp),
        ]))?;
        std::fs::rename(&tmp, &answers)?;
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&answers)?)?;
    let field =
        |r: &serde_json::Value, k: &str| r.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let mut out = HashMap::new();
    for (k, r) in v.as_object().into_iter().flatten() {
        let stdout = field(r, "stdout").unwrap_or_default();
        out.insert(
            k.clone(),
            Output {
                stdout,
                error: field(r, "error"),
                exact: r.get("exact").and_then(|e| {
                    let num = |i: usize| e.get(i)?.as_str()?.parse::<f64>().ok();
                    Some((num(0)?, num(1)?))
                }),
            },
        );
    }
    Ok(out)
}

fn ours(bin: &Path, args: &[String], stdin: Option<&str>) -> Result<Output> {
    ours_with(bin, args, stdin, &[]).map(|(o, _)| o)
}

/// [`ours`] with extra environment variables; also returns standard error.
fn ours_with(
    bin: &Path,
    args: &[String],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> Result<(Output, String)> {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin.unwrap_or_default().as_bytes());
    }
    let out = child.wait_with_output()?;
    let full = String::from_utf8_lossy(&out.stderr).into_owned();
    let stderr = full.trim().replace('\n', " | ");
    let output = Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        error: (!out.status.success()).then(|| format!("{}: {stderr}", out.status)),
        exact: None,
    };
    Ok((output, full))
}

/// Runs `mlx-perplexity` with its debug log on, reading the unrounded values from it.
fn ours_perplexity(bin: &Path, c: &Case) -> Result<Output> {
    let env = [("MLX_LOG", "mlx_perplexity=debug"), ("NO_COLOR", "1")];
    let (mut out, stderr) = ours_with(bin, &c.our_args, None, &env)?;
    out.exact = stderr.lines().find_map(|l| {
        let rest = l.split_once("perplexity ")?.1;
        let (ppl, rest) = rest.split_once(" ± ")?;
        let se = rest.split_whitespace().next()?;
        Some((ppl.parse().ok()?, se.parse().ok()?))
    });
    // The report names the model: the same text on both sides where they load
    // different copies of it.
    let (mine, theirs) = (model_arg(&c.our_args), model_arg(&c.py_args));
    if let (Some(m), Some(t)) = (mine, theirs) {
        out.stdout = out.stdout.replace(m, t);
    }
    Ok(out)
}

fn model_arg(args: &[String]) -> Option<&str> {
    let i = args.iter().position(|a| a == "--model")?;
    args.get(i + 1).map(String::as_str)
}

/// A perplexity case: the same report (timings masked) and the same unrounded values.
fn compare_perplexity(c: &Case, mine: &Output, py: Option<&Output>) -> Verdict {
    let v = compare_generation(c, mine, py);
    if v.cell != "ok" {
        return v;
    }
    let id = c.id();
    match (mine.exact, py.and_then(|o| o.exact)) {
        (Some(a), Some(b)) if a.0.to_bits() == b.0.to_bits() && a.1.to_bits() == b.1.to_bits() => {
            Verdict::ok()
        }
        (Some(a), Some(b)) => Verdict::bad(
            "DIFF",
            format!(
                "{id}: perplexity {:?} ± {:?} vs mlx-lm {:?} ± {:?}",
                a.0, a.1, b.0, b.1
            ),
        ),
        (a, b) => Verdict::bad(
            "-",
            format!("{id}: unrounded values missing (ours {a:?}, mlx-lm {b:?})"),
        ),
    }
}

/// Masks the timing numbers of verbose output (token counts stay).
fn normalize(text: &str) -> String {
    let masked = |line: &str, prefix: &str| {
        line.strip_prefix(prefix)
            .and_then(|rest| rest.split_once(" tokens, "))
            .map(|(n, _)| format!("{prefix}{n} tokens, <tps>"))
    };
    text.split('\n')
        .map(|line| {
            if line.starts_with("Peak memory: ") {
                "Peak memory: <gb>".to_string()
            } else if line.starts_with("Evaluation time: ") {
                "Evaluation time: <s>".to_string()
            } else if line.starts_with("Tokens per second: ") {
                "Tokens per second: <tps>".to_string()
            } else {
                masked(line, "Prompt: ")
                    .or_else(|| masked(line, "Generation: "))
                    .unwrap_or_else(|| line.to_string())
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where two texts first differ, for the report.
fn first_difference(a: &str, b: &str) -> String {
    let i = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let tail = |t: &str| {
        t.chars()
            .skip(i.saturating_sub(8))
            .take(24)
            .collect::<String>()
    };
    format!("char {i}: ours {:?} vs mlx-lm {:?}", tail(a), tail(b))
}

fn oracle_case(c: &Case, reseed: bool) -> serde_json::Value {
    let id = if reseed {
        format!("{}#reseed", c.id())
    } else {
        c.id()
    };
    let mut v = serde_json::json!({"id": id, "cmd": c.cmd.oracle_name(), "args": c.py_args});
    if let Some(s) = &c.stdin {
        v["stdin"] = serde_json::json!(s);
    }
    if reseed {
        v["reseed"] = serde_json::json!(true);
    }
    v
}

/// A table cell and, when not "ok", the line that explains it.
struct Verdict {
    cell: &'static str,
    detail: Option<String>,
}

impl Verdict {
    fn ok() -> Verdict {
        Verdict {
            cell: "ok",
            detail: None,
        }
    }
    fn bad(cell: &'static str, detail: String) -> Verdict {
        Verdict {
            cell,
            detail: Some(detail),
        }
    }
    fn failed(&self) -> bool {
        !matches!(self.cell, "ok" | "known")
    }
}

fn compare_generation(c: &Case, mine: &Output, py: Option<&Output>) -> Verdict {
    let id = c.id();
    let Some(py) = py else {
        return Verdict::bad("-", format!("{id}: no mlx-lm answer"));
    };
    if let (Some(why), true) = (c.known, mine.error.is_some() || py.error.is_some()) {
        let err = mine
            .error
            .as_ref()
            .or(py.error.as_ref())
            .cloned()
            .unwrap_or_default();
        return Verdict::bad("known", format!("{id}: {why}; {err}"));
    }
    match (&mine.error, &py.error) {
        (Some(a), Some(b)) => {
            return Verdict::bad("ERR", format!("{id}: both failed: ours {a} | mlx-lm {b}"))
        }
        (Some(a), None) => return Verdict::bad("ERR", format!("{id}: ours failed: {a}")),
        (None, Some(b)) => return Verdict::bad("ERR", format!("{id}: mlx-lm failed: {b}")),
        (None, None) => {}
    }
    let (a, b) = (normalize(&mine.stdout), normalize(&py.stdout));
    if a == b {
        return Verdict::ok();
    }
    let diff = first_difference(&a, &b);
    match c.known {
        Some(why) => Verdict::bad("known", format!("{id}: {why}; {diff}")),
        None => Verdict::bad("DIFF", format!("{id}: {diff}")),
    }
}

/// Runs the generation parity check (then the speculative-decoding one,
/// [`speculative`]; `--spec-only`: that one alone) and prints their tables.
pub fn run_gen_parity(root: &Path, py: &Path, args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--spec-only") {
        return speculative::run_spec_parity(root, py, args);
    }
    let plain = run_plain_gen_parity(root, py, args);
    let spec = speculative::run_spec_parity(root, py, args);
    plain.and(spec)
}

/// The generation parity check without speculative decoding.
fn run_plain_gen_parity(root: &Path, py: &Path, args: &[String]) -> Result<()> {
    let flag = |f: &str| args.iter().any(|a| a == f);
    let filter = args
        .iter()
        .position(|a| a == "--gen-filter")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let start = std::time::Instant::now();
    let (gen_bin, cp_bin) = binaries(root, !flag("--no-build"))?;
    let default = default_model(&gen_bin)?;
    let gen_dir = root.join(".cache/parity/generate");
    prepare_models(root, py, &gen_dir, &default)?;
    let pc_dir = gen_dir.join("prompt-caches");
    std::fs::create_dir_all(&pc_dir)?;

    let models = gen_dir.join("models");
    let have_cp = cp_bin.is_some();
    let mut cases = cases::tiny_cases(&models, &pc_dir, have_cp);
    cases.extend(cases::flag_cases(&models));
    let sweep_dir = gen_dir.join("sweep");
    let sweep = cases::read_sweep(&sweep_dir)?;
    cases.extend(cases::sweep_cases(&sweep_dir, &sweep));
    cases.extend(cases::default_cases(
        &default,
        &gen_dir.join("smollm2-f32"),
        &pc_dir,
        have_cp,
    ));
    let ppl_data = cases::write_perplexity_data(&gen_dir.join("perplexity-data"))?;
    cases.extend(cases::perplexity_cases(&models, &ppl_data, &default));
    let ppl_bin = gen_bin.with_file_name("mlx-perplexity");
    // `--gen-filter a,b`: cases whose id contains one of them.
    let filters: Vec<&str> = filter.split(',').filter(|f| !f.is_empty()).collect();
    cases.retain(|c| filters.is_empty() || filters.iter().any(|f| c.id().contains(f)));

    // Our prompt-cache files first: mlx-lm reads them.
    let mut verdicts: HashMap<String, Verdict> = HashMap::new();
    let mut salt = std::collections::hash_map::DefaultHasher::new();
    let data_files: Vec<PathBuf> = ppl_data
        .iter()
        .map(|(_, d)| d.join("train.jsonl"))
        .collect();
    hash_files(&mut salt, &data_files);
    for c in cases
        .iter()
        .filter(|c| c.cmd == Cmd::CachePrompt && !c.our_args.is_empty())
    {
        let Some(cp) = &cp_bin else { continue };
        let out = ours(cp, &c.our_args, c.stdin.as_deref())?;
        let file = c
            .our_args
            .iter()
            .skip_while(|a| *a != "--prompt-cache-file")
            .nth(1);
        hash_files(
            &mut salt,
            &file.map(PathBuf::from).into_iter().collect::<Vec<_>>(),
        );
        let v = match out.error {
            Some(e) => Verdict::bad("ERR", format!("{}: ours failed: {e}", c.id())),
            None => Verdict::ok(),
        };
        verdicts.insert(c.id(), v);
    }
    let first: Vec<serde_json::Value> = cases
        .iter()
        .filter(|c| !c.py_args.is_empty())
        .map(|c| oracle_case(c, false))
        .collect();
    let expected = oracle(root, py, &gen_dir, "main", &first, &hex(salt))?;
    let oracle_done = start.elapsed().as_secs_f64();

    let mut outputs: HashMap<String, Output> = HashMap::new();
    let total = cases.iter().filter(|c| c.cmd == Cmd::Generate).count();
    let mut done = 0;
    for c in &cases {
        let id = c.id();
        let py_out = expected.get(&id);
        let v = match c.cmd {
            Cmd::CompareCaches => match py_out {
                Some(o) if o.stdout == "identical" => Verdict::ok(),
                Some(o) => Verdict::bad(
                    "DIFF",
                    format!("{id}: {}{}", o.stdout, o.error.clone().unwrap_or_default()),
                ),
                None => Verdict::bad("-", format!("{id}: no mlx-lm answer")),
            },
            Cmd::CachePrompt if c.py_args.is_empty() => continue,
            Cmd::CachePrompt => match py_out.and_then(|o| o.error.clone()) {
                Some(e) => Verdict::bad("ERR", format!("{id}: mlx-lm failed: {e}")),
                None => Verdict::ok(),
            },
            Cmd::Perplexity => {
                let mine = ours_perplexity(&ppl_bin, c)?;
                compare_perplexity(c, &mine, py_out)
            }
            Cmd::Generate => {
                done += 1;
                eprint!("\rparity: mlx-generate {done}/{total}");
                let mine = ours(&gen_bin, &c.our_args, c.stdin.as_deref())?;
                let v = compare_generation(c, &mine, py_out);
                outputs.insert(id.clone(), mine);
                v
            }
        };
        verdicts.insert(id, v);
    }
    eprintln!();
    let ours_done = start.elapsed().as_secs_f64();

    // Seeded cases that differ: does mlx-lm, seeded again after loading, agree?
    let retry: Vec<&Case> = cases
        .iter()
        .filter(|c| c.seeded && verdicts.get(&c.id()).is_some_and(|v| v.cell == "DIFF"))
        .collect();
    let second: Vec<serde_json::Value> = retry.iter().map(|c| oracle_case(c, true)).collect();
    let reseeded = oracle(root, py, &gen_dir, "reseed", &second, "")?;
    for c in retry {
        let id = c.id();
        let (Some(mine), Some(r)) = (outputs.get(&id), reseeded.get(&format!("{id}#reseed")))
        else {
            continue;
        };
        if r.error.is_none() && normalize(&r.stdout) == normalize(&mine.stdout) {
            let detail = verdicts
                .get(&id)
                .and_then(|v| v.detail.clone())
                .unwrap_or_default();
            verdicts.insert(
                id,
                Verdict::bad(
                    "PRNG",
                    format!("{detail} (equal once mlx-lm is seeded after loading)"),
                ),
            );
        }
    }

    let mut failed = report(&cases, &verdicts);
    let key_draws = cases::sweep_key_draw_mismatches(&sweep_dir, &sweep)?;
    for line in &key_draws {
        println!("  {line}");
    }
    if key_draws.is_empty() {
        println!("  sweep: every config's loading takes mlx-lm's number of keys");
    }
    failed += key_draws.len();
    if !have_cp {
        println!("  (mlx-cache-prompt is not built: our prompt-cache files were not checked)");
    }
    let (n, secs) = (verdicts.len(), start.elapsed().as_secs_f64());
    println!(
        "  time: {oracle_done:.0} s to mlx-lm's answers (models, builds included), {:.0} s ours, {:.0} s reseeded mlx-lm",
        ours_done - oracle_done,
        secs - ours_done
    );
    if failed > 0 {
        bail!("generation parity: {failed} of {n} cases differ from mlx-lm ({secs:.0} s)");
    }
    println!("generation parity: all {n} cases match mlx-lm ({secs:.0} s)");
    Ok(())
}

/// Prints the table (one row per model, `col:verdict` cells) and the details; returns
/// how many cases failed.
fn report(cases: &[Case], verdicts: &HashMap<String, Verdict>) -> usize {
    let mut rows: Vec<&str> = Vec::new();
    let mut cells: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in cases {
        let Some(v) = verdicts.get(&c.id()) else {
            continue;
        };
        if !cells.contains_key(c.row.as_str()) {
            rows.push(&c.row);
        }
        cells
            .entry(&c.row)
            .or_default()
            .push(format!("{}:{}", c.col, v.cell));
    }
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(10);
    println!(
        "\n{:width$}  generation: mlx-generate vs mlx_lm generate",
        "model"
    );
    for row in &rows {
        println!(
            "{row:width$}  {}",
            cells.get(row).map(|v| v.join(" ")).unwrap_or_default()
        );
    }
    let mut failed = 0;
    for c in cases {
        if let Some(v) = verdicts.get(&c.id()) {
            if let Some(d) = &v.detail {
                println!("  {d}");
            }
            failed += usize::from(v.failed());
        }
    }
    failed
}

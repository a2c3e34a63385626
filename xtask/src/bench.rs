//! `cargo xtask bench`: our `mlx-benchmark` against mlx-lm's `mlx_lm.benchmark` on the
//! same model and settings, plus the time from process start to the first token.
//!
//! Each tool runs as its own process with `-n 1` (every process does its own warm-up
//! generation at the same shapes first, as `mlx_lm.benchmark` does); after one untimed
//! run of each, the trials alternate ours / mlx-lm (the order flips every round) so the
//! noise of a shared machine hits both. The startup measurement is the wall time of
//! `mlx-generate --model M --prompt hi -m 1 --verbose False` against
//! `python -m mlx_lm generate` with the same arguments, best of N each, alternating.
//!
//! Prints a table of averages and ratios (ours / mlx-lm) and, with `--out FILE`, appends
//! the same table with its provenance (date, commit, machine, MLX version, commands).
//! `--server` compares `mlx-server` with `mlx_lm.server` under concurrent streams (see
//! the `server` module).
use anyhow::{anyhow, bail, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

mod server;

const USAGE: &str = "usage: cargo xtask bench [options]
  --model DIR|default      model directory (default: the embedded SmolLM2-135M-Instruct)
  -p, --prompt-tokens N    prompt length (default 512)
  -g, --generation-tokens N  tokens generated per trial (default 128)
  -b, --batch-size N       batch size (default 1)
  -n, --num-trials N       timed trials per tool (default 3)
  --prefill-step-size N    passed to both benchmarks (default: theirs, 2048)
  --ttft-runs N            startup-to-first-token runs per tool, best kept (default 3; 0 skips)
  --python PATH            Python with mlx and mlx-lm (default: $MLX_PYTHON, else .venv)
  --ours PATH              our mlx-benchmark binary, or the directory holding it and
                           mlx-generate (default: $CARGO_TARGET_DIR or target, /release;
                           built with `cargo build --release -p mlx-bins` when missing)
  --ours-arg ARG           extra argument for our binaries (repeatable), e.g. --cpu-dequantize
  --label TEXT             name of the row block (default: the model directory's name)
  --out FILE               append the markdown block with provenance to FILE
  --server                 compare mlx-server with mlx_lm.server instead (1, 8, 32 streams)
  --streams N,N,...        concurrent streams for --server (default 1,8,32)";

/// Parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Opts {
    pub model: String,
    pub prompt_tokens: u32,
    pub generation_tokens: u32,
    pub batch_size: u32,
    pub trials: u32,
    pub prefill_step_size: Option<u32>,
    pub ttft_runs: u32,
    pub python: Option<PathBuf>,
    pub ours: Option<PathBuf>,
    pub ours_args: Vec<String>,
    pub label: Option<String>,
    pub out: Option<PathBuf>,
    pub server: bool,
    pub streams: Vec<u32>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            model: "default".into(),
            prompt_tokens: 512,
            generation_tokens: 128,
            batch_size: 1,
            trials: 3,
            prefill_step_size: None,
            ttft_runs: 3,
            python: None,
            ours: None,
            ours_args: Vec::new(),
            label: None,
            out: None,
            server: false,
            streams: vec![1, 8, 32],
        }
    }
}

fn positive(flag: &str, v: &str) -> Result<u32> {
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{flag} takes a positive integer, got `{v}`\n{USAGE}"),
    }
}

/// Parses the arguments after `bench`; `--flag value` and `--flag=value` both work.
pub(crate) fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts::default();
    let mut i = 0;
    while i < args.len() {
        let (flag, inline) = match args[i].split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (args[i].clone(), None),
        };
        i += 1;
        const SWITCHES: &[&str] = &["--server", "-h", "--help"];
        const VALUED: &[&str] = &[
            "--model",
            "-p",
            "--prompt-tokens",
            "-g",
            "--generation-tokens",
            "-b",
            "--batch-size",
            "-n",
            "--num-trials",
            "--prefill-step-size",
            "--ttft-runs",
            "--python",
            "--ours",
            "--ours-arg",
            "--label",
            "--out",
            "--streams",
        ];
        let value = if SWITCHES.contains(&flag.as_str()) {
            if inline.is_some() {
                bail!("{flag} takes no value\n{USAGE}");
            }
            String::new()
        } else if !VALUED.contains(&flag.as_str()) {
            bail!("unknown option `{flag}`\n{USAGE}");
        } else if let Some(v) = inline {
            v
        } else {
            let v = args
                .get(i)
                .ok_or_else(|| anyhow!("{flag} needs a value\n{USAGE}"))?;
            i += 1;
            v.clone()
        };
        match flag.as_str() {
            "--model" => o.model = value,
            "-p" | "--prompt-tokens" => o.prompt_tokens = positive(&flag, &value)?,
            "-g" | "--generation-tokens" => o.generation_tokens = positive(&flag, &value)?,
            "-b" | "--batch-size" => o.batch_size = positive(&flag, &value)?,
            "-n" | "--num-trials" => o.trials = positive(&flag, &value)?,
            "--prefill-step-size" => o.prefill_step_size = Some(positive(&flag, &value)?),
            "--ttft-runs" => {
                o.ttft_runs = value
                    .parse()
                    .map_err(|_| anyhow!("--ttft-runs takes an integer, got `{value}`"))?
            }
            "--python" => o.python = Some(PathBuf::from(value)),
            "--ours" => o.ours = Some(PathBuf::from(value)),
            "--ours-arg" => o.ours_args.push(value),
            "--label" => o.label = Some(value),
            "--out" => o.out = Some(PathBuf::from(value)),
            "--server" => o.server = true,
            "--streams" => {
                o.streams = value
                    .split(',')
                    .map(|s| positive("--streams", s.trim()))
                    .collect::<Result<_>>()?
            }
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown option `{other}`\n{USAGE}"),
        }
    }
    if o.model.is_empty() {
        bail!("--model needs a directory or `default`");
    }
    Ok(o)
}

/// One `Trial i:` line of either benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trial {
    pub prompt_tps: f64,
    pub generation_tps: f64,
    pub peak_memory: f64,
    pub total_time: f64,
}

/// The last `Trial i:  prompt_tps=..., generation_tps=..., peak_memory=..., total_time=...`
/// line of a benchmark's output.
pub(crate) fn parse_trial(output: &str) -> Result<Trial> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.starts_with("Trial ") && l.contains("prompt_tps="))
        .ok_or_else(|| anyhow!("no `Trial i: prompt_tps=...` line in the output"))?;
    let field = |key: &str| -> Result<f64> {
        let (_, rest) = line
            .split_once(&format!("{key}="))
            .ok_or_else(|| anyhow!("`{key}=` missing in `{line}`"))?;
        let num = rest.split(',').next().unwrap_or("").trim();
        num.parse()
            .map_err(|_| anyhow!("`{key}={num}` is not a number in `{line}`"))
    };
    Ok(Trial {
        prompt_tps: field("prompt_tps")?,
        generation_tps: field("generation_tps")?,
        peak_memory: field("peak_memory")?,
        total_time: field("total_time")?,
    })
}

/// A program with its arguments, printable as a shell command.
#[derive(Debug, Clone)]
pub(crate) struct Cmd(pub Vec<String>);

impl Cmd {
    fn new(program: impl AsRef<std::ffi::OsStr>) -> Self {
        Cmd(vec![program.as_ref().to_string_lossy().into_owned()])
    }
    fn arg(mut self, a: impl Into<String>) -> Self {
        self.0.push(a.into());
        self
    }
    fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, it: I) -> Self {
        self.0.extend(it.into_iter().map(Into::into));
        self
    }
    fn command(&self) -> Command {
        let mut c = Command::new(&self.0[0]);
        c.args(&self.0[1..]);
        c
    }
    /// Runs to completion, capturing both streams; fails with the output's tail.
    fn output(&self) -> Result<String> {
        let out = self
            .command()
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting `{self}`"))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            bail!("`{self}` failed ({}):\n{}", out.status, tail(&text, 30));
        }
        Ok(text)
    }
}

/// One benchmark process. A process that printed its trial and then died on the way out
/// (seen once: glibc's "corrupted double-linked list" at Python's exit) still counts,
/// with a warning; anything else that fails is an error.
fn run_trial(cmd: &Cmd) -> Result<Trial> {
    let out = cmd
        .command()
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{cmd}`"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    match parse_trial(&text) {
        Ok(t) if out.status.success() => Ok(t),
        Ok(t) => {
            eprintln!(
                "bench: warning: `{cmd}` printed its trial, then exited with {}; kept:\n{}",
                out.status,
                tail(&text, 3)
            );
            Ok(t)
        }
        Err(e) if out.status.success() => Err(e.context(format!("parsing the output of `{cmd}`"))),
        Err(_) => bail!("`{cmd}` failed ({}):\n{}", out.status, tail(&text, 30)),
    }
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let quoted: Vec<String> = self.0.iter().map(|a| shell_quote(a)).collect();
        f.write_str(&quoted.join(" "))
    }
}

pub(crate) fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `$CARGO_TARGET_DIR` (relative to the root) or `target`, then `release`.
fn release_dir(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|t| !t.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    root.join(target).join("release")
}

/// Our binaries: `(mlx-benchmark, mlx-generate)`, built when the default ones are missing.
pub(crate) fn our_bins(root: &Path, ours: Option<&Path>, also: &[&str]) -> Result<Vec<PathBuf>> {
    let dir = match ours {
        Some(p) if p.is_dir() => p.to_path_buf(),
        Some(p) if p.is_file() => p.parent().map(Path::to_path_buf).unwrap_or_default(),
        Some(p) => bail!("--ours {}: no such file or directory", p.display()),
        None => release_dir(root),
    };
    let mut names = vec![match ours {
        Some(p) if p.is_file() => p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        _ => "mlx-benchmark".to_string(),
    }];
    names.extend(also.iter().map(|s| s.to_string()));
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
        if ours.is_some() {
            bail!("--ours: {} is missing", missing.display());
        }
        eprintln!(
            "bench: {} missing; building: cargo build --release -p mlx-bins",
            missing.display()
        );
        crate::parity::run(
            Command::new("cargo")
                .args(["build", "--release", "-p", "mlx-bins"])
                .current_dir(root),
        )?;
        if let Some(still) = paths.iter().find(|p| !p.is_file()) {
            bail!("{} still missing after the build", still.display());
        }
    }
    Ok(paths)
}

/// The default model's directory, as mlx-hub places it.
fn default_model_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let cache = env("MLX_RS_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|x| x.join("mlx-rs")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/mlx-rs")))?;
    Some(cache.join("models/SmolLM2-135M-Instruct"))
}

/// `--model` as a directory both tools can load (the default one is made by ours).
fn resolve_model(model: &str, generate: &Path, ours_args: &[String]) -> Result<PathBuf> {
    if model != "default" {
        let p = PathBuf::from(model);
        if !p.join("config.json").is_file() {
            bail!("--model {model}: not a model directory (no config.json); give a directory or `default`");
        }
        return Ok(p);
    }
    let dir =
        default_model_dir().ok_or_else(|| anyhow!("no home directory for the default model"))?;
    if !dir.join("config.json").is_file() {
        eprintln!(
            "bench: preparing the default model with {}",
            generate.display()
        );
        Cmd::new(generate)
            .args(ours_args.iter().cloned())
            .args(["--prompt", "hi", "-m", "1"])
            .output()?;
    }
    if !dir.join("config.json").is_file() {
        bail!(
            "the default model is not in {} after a run of mlx-generate",
            dir.display()
        );
    }
    Ok(dir)
}

fn python(root: &Path, o: &Opts) -> Result<PathBuf> {
    match &o.python {
        Some(p) => Ok(p.clone()),
        None => crate::parity::python(root),
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn list(v: &[f64], digits: usize) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.digits$}")).collect();
    s.join(", ")
}

/// Runs the command (see the module docs).
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let o = parse(args)?;
    if o.server {
        return server::run(root, &o);
    }
    let py = python(root, &o)?;
    let bins = our_bins(root, o.ours.as_deref(), &["mlx-generate"])?;
    let (bench_bin, generate_bin) = (&bins[0], &bins[1]);
    let model = resolve_model(&o.model, generate_bin, &o.ours_args)?;
    let model_s = model.to_string_lossy().into_owned();
    let label = o.label.clone().unwrap_or_else(|| {
        model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| model_s.clone())
    });

    let mut shared = vec![
        "--model".to_string(),
        model_s.clone(),
        "-p".into(),
        o.prompt_tokens.to_string(),
        "-g".into(),
        o.generation_tokens.to_string(),
        "-b".into(),
        o.batch_size.to_string(),
        "-n".into(),
        "1".into(),
    ];
    if let Some(s) = o.prefill_step_size {
        shared.extend(["--prefill-step-size".to_string(), s.to_string()]);
    }
    let ours = Cmd::new(bench_bin)
        .args(shared.iter().cloned())
        .args(o.ours_args.iter().cloned());
    let theirs = Cmd::new(&py)
        .args(["-m", "mlx_lm", "benchmark"])
        .args(shared.iter().cloned());
    let gen_args = [
        "--model",
        &model_s,
        "--prompt",
        "hi",
        "-m",
        "1",
        "--verbose",
        "False",
    ];
    let ours_gen = Cmd::new(generate_bin)
        .args(gen_args)
        .args(o.ours_args.iter().cloned());
    let theirs_gen = Cmd::new(&py)
        .args(["-m", "mlx_lm", "generate"])
        .args(gen_args);

    eprintln!(
        "bench: {label}: p={} g={} b={} n={}",
        o.prompt_tokens, o.generation_tokens, o.batch_size, o.trials
    );
    eprintln!("  ours:   {ours}\n  mlx-lm: {theirs}");
    eprintln!("bench: untimed first run of each");
    run_trial(&ours)?;
    run_trial(&theirs)?;
    let (mut t_ours, mut t_theirs) = (Vec::new(), Vec::new());
    for round in 0..o.trials {
        let order: [(&Cmd, bool); 2] = if round % 2 == 0 {
            [(&ours, true), (&theirs, false)]
        } else {
            [(&theirs, false), (&ours, true)]
        };
        for (cmd, is_ours) in order {
            let t = run_trial(cmd)?;
            eprintln!(
                "  trial {} {:6}: prompt_tps={:.3} generation_tps={:.3} peak_memory={:.3} total_time={:.3}",
                round + 1,
                if is_ours { "ours" } else { "mlx-lm" },
                t.prompt_tps,
                t.generation_tps,
                t.peak_memory,
                t.total_time
            );
            if is_ours { &mut t_ours } else { &mut t_theirs }.push(t);
        }
    }
    let (mut s_ours, mut s_theirs) = (Vec::new(), Vec::new());
    for i in 0..o.ttft_runs {
        let pair = [(&ours_gen, true), (&theirs_gen, false)];
        let order = if i % 2 == 0 { pair } else { [pair[1], pair[0]] };
        for (cmd, is_ours) in order {
            let tic = Instant::now();
            cmd.output()?;
            let s = tic.elapsed().as_secs_f64();
            eprintln!(
                "  startup {} {:6}: {s:.3} s",
                i + 1,
                if is_ours { "ours" } else { "mlx-lm" }
            );
            if is_ours { &mut s_ours } else { &mut s_theirs }.push(s);
        }
    }

    let block = report(&Report {
        label: &label,
        o: &o,
        ours: &t_ours,
        theirs: &t_theirs,
        start_ours: &s_ours,
        start_theirs: &s_theirs,
        commands: [&ours, &theirs, &ours_gen, &theirs_gen],
        provenance: &format!(
            "{}- run: `{}`; ours built: {}\n",
            provenance(root, &py),
            Cmd::new("cargo")
                .args(["xtask", "bench"])
                .args(args.iter().cloned()),
            first_line(
                Cmd::new("date")
                    .arg("-u")
                    .arg("-r")
                    .arg(bench_bin.to_string_lossy())
                    .arg("+%Y-%m-%d %H:%M UTC")
            )
        ),
    });
    println!("{block}");
    if let Some(out) = &o.out {
        append(out, &block)?;
        eprintln!("bench: appended to {}", out.display());
    }
    Ok(())
}

pub(crate) fn append(out: &Path, block: &str) -> Result<()> {
    use std::io::Write;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .with_context(|| format!("opening {}", out.display()))?;
    writeln!(f, "{block}").with_context(|| format!("writing {}", out.display()))
}

struct Report<'a> {
    label: &'a str,
    o: &'a Opts,
    ours: &'a [Trial],
    theirs: &'a [Trial],
    start_ours: &'a [f64],
    start_theirs: &'a [f64],
    commands: [&'a Cmd; 4],
    provenance: &'a str,
}

/// Reads one number of a trial.
type Metric = fn(&Trial) -> f64;

/// Combines one number of a tool's trials into its figure.
type Combine = fn(&[f64]) -> f64;

fn report(r: &Report<'_>) -> String {
    let col = |ts: &[Trial], f: Metric| ts.iter().map(f).collect::<Vec<f64>>();
    let mut s = String::new();
    let o = r.o;
    let _ = writeln!(
        s,
        "### {} (p={}, g={}, b={}, {} trials each)\n",
        r.label, o.prompt_tokens, o.generation_tokens, o.batch_size, o.trials
    );
    let _ = writeln!(
        s,
        "| metric | ours | mlx-lm | ours/mlx-lm |\n| --- | ---: | ---: | ---: |"
    );
    // How a tool's trials combine into its number: the mean, except for peak_memory, which
    // is cumulative over a process (neither tool resets MLX's peak): its highest trial.
    let highest = |v: &[f64]| v.iter().cloned().fold(f64::NAN, f64::max);
    let rows: [(&str, Metric, usize, Combine); 4] = [
        ("prefill tok/s (prompt_tps)", |t| t.prompt_tps, 1, mean),
        (
            "decode tok/s (generation_tps)",
            |t| t.generation_tps,
            1,
            mean,
        ),
        ("peak memory GB", |t| t.peak_memory, 3, highest),
        ("trial wall time s", |t| t.total_time, 3, mean),
    ];
    for (name, f, d, combine) in rows {
        let (a, b) = (combine(&col(r.ours, f)), combine(&col(r.theirs, f)));
        let _ = writeln!(s, "| {name} | {a:.d$} | {b:.d$} | {} |", ratio(a, b));
    }
    if !r.start_ours.is_empty() {
        let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
        let (a, b) = (best(r.start_ours), best(r.start_theirs));
        let _ = writeln!(
            s,
            "| process start to first token s (best of {}) | {a:.3} | {b:.3} | {} |",
            r.start_ours.len(),
            ratio(a, b)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "- per trial, ours: prompt_tps [{}], generation_tps [{}]",
        list(&col(r.ours, |t| t.prompt_tps), 1),
        list(&col(r.ours, |t| t.generation_tps), 1)
    );
    let _ = writeln!(
        s,
        "- per trial, mlx-lm: prompt_tps [{}], generation_tps [{}]",
        list(&col(r.theirs, |t| t.prompt_tps), 1),
        list(&col(r.theirs, |t| t.generation_tps), 1)
    );
    if !r.start_ours.is_empty() {
        let _ = writeln!(
            s,
            "- startup runs (s): ours [{}], mlx-lm [{}]",
            list(r.start_ours, 3),
            list(r.start_theirs, 3)
        );
    }
    s.push_str(r.provenance);
    let [a, b, c, d] = r.commands;
    let _ = writeln!(s, "- ours: `{a}` (repeated, alternating with mlx-lm)");
    let _ = writeln!(s, "- mlx-lm: `{b}`");
    if !r.start_ours.is_empty() {
        let _ = writeln!(s, "- startup: `{c}` vs `{d}`");
    }
    s
}

fn first_line(cmd: Cmd) -> String {
    cmd.output()
        .map(|t| t.lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({})", e.to_string().lines().next().unwrap_or("")))
}

/// Date, commit, machine, cores, MLX and mlx-lm versions, as markdown list items.
pub(crate) fn provenance(root: &Path, py: &Path) -> String {
    let git = |args: &[&str]| {
        first_line(
            Cmd::new("git")
                .arg("-C")
                .arg(root.to_string_lossy())
                .args(args.iter().copied()),
        )
    };
    let dirty = Cmd::new("git")
        .arg("-C")
        .arg(root.to_string_lossy())
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .map(|t| !t.trim().is_empty())
        .unwrap_or(false);
    let versions = first_line(Cmd::new(py).args([
        "-c",
        "import mlx.core as mx, importlib.metadata as m; print(f'MLX {mx.__version__} ({mx.default_device()}), mlx-lm {m.version(\"mlx-lm\")}')",
    ]));
    format!(
        "- date: {}; commit: {}{}\n- machine: `{}`; nproc {}\n- {}\n",
        first_line(Cmd::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        git(&["rev-parse", "--short=12", "HEAD"]),
        if dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
        first_line(Cmd::new("uname").arg("-a")),
        first_line(Cmd::new("nproc")),
        versions
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parse_reads_short_long_and_inline_flags() {
        let o = parse(&args(
            "--model m -p 64 --generation-tokens=8 --num-trials 2 --ours-arg --cpu-dequantize --out r.md",
        ))
        .unwrap();
        assert_eq!(o.model, "m");
        assert_eq!((o.prompt_tokens, o.generation_tokens, o.trials), (64, 8, 2));
        assert_eq!(o.ours_args, vec!["--cpu-dequantize"]);
        assert_eq!(o.out, Some(PathBuf::from("r.md")));
        assert_eq!(o.batch_size, 1);
    }

    #[test]
    fn parse_rejects_bad_flags_with_the_flag_named() {
        let err = |s: &str| parse(&args(s)).unwrap_err().to_string();
        assert!(err("--frobnicate").contains("unknown option `--frobnicate`"));
        assert!(err("-p 0").contains("-p takes a positive integer, got `0`"));
        assert!(err("-g ten").contains("-g takes a positive integer, got `ten`"));
        assert!(err("--model").contains("--model needs a value"));
        assert!(err("--server=yes").contains("--server takes no value"));
        assert!(err("--streams 1,x").contains("got `x`"));
    }

    #[test]
    fn parse_trial_reads_both_tools_lines() {
        let out = "Running warmup..\nTiming with prompt_tokens=64, generation_tokens=8, batch_size=1.\n\
                   Trial 1:  prompt_tps=1234.500, generation_tps=56.250, peak_memory=0.125, total_time=0.750\n\
                   Averages: prompt_tps=1234.500, generation_tps=56.250, peak_memory=0.125\n";
        let t = parse_trial(out).unwrap();
        assert_eq!(
            t,
            Trial {
                prompt_tps: 1234.5,
                generation_tps: 56.25,
                peak_memory: 0.125,
                total_time: 0.75
            }
        );
        assert!(parse_trial("Averages: prompt_tps=1.0").is_err());
        let bad =
            parse_trial("Trial 1:  prompt_tps=x, generation_tps=1, peak_memory=1, total_time=1");
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("`prompt_tps=x` is not a number"));
    }

    #[test]
    fn commands_print_as_shell_lines() {
        let c = Cmd::new("/bin/mlx").args(["--prompt", "hi there", "it's"]);
        assert_eq!(c.to_string(), r"/bin/mlx --prompt 'hi there' 'it'\''s'");
    }

    #[test]
    fn report_has_ratios_and_provenance() {
        let t = |p, g| Trial {
            prompt_tps: p,
            generation_tps: g,
            peak_memory: 1.0,
            total_time: 2.0,
        };
        let o = Opts::default();
        let cmd = Cmd::new("x");
        let s = report(&Report {
            label: "m",
            o: &o,
            ours: &[t(200.0, 30.0), t(100.0, 30.0)],
            theirs: &[t(100.0, 20.0), t(50.0, 40.0)],
            start_ours: &[0.5, 0.4],
            start_theirs: &[1.0, 0.8],
            commands: [&cmd, &cmd, &cmd, &cmd],
            provenance: "- date: d\n",
        });
        assert!(
            s.contains("| prefill tok/s (prompt_tps) | 150.0 | 75.0 | 2.00x |"),
            "{s}"
        );
        assert!(
            s.contains("| decode tok/s (generation_tps) | 30.0 | 30.0 | 1.00x |"),
            "{s}"
        );
        assert!(
            s.contains("| process start to first token s (best of 2) | 0.400 | 0.800 | 0.50x |"),
            "{s}"
        );
        assert!(s.contains("- date: d\n"));
    }
}

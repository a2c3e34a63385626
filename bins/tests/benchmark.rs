//! `mlx-benchmark` prints what `mlx_lm.benchmark` prints, at batch size 1
//! (stream_generate) and above (the batch engine), and refuses bad sizes.
mod common;

use common::*;

fn bench(args: &[&str]) -> std::process::Output {
    run(env!("CARGO_BIN_EXE_mlx-benchmark"), args, b"")
}

/// The `k=v` numbers of a `Trial i:` or `Averages:` line.
fn numbers(line: &str) -> Vec<(String, f64)> {
    line.split_once(':')
        .expect("a colon")
        .1
        .split(',')
        .map(|kv| {
            let (k, v) = kv.trim().split_once('=').expect("k=v");
            (k.to_string(), v.parse::<f64>().expect("a number"))
        })
        .collect()
}

#[test]
fn output_has_mlx_lm_lines_at_every_batch_size() {
    let model = golden_model("llama-small-f32");
    let model = model.to_str().unwrap();
    for b in ["1", "3"] {
        let out = bench(&["--model", model, "-p", "8", "-g", "4", "-b", b, "-n", "2"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "-b {b}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 5, "{stdout}");
        assert_eq!(lines[0], "Running warmup..");
        assert_eq!(
            lines[1],
            format!("Timing with prompt_tokens=8, generation_tokens=4, batch_size={b}.")
        );
        for (i, line) in lines[2..4].iter().enumerate() {
            assert!(line.starts_with(&format!("Trial {}:  ", i + 1)), "{line}");
            let keys: Vec<String> = numbers(line).into_iter().map(|(k, _)| k).collect();
            assert_eq!(
                keys,
                ["prompt_tps", "generation_tps", "peak_memory", "total_time"],
                "{line}"
            );
            for (k, v) in numbers(line) {
                // The tiny model's peak memory prints as 0.000 GB.
                assert!(v > 0.0 || (k == "peak_memory" && v == 0.0), "{k} in {line}");
            }
        }
        assert!(lines[4].starts_with("Averages: "), "{}", lines[4]);
        let keys: Vec<String> = numbers(lines[4]).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["prompt_tps", "generation_tps", "peak_memory"]);
    }
}

#[test]
fn non_positive_sizes_are_refused() {
    let model = golden_model("llama-small-f32");
    let model = model.to_str().unwrap();
    for flag in ["-b", "-p", "-g", "-n", "--prefill-step-size"] {
        let out = bench(&["--model", model, flag, "0"]);
        assert_eq!(out.status.code(), Some(1), "{flag} 0");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("must be positive"), "{flag} 0: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

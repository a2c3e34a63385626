//! `mlx-gptq` against mlx-lm's `mlx_lm.gptq` command on the same tiny models: both read
//! mlx-lm's calibration file from `~/.cache/mlx-lm` (a temporary `HOME` holding a text of
//! several calibration sequences, shuffled by both after the model's initial-weight key
//! draws) and write the same tensors bit for bit and the same quantization section; the
//! output loads and generates. Bad flags are refused with a message.
mod common;

use common::{
    assert_same_quantized_model, assert_takes_mlx_lm_flags, calibration_home, check, run_with_home,
    TempDir,
};

#[test]
fn gptq_matches_mlx_lm_gptq_command() {
    let py = common::mlx_lm_python("mlx_lm.quant.gptq");
    let tmp = TempDir::new("gptq");
    let home = calibration_home(&tmp);
    let model = common::golden_model("llama-small-f32");
    let model = model.to_str().unwrap();
    for (name, flags) in [
        (
            "q4",
            vec!["--group-size", "32", "--fallback-group-size", "32"],
        ),
        (
            "q8-fb4",
            vec![
                "--bits",
                "8",
                "--group-size",
                "32",
                "--fallback-bits",
                "4",
                "--fallback-group-size",
                "32",
            ],
        ),
    ] {
        let (ours, theirs) = (
            tmp.0.join(format!("ours-{name}")),
            tmp.0.join(format!("mlx-lm-{name}")),
        );
        let mut args = vec!["--model", model, "--sequence-length", "32"];
        args.extend(&flags);
        let mut o = args.clone();
        o.extend(["--mlx-path", ours.to_str().unwrap()]);
        let out = run_with_home(env!("CARGO_BIN_EXE_mlx-gptq"), &home, &o);
        check(&out, "mlx-gptq");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("calibration_v5.txt")
                && !stdout.contains(" 1 sequences of 32")
                && stdout.contains(" sequences of 32"),
            "{stdout}"
        );
        let mut t = vec!["-m", "mlx_lm.quant.gptq"];
        t.extend(&args);
        t.extend(["--mlx-path", theirs.to_str().unwrap()]);
        check(
            &run_with_home(py.to_str().unwrap(), &home, &t),
            "mlx_lm.gptq",
        );
        assert_same_quantized_model(&theirs, &ours, name);
        assert!(stdout.contains("Quantized model with "), "{stdout}");
        // The quantized model loads and generates.
        let gen = common::generate(
            &[
                "--model",
                ours.to_str().unwrap(),
                "--prompt",
                "hello",
                "-m",
                "4",
            ],
            b"",
        );
        check(&gen, "mlx-generate on the GPTQ model");
    }
}

#[test]
fn gptq_refuses_bad_flags_with_a_message() {
    let tmp = TempDir::new("gptq-bad");
    let home = calibration_home(&tmp);
    let model = common::golden_model("llama-small-f32");
    let out_dir = tmp.0.join("out");
    for (flags, want) in [
        (vec!["--bits", "3", "--group-size", "32"], "not 3"),
        (
            vec!["--group-size", "64", "--sequence-length", "32"],
            "group size 64",
        ),
        (
            vec!["--group-size", "32", "--sequence-length", "4096"],
            "fewer than one sequence",
        ),
    ] {
        let mut args = vec![
            "--model",
            model.to_str().unwrap(),
            "--mlx-path",
            out_dir.to_str().unwrap(),
        ];
        args.extend(&flags);
        let out = run_with_home(env!("CARGO_BIN_EXE_mlx-gptq"), &home, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(want),
            "{flags:?}: {stderr}"
        );
        assert!(
            !out_dir.exists(),
            "{flags:?}: nothing is written on an error"
        );
    }
}

#[test]
fn gptq_takes_every_mlx_lm_gptq_flag() {
    let py = common::mlx_lm_python("mlx_lm.quant.gptq");
    assert_takes_mlx_lm_flags(
        &py,
        &["-m", "mlx_lm.quant.gptq"],
        env!("CARGO_BIN_EXE_mlx-gptq"),
        &["--data", "--hessian-float32", "--version"],
    );
}

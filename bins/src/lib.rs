//! Shared plumbing of the command-line front ends: logging, error reporting, mlx-lm
//! argument quirks, and loading a model with its tokenizer.
use std::process::ExitCode;

pub mod load;

/// Starts `tracing` logs on stderr; `MLX_LOG` (or `RUST_LOG`) sets the filter
/// (default: warnings only).
pub fn init_logging(level: Option<&str>) {
    let filter = level
        .map(str::to_string)
        .or_else(|| std::env::var("MLX_LOG").ok())
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs a command's body; an error is printed as one line on stderr with exit code 1.
pub fn run(body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// mlx-lm spells some short options with two letters (`-qa`); clap does not. Rewrite
/// them to their long forms before parsing.
pub fn normalized_args(aliases: &[(&str, &str)]) -> Vec<std::ffi::OsString> {
    std::env::args_os()
        .map(|a| {
            for (short, long) in aliases {
                if a == *short {
                    return std::ffi::OsString::from(*long);
                }
            }
            a
        })
        .collect()
}

/// mlx-lm's `str2bool`: anything but "false"/"f" (any case) is true.
pub fn str2bool(s: &str) -> Result<bool, String> {
    Ok(!matches!(s.to_ascii_lowercase().as_str(), "false" | "f"))
}

/// Fails with mlx-lm's flag name when a flag we do not support yet is used.
pub fn unsupported(flag: &str, given: bool) -> anyhow::Result<()> {
    if given {
        anyhow::bail!("{flag} is not yet supported by this implementation");
    }
    Ok(())
}

/// Reads a prompt: `-` means standard input (which must be UTF-8); `\n` and `\t`
/// escapes are expanded like mlx-lm does.
pub fn read_prompt(p: &str, expand_escapes: bool) -> anyhow::Result<String> {
    let p = if expand_escapes {
        p.replace("\\n", "\n").replace("\\t", "\t")
    } else {
        p.to_string()
    };
    if p == "-" {
        use std::io::Read;
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        return String::from_utf8(buf).map_err(|e| {
            anyhow::anyhow!(
                "standard input is not valid UTF-8 (at byte {})",
                e.utf8_error().valid_up_to()
            )
        });
    }
    Ok(p)
}

/// Python's `json.dumps` of a JSON object (`", "` and `": "` separators, non-ASCII
/// escaped), so files we write carry the same metadata text as mlx-lm's.
pub fn py_json_dumps(map: &serde_json::Map<String, serde_json::Value>) -> String {
    fn value(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    string(k, out);
                    out.push_str(": ");
                    value(v, out);
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    value(v, out);
                }
                out.push(']');
            }
            serde_json::Value::String(s) => string(s, out),
            other => out.push_str(&other.to_string()),
        }
    }
    fn string(s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{:04x}", u));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
    let mut out = String::new();
    value(&serde_json::Value::Object(map.clone()), &mut out);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn py_json_dumps_matches_python_spacing_and_escapes() {
        let v =
            serde_json::json!({"trust_remote_code": false, "eos_token": "<|im_end|>\u{00e9}\n"});
        let m = v.as_object().cloned().unwrap_or_default();
        assert_eq!(
            super::py_json_dumps(&m),
            r#"{"trust_remote_code": false, "eos_token": "<|im_end|>\u00e9\n"}"#
        );
    }
}

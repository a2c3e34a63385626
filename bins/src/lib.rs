//! Shared plumbing of the command-line front ends: logging, error reporting, mlx-lm
//! argument quirks, and loading a model with its tokenizer.
pub mod calibration;
pub mod constrain;
pub mod load;
pub mod speculative;

/// Starts `tracing` logs on stderr with the filter `MLX_LOG` where it is set (a
/// `tracing` filter such as `mlx_engine::batch::speculate=trace`, which reaches levels
/// and targets that the server's mlx-lm-style `--log-level` cannot), else `level` (the
/// command's flag), else `RUST_LOG`, else warnings only.
pub fn init_logging(level: Option<&str>) {
    let filter = std::env::var("MLX_LOG")
        .ok()
        .or_else(|| level.map(str::to_string))
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log redirected to a file stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// The exit status when standard output is closed early (`mlx-generate | head`): the
/// shell's status of a command killed by SIGPIPE (128 + 13), without the signal.
pub const BROKEN_PIPE_EXIT: u8 = 141;

/// Runs a command's body and ends the process ([`exit`]); an error is printed as one
/// line on stderr with exit code 1. Standard output closed by its reader (an
/// [`std::io::ErrorKind::BrokenPipe`] error anywhere in the chain) ends the command
/// quietly with [`BROKEN_PIPE_EXIT`].
pub fn run(body: impl FnOnce() -> anyhow::Result<()>) -> ! {
    let code = match body() {
        Ok(()) => 0,
        Err(e) => error_exit_code(&e, ""),
    };
    exit(code)
}

/// Prints `e` as one line on stderr (after `prefix`) and returns exit code 1, or
/// prints nothing and returns [`BROKEN_PIPE_EXIT`] for a closed standard output.
pub fn error_exit_code(e: &anyhow::Error, prefix: &str) -> u8 {
    use std::io::Write;
    if is_broken_pipe(e) {
        return BROKEN_PIPE_EXIT;
    }
    let msg = format!("{e:#}").replace('\n', " ");
    let _ = writeln!(std::io::stderr(), "{prefix}error: {msg}");
    1
}

/// Flushes standard output and error, then ends the process at once with `code`,
/// skipping C++ static destructors. libmlx's allocator destructor frees its buffer
/// cache while a stream thread may still be freeing a finished task, which now and
/// then corrupts the heap at exit ("corrupted double-linked list", SIGABRT, seen on
/// the CPU in about one run of forty). Call it once the command's values are dropped:
/// nothing else is flushed or closed.
pub fn exit(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    {
        extern "C" {
            fn _exit(status: std::os::raw::c_int) -> !;
        }
        // SAFETY: `_exit` (POSIX, async-signal-safe) only ends the process; the
        // caller dropped its values and the standard streams were flushed above.
        unsafe { _exit(std::os::raw::c_int::from(code)) }
    }
    #[cfg(not(unix))]
    std::process::exit(i32::from(code))
}

/// Whether `e` comes from writing to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes to standard output (through its lock); unlike `print!`, a failed write (a
/// closed pipe) is an error to return, not a panic. Used by [`out!`] and [`outln!`].
pub fn write_stdout(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    use std::io::Write;
    std::io::stdout().lock().write_fmt(args)
}

/// `print!` that returns `std::io::Result<()>` instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` that returns `std::io::Result<()>` instead of panicking.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
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

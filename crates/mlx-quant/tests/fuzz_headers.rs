//! A seeded, time-bounded mutation fuzzer over the input parsers conversion relies on:
//! mlx-models' `check_safetensors` (then MLX's own loader on what it accepts) and
//! mlx-gguf's `GgufHeader::read` (then this workspace's GGUF tensor decoder). Every
//! mutated file must give `Ok` or an error, never a panic or a crash.
//!
//! Runs for `MLX_QUANT_FUZZ_SECS` seconds per target (default 5) from seed
//! `MLX_QUANT_FUZZ_SEED` (default 0x5eed). The cargo-fuzz targets in `fuzz/` drive the same
//! entry points under libFuzzer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

/// xorshift64*: small, seeded, good enough for choosing mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| {
            v.strip_prefix("0x")
                .map(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or_else(|| v.parse().ok())
        })
        .unwrap_or(default)
}

/// One mutation of `seed`, biased towards the first `hot` bytes (the header).
fn mutate(rng: &mut Rng, seed: &[u8], hot: usize) -> Vec<u8> {
    let mut b = seed.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        if b.is_empty() {
            b.push(0);
        }
        let span = if rng.below(4) == 0 {
            b.len()
        } else {
            hot.min(b.len())
        };
        let i = rng.below(span);
        match rng.below(9) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b[i] = [0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'9'][rng.below(8)],
            2 => b.truncate(rng.below(b.len() + 1)),
            3 => {
                // An 8-byte little-endian length or count: huge, zero, or off by a little.
                let v: u64 = match rng.below(4) {
                    0 => rng.next(),
                    1 => 0,
                    2 => u64::MAX,
                    _ => (b.len() as u64)
                        .wrapping_add(rng.below(64) as u64)
                        .wrapping_sub(32),
                };
                let end = (i + 8).min(b.len());
                let n = end - i;
                b[i..end].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            4 => {
                let n = 1 + rng.below(16);
                let chunk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(i..i, chunk);
            }
            5 => {
                let n = rng.below(16).min(b.len() - i);
                b.drain(i..i + n);
            }
            6 => {
                // Copy a run of the file over another place (duplicated structure).
                let j = rng.below(b.len());
                let n = rng.below(32).min(b.len() - i).min(b.len() - j);
                let run = b[j..j + n].to_vec();
                b[i..i + n].copy_from_slice(&run);
            }
            7 => b[i] = b[i].wrapping_add(1 + rng.below(3) as u8),
            _ => {
                // A run of digits (large numbers in JSON headers), maybe negative.
                let n = 1 + rng.below(24);
                let mut run: Vec<u8> = (0..n).map(|_| b'0' + rng.below(10) as u8).collect();
                if rng.below(4) == 0 {
                    run.insert(0, b'-');
                }
                b.splice(i..i, run);
            }
        }
    }
    b
}

struct Outcome {
    iterations: u64,
    accepted: u64,
    distinct_errors: std::collections::BTreeSet<String>,
    /// Panic location -> (message, first input that hit it).
    panics: std::collections::BTreeMap<String, (String, std::path::PathBuf)>,
}

static PANIC_AT: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

fn payload_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

fn capture_panic_locations() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut slot) = PANIC_AT.lock() {
            *slot = Some(format!("{at}: {}", payload_text(info.payload())));
        }
    }));
}

/// Runs `target` on mutations of `seed` for the time budget; panics are failures.
fn fuzz(name: &str, seed: &[u8], hot: usize, target: &dyn Fn(&Path) -> Result<(), String>) {
    let secs = env_u64("MLX_QUANT_FUZZ_SECS", 5);
    let mut rng = Rng(env_u64("MLX_QUANT_FUZZ_SEED", 0x5eed) | 1);
    let dir = common::temp_dir(&format!("fuzz-{name}"));
    let file = dir.join("input");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut out = Outcome {
        iterations: 0,
        accepted: 0,
        distinct_errors: Default::default(),
        panics: Default::default(),
    };
    capture_panic_locations();
    // The unmutated seed must parse.
    std::fs::write(&file, seed).unwrap();
    target(&file).unwrap_or_else(|e| panic!("{name}: the seed does not parse: {e}"));
    while Instant::now() < deadline {
        let input = mutate(&mut rng, seed, hot);
        std::fs::write(&file, &input).unwrap();
        match catch_unwind(AssertUnwindSafe(|| target(&file))) {
            Ok(Ok(())) => out.accepted += 1,
            Ok(Err(e)) => {
                // Errors are grouped by their wording without the path, numbers, names
                // and byte lists.
                let e = e.replace(&file.display().to_string(), "FILE");
                let mut shape = String::new();
                let mut skip = None;
                for c in e.chars() {
                    match (skip, c) {
                        (None, '`' | '[') => skip = Some(if c == '`' { '`' } else { ']' }),
                        (Some(end), c) if c == end => skip = None,
                        (Some(_), _) => {}
                        (None, c) if c.is_ascii_digit() => {}
                        (None, c) => shape.push(c),
                    }
                }
                out.distinct_errors.insert(shape.chars().take(90).collect());
            }
            Err(_) => {
                let what = PANIC_AT
                    .lock()
                    .ok()
                    .and_then(|mut s| s.take())
                    .unwrap_or_default();
                let (at, msg) = what.split_once(": ").unwrap_or((&what, ""));
                if !out.panics.contains_key(at) {
                    let keep = std::env::temp_dir()
                        .join(format!("mlxq-fuzz-{name}-crash-{}", out.panics.len()));
                    std::fs::write(&keep, &input).unwrap();
                    out.panics.insert(at.to_string(), (msg.to_string(), keep));
                }
            }
        }
        out.iterations += 1;
    }
    eprintln!(
        "fuzz {name}: {} inputs in {secs}s, {} accepted, {} distinct error kinds",
        out.iterations,
        out.accepted,
        out.distinct_errors.len()
    );
    for e in &out.distinct_errors {
        eprintln!("  {e}");
    }
    let _ = std::panic::take_hook();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.iterations > 0);
    let report: Vec<String> = out
        .panics
        .iter()
        .map(|(at, (msg, input))| format!("{at}: {msg} (input kept in {})", input.display()))
        .collect();
    assert!(
        report.is_empty(),
        "{name}: panics found:\n{}",
        report.join("\n")
    );
}

fn safetensors_target(path: &Path) -> Result<(), String> {
    mlx_models::loader::check_safetensors(path).map_err(|e| e.to_string())?;
    // What the check accepts, MLX's loader must read without failing.
    let (arrays, _) = mlx_array::io::load_safetensors(path).map_err(|e| e.to_string())?;
    for a in arrays.values() {
        a.eval().map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[test]
fn safetensors_header_check_never_panics_on_mutated_files() {
    let src = common::root().join("goldens/models/llama-small-f32-tied/model.safetensors");
    let seed = std::fs::read(src).unwrap();
    let hot = 8 + u64::from_le_bytes(seed[..8].try_into().unwrap()) as usize;
    fuzz("safetensors", &seed, hot, &safetensors_target);
}

/// A small valid GGUF v3: metadata of every kind and three tensors (F32, F16, Q8_0).
fn gguf_seed() -> Vec<u8> {
    fn s(b: &mut Vec<u8>, v: &str) {
        b.extend((v.len() as u64).to_le_bytes());
        b.extend(v.as_bytes());
    }
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(3u64.to_le_bytes()); // tensors
    b.extend(6u64.to_le_bytes()); // metadata
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "llama");
    s(&mut b, "llama.context_length");
    b.extend(4u32.to_le_bytes());
    b.extend(256u32.to_le_bytes());
    s(&mut b, "llama.rope.freq_base");
    b.extend(6u32.to_le_bytes());
    b.extend(10000f32.to_le_bytes());
    s(&mut b, "tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    for t in ["<s>", "</s>", "a"] {
        s(&mut b, t);
    }
    s(&mut b, "tokenizer.ggml.scores");
    b.extend(9u32.to_le_bytes());
    b.extend(6u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    for v in [0f32, -1.0, -2.0] {
        b.extend(v.to_le_bytes());
    }
    s(&mut b, "general.alignment");
    b.extend(4u32.to_le_bytes());
    b.extend(32u32.to_le_bytes());
    // Tensor infos: name, n_dims, dims, type, offset.
    let tensors: [(&str, &[u64], u32, u64); 3] = [
        ("token_embd.weight", &[32, 3], 0, 0),
        ("output_norm.weight", &[32], 1, 384),
        ("blk.0.attn_q.weight", &[32, 2], 8, 448),
    ];
    for (name, dims, ty, off) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(off.to_le_bytes());
    }
    let pad = (32 - b.len() % 32) % 32;
    b.resize(b.len() + pad, 0);
    let mut data = Vec::new();
    for i in 0..96 {
        data.extend((i as f32 * 0.01).to_le_bytes());
    }
    for i in 0..32u16 {
        data.extend(half_one_plus(i).to_le_bytes());
    }
    // Two Q8_0 blocks: f16 scale + 32 int8 values each.
    for blk in 0..2u8 {
        data.extend(0x2c00u16.to_le_bytes()); // 0.0625
        data.extend((0..32u8).map(|j| j.wrapping_mul(3).wrapping_sub(blk * 7)));
    }
    b.extend(data);
    b
}

/// float16 bit patterns near 1.0.
fn half_one_plus(i: u16) -> u16 {
    0x3c00 + i
}

fn gguf_target(path: &Path) -> Result<(), String> {
    let header = mlx_gguf::GgufHeader::read(path).map_err(|e| e.to_string())?;
    // What the header check accepts, the decoder must read without failing.
    mlx_gguf::native::load_tensors(&header).map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn gguf_header_reader_never_panics_on_mutated_files() {
    let seed = gguf_seed();
    let hot = seed.len() - 96 * 4 - 64 - 68;
    fuzz("gguf", &seed, hot, &gguf_target);
}

//! What the 4-bit product checks of these examples share (`qmm_rows_check`,
//! `qmm_mma_check`, `fused_check`): random and model weights, the product, bit
//! comparison and timing. Included with `#[path]`; not an example itself.
#![allow(dead_code)] // each example uses part of it

use mlx_array::quant::{quantize, quantized_matmul, QuantMode, Quantized};
use mlx_array::{random, transforms, Array, Dtype};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// (N, K) of the projections and vocabulary heads of Llama-3.1-8B, Llama-3.2-1B and
/// Qwen2.5-0.5B.
pub const SYNTHETIC: [(i32, i32); 12] = [
    (4096, 4096),
    (1024, 4096),
    (14336, 4096),
    (4096, 14336),
    (128256, 4096),
    (2048, 2048),
    (8192, 2048),
    (2048, 8192),
    (896, 896),
    (4864, 896),
    (896, 4864),
    (151936, 896),
];

/// Products per timed evaluation (so the host's wait for the device is shared).
pub const REPS: usize = 10;

/// One product shape to check: a name, the quantized weight and its group size.
pub struct Case {
    pub name: String,
    pub n: i32,
    pub k: i32,
    pub gs: i32,
    pub q: Quantized,
    /// Whether the CUDA kernel takes this product (every synthetic one does).
    pub ours: bool,
}

/// The options of both multi-row checks: `--shapes`, `--model`, `--m`, `--gs`, `--iters`.
pub struct ShapeOpts {
    pub shapes: String,
    pub model: Option<String>,
    pub ms: Vec<i32>,
    pub gss: Vec<i32>,
    pub iters: usize,
}

impl ShapeOpts {
    /// Defaults: synthetic shapes, the three group sizes, rows `ms`, `iters` timings.
    pub fn new(ms: Vec<i32>, iters: usize) -> ShapeOpts {
        ShapeOpts {
            shapes: "synthetic".into(),
            model: None,
            ms,
            gss: vec![32, 64, 128],
            iters,
        }
    }

    /// Reads the command line: the shared flags here, the example's own through `extra`
    /// (given the flag and a way to take its value; `false` for a flag it does not know),
    /// `usage` for `-h`.
    pub fn parse(
        &mut self,
        usage: &str,
        mut extra: impl FnMut(&str, &mut dyn FnMut() -> Res<String>) -> Res<bool>,
    ) -> Res<()> {
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut val =
                || -> Res<String> { Ok(args.next().ok_or_else(|| format!("{a} needs a value"))?) };
            match a.as_str() {
                "--shapes" => self.shapes = val()?,
                "--model" => self.model = Some(val()?),
                "--m" => self.ms = list(&val()?)?,
                "--gs" => self.gss = list(&val()?)?,
                "--iters" => self.iters = val()?.parse()?,
                "-h" | "--help" => {
                    println!("{usage}");
                    std::process::exit(0);
                }
                _ => {
                    if !extra(&a, &mut val)? {
                        return Err(format!("unknown argument {a:?} (see --help)").into());
                    }
                }
            }
        }
        Ok(())
    }
}

pub fn list(s: &str) -> Res<Vec<i32>> {
    s.split(',')
        .map(|v| {
            v.trim()
                .parse::<i32>()
                .map_err(|e| format!("bad number {v:?}: {e}").into())
        })
        .collect()
}

/// Standard normal values from `seed`, times `scale`, in bfloat16.
pub fn scaled_normal(shape: &[i32], seed: u64, scale: f32) -> Res<Array> {
    Ok(
        random::normal(shape, Dtype::Float32, None, None, Some(&random::key(seed)?))?
            .multiply(&Array::scalar(scale)?)?
            .astype(Dtype::Bfloat16)?,
    )
}

/// `x @ dequantize(q).T` (4-bit affine, group size `gs`), not evaluated.
pub fn qmm(x: &Array, q: &Quantized, gs: i32) -> Res<Array> {
    Ok(quantized_matmul(
        x,
        &q.weight,
        &q.scales,
        q.biases.as_ref(),
        true,
        Some(gs),
        Some(4),
        QuantMode::Affine,
    )?)
}

/// Whether `a` and `b` hold the same bits (bfloat16 values compared as uint16).
pub fn same_bits(a: &Array, b: &Array) -> Res<bool> {
    if a.shape() != b.shape() {
        return Ok(false);
    }
    Ok(a.view(Dtype::Uint16)?
        .array_equal(&b.view(Dtype::Uint16)?, false)?
        .item::<bool>()?)
}

/// Median microseconds of one product made by `f` (`iters` samples of REPS products
/// evaluated together, after three such warm-up rounds).
pub fn time_us(iters: usize, f: &dyn Fn() -> Res<Array>) -> Res<f64> {
    let round = || -> Res<f64> {
        let tic = Instant::now();
        let ys = (0..REPS).map(|_| f()).collect::<Res<Vec<_>>>()?;
        transforms::eval(&ys.iter().collect::<Vec<_>>())?;
        mlx_array::synchronize()?;
        Ok(tic.elapsed().as_secs_f64() * 1e6 / REPS as f64)
    };
    for _ in 0..3 {
        round()?;
    }
    let mut ts = (0..iters).map(|_| round()).collect::<Res<Vec<_>>>()?;
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
}

/// Whether fast_qmv.cpp's kernels take a bfloat16 x by this 4-bit weight (`eligible_rows`
/// there): K a multiple of 32 up to 16384, bfloat16 scales, and not a row no longer than a
/// group with more than 16384 outputs (which MLX itself sends to `qmm` at one row).
pub fn kernel_takes(n: i32, k: i32, gs: i32, scales: Dtype) -> bool {
    scales == Dtype::Bfloat16
        && k % 32 == 0
        && k <= 16384
        && [32, 64, 128].contains(&gs)
        && !(k % 64 == 0 && gs >= k && n > 16384)
}

/// Synthetic cases: random weights (scaled like trained ones) of each shape and group size.
pub fn synthetic(shapes: &[(i32, i32)], gss: &[i32]) -> Res<Vec<Case>> {
    let mut cases = Vec::new();
    for (i, &(n, k)) in shapes.iter().enumerate() {
        let w = scaled_normal(&[n, k], 100 + i as u64, 0.05)?;
        for &gs in gss {
            if k % gs != 0 {
                continue;
            }
            let q = quantize(&w, Some(gs), Some(4), QuantMode::Affine)?;
            transforms::eval(&[&q.weight, &q.scales])?;
            cases.push(Case {
                name: "random".into(),
                n,
                k,
                gs,
                q,
                ours: kernel_takes(n, k, gs, Dtype::Bfloat16),
            });
        }
    }
    Ok(cases)
}

/// Every distinct (N, K) of the 4-bit affine weights of a quantized model directory
/// (`*.weight` uint32 with `.scales` and `.biases`, group size from config.json's
/// `quantization`), the first weight of each shape.
pub fn model_cases(dir: &str) -> Res<Vec<Case>> {
    let dir = Path::new(dir);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let quant = config
        .get("quantization")
        .or_else(|| config.get("quantization_config"))
        .ok_or("config.json has no \"quantization\": not a quantized model")?;
    let gs = quant
        .get("group_size")
        .and_then(|v| v.as_i64())
        .unwrap_or(64) as i32;
    let bits = quant.get("bits").and_then(|v| v.as_i64()).unwrap_or(4);
    if bits != 4 {
        return Err(format!("the model is {bits}-bit; this check is for 4-bit weights").into());
    }
    let mut tensors = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no .safetensors files in {}", dir.display()).into());
    }
    for f in files {
        tensors.extend(mlx_array::io::load_safetensors(&f)?.0);
    }
    let mut seen = BTreeMap::new();
    for (name, w) in &tensors {
        let Some(base) = name.strip_suffix(".weight") else {
            continue;
        };
        let (Some(s), Some(b)) = (
            tensors.get(&format!("{base}.scales")),
            tensors.get(&format!("{base}.biases")),
        ) else {
            continue;
        };
        if w.dtype() != Dtype::Uint32 || w.ndim() != 2 || s.ndim() != 2 {
            continue;
        }
        let (n, k) = (w.dim(0)?, w.dim(1)? * 8);
        if s.dim(1)? * gs != k {
            println!("{name}: scales do not match group size {gs} (skipped)");
            continue;
        }
        seen.entry((n, k)).or_insert_with(|| Case {
            name: base.to_string(),
            n,
            k,
            gs,
            ours: kernel_takes(n, k, gs, s.dtype()),
            q: Quantized {
                weight: w.clone(),
                scales: s.clone(),
                biases: Some(b.clone()),
            },
        });
    }
    if seen.is_empty() {
        return Err("no 4-bit affine weights (.weight/.scales/.biases) found".into());
    }
    Ok(seen.into_values().collect())
}

/// The cases of `--model DIR` (its own weights) or of `--shapes`: `synthetic` (every
/// shape of [`SYNTHETIC`] at the group sizes `gss`) or `small` (the three smallest).
pub fn cases(model: Option<&str>, shapes: &str, gss: &[i32]) -> Res<Vec<Case>> {
    if let Some(dir) = model {
        return model_cases(dir);
    }
    match shapes {
        "synthetic" => synthetic(&SYNTHETIC, gss),
        "small" => synthetic(&SYNTHETIC[8..11], gss),
        s => Err(format!("--shapes {s:?}: expected synthetic or small").into()),
    }
}

/// A non-contiguous array with `x`'s shape and values (`[M, 1, K]`): the transpose of a
/// `[K, 1, M]` copy (values copied exactly through float32).
pub fn transposed_view(x: &Array) -> Res<Array> {
    Ok(x.transpose(Some(&[2, 1, 0]))?
        .astype(Dtype::Float32)?
        .astype(Dtype::Bfloat16)?
        .transpose(Some(&[2, 1, 0]))?)
}

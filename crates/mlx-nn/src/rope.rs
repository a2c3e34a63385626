//! Rotary position embeddings: mlx.nn `RoPE` and the scaled variants of
//! `mlx_lm/models/rope_utils.py`, with the same frequency computations (float32 MLX
//! ops for arrays, f64 host arithmetic where Python uses floats).
use crate::error::{Error, Result as NnResult};
use mlx_array::fast::{self, RopeOffset};
use mlx_array::{ops, Array, Dtype, Result};
use std::f64::consts::PI;

/// The `rope_scaling` section of a config (HF names), as far as RoPE needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RopeScaling {
    /// `type` or `rope_type` (`default`, `linear`, `dynamic`, `llama3`, `yarn`,
    /// `deepseek_yarn`, `longrope`, `su`, `proportional`, `mrope`).
    pub rope_type: String,
    /// `factor`.
    pub factor: Option<f64>,
    /// `low_freq_factor` (llama3).
    pub low_freq_factor: Option<f64>,
    /// `high_freq_factor` (llama3).
    pub high_freq_factor: Option<f64>,
    /// `original_max_position_embeddings`.
    pub original_max_position_embeddings: Option<f64>,
    /// `beta_fast` (yarn).
    pub beta_fast: Option<f64>,
    /// `beta_slow` (yarn).
    pub beta_slow: Option<f64>,
    /// `mscale` (yarn).
    pub mscale: Option<f64>,
    /// `mscale_all_dim` (yarn).
    pub mscale_all_dim: Option<f64>,
    /// `short_factor` (longrope).
    pub short_factor: Option<Vec<f64>>,
    /// `long_factor` (longrope).
    pub long_factor: Option<Vec<f64>>,
    /// `partial_rotary_factor` (proportional).
    pub partial_rotary_factor: Option<f64>,
}

impl RopeScaling {
    fn need(&self, v: Option<f64>, key: &str) -> NnResult<f64> {
        v.ok_or_else(|| {
            Error::RopeConfig(format!(
                "`{key}` is required for rope type `{}`",
                self.rope_type
            ))
        })
    }
}

/// A rotary embedding layer.
#[derive(Debug, Clone)]
pub enum Rope {
    /// mlx.nn `RoPE(dims, traditional, base, scale)` (also `linear` scaling).
    Default {
        /// Rotated feature count.
        dims: i32,
        /// Rotate adjacent pairs instead of halves.
        traditional: bool,
        /// Frequency base.
        base: f32,
        /// Position scale.
        scale: f32,
    },
    /// `DynamicNTKScalingRoPE`: the base grows with the sequence length.
    Dynamic {
        /// Rotated feature count.
        dims: i32,
        /// `max_position_embeddings`.
        max_position_embeddings: i32,
        /// Rotate adjacent pairs.
        traditional: bool,
        /// Frequency base.
        base: f64,
        /// `factor`.
        factor: f64,
    },
    /// RoPE with precomputed frequencies (`Llama3RoPE`, `YarnRoPE`, `SuScaledRoPE`,
    /// `ProportionalRoPE`); `input_scale`, when present, multiplies `x[..., :dims]` first.
    Freqs {
        /// Rotated feature count.
        dims: i32,
        /// Rotate adjacent pairs.
        traditional: bool,
        /// float32 `[dims / 2]` frequencies.
        freqs: Array,
        /// Scale applied to the rotated features before the rotation.
        input_scale: Option<f64>,
    },
    /// No rotation: the input as it is (mlx-lm's `NoPE`, for SmolLM3's layers without
    /// positional encoding).
    Identity,
}

fn exponents(dims: i32, step_dtype: Dtype) -> Result<Array> {
    // `mx.arange(0, dims, 2[, dtype]) / dims`
    ops::arange(0.0, dims as f64, 2.0, step_dtype)?.divide(dims)
}

/// Evaluates precomputed frequencies now. An unevaluated array belongs to the stream of
/// the thread that made it, and MLX's GPU backends cannot evaluate it on another thread
/// ("There is no Stream(gpu, 0) in current thread"): a model loaded on one thread and
/// run on another (the server's engine thread) would fail at its first forward pass.
/// The values are those the first forward pass would compute.
fn materialized(rope: Rope) -> NnResult<Rope> {
    if let Rope::Freqs { freqs, .. } = &rope {
        mlx_array::transforms::eval(&[freqs])?;
    }
    Ok(rope)
}

fn f32_scalar(v: f64) -> Result<Array> {
    Array::scalar_f64(v, Dtype::Float32)
}

impl Rope {
    /// mlx.nn `RoPE`.
    pub fn new(dims: i32, traditional: bool, base: f64, scale: f64) -> Rope {
        Rope::Default {
            dims,
            traditional,
            base: base as f32,
            scale: scale as f32,
        }
    }

    /// `Llama3RoPE`.
    pub fn llama3(dims: i32, traditional: bool, base: f64, cfg: &RopeScaling) -> NnResult<Rope> {
        let factor = cfg.need(cfg.factor, "factor")?;
        let low_freq_factor = cfg.low_freq_factor.unwrap_or(1.0);
        let high_freq_factor = cfg.high_freq_factor.unwrap_or(4.0);
        let old_context_len = cfg.original_max_position_embeddings.unwrap_or(8192.0);
        let low_freq_wavelen = old_context_len / low_freq_factor;
        let high_freq_wavelen = old_context_len / high_freq_factor;

        let freqs = f32_scalar(base)?.power(&exponents(dims, Dtype::Int32)?)?;
        let wavelens = freqs.multiply(2.0 * PI)?;
        let freqs = ops::where_(
            &wavelens.greater(low_freq_wavelen)?,
            &freqs.multiply(factor)?,
            &freqs,
        )?;
        let is_medium = wavelens
            .greater(high_freq_wavelen)?
            .logical_and(&wavelens.less(low_freq_wavelen)?)?;
        let smooth = f32_scalar(old_context_len)?
            .divide(&wavelens)?
            .subtract(low_freq_factor)?
            .divide(high_freq_factor - low_freq_factor)?;
        let denom = f32_scalar(1.0)?
            .subtract(&smooth)?
            .divide(factor)?
            .add(&smooth)?;
        let smooth_freqs = freqs.divide(&denom)?;
        let freqs = ops::where_(&is_medium, &smooth_freqs, &freqs)?;
        materialized(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: None,
        })
    }

    /// `YarnRoPE`.
    pub fn yarn(dims: i32, traditional: bool, base: f64, cfg: &RopeScaling) -> NnResult<Rope> {
        let scaling_factor = cfg.need(cfg.factor, "factor")?;
        let original = cfg.original_max_position_embeddings.unwrap_or(4096.0);
        let beta_fast = cfg.beta_fast.unwrap_or(32.0);
        let beta_slow = cfg.beta_slow.unwrap_or(1.0);
        let mscale = cfg.mscale.unwrap_or(1.0);
        let mscale_all_dim = cfg.mscale_all_dim.unwrap_or(0.0);

        let correction_dim = |num_rotations: f64| {
            (dims as f64 * (original / (num_rotations * 2.0 * PI)).ln()) / (2.0 * base.ln())
        };
        let low = (correction_dim(beta_fast).floor() as i64).max(0);
        let high = (correction_dim(beta_slow).ceil() as i64).min(dims as i64 - 1);
        let get_mscale = |scale: f64, m: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        let input_scale =
            get_mscale(scaling_factor, mscale) / get_mscale(scaling_factor, mscale_all_dim);

        // yarn_linear_ramp_mask(low, high, dims // 2)
        let (min_val, max_val) = (
            low as f64,
            if low == high {
                high as f64 + 0.001
            } else {
                high as f64
            },
        );
        let ramp = ops::arange(0.0, (dims / 2) as f64, 1.0, Dtype::Float32)?;
        let ramp = if low == high {
            ramp.subtract(min_val)?.divide(max_val - min_val)?
        } else {
            ramp.subtract(low)?.divide(high - low)?
        };
        let ramp = ramp.clip(Some(&f32_scalar(0.0)?), Some(&f32_scalar(1.0)?))?;
        let freq_mask = f32_scalar(1.0)?.subtract(&ramp)?;

        let freq_extra = f32_scalar(base)?.power(&exponents(dims, Dtype::Float32)?)?;
        let freq_inter = freq_extra.multiply(scaling_factor)?;
        let num = freq_inter.multiply(&freq_extra)?;
        let den = freq_inter
            .multiply(&freq_mask)?
            .add(&freq_extra.multiply(&f32_scalar(1.0)?.subtract(&freq_mask)?)?)?;
        let freqs = num.divide(&den)?;
        let input_scale = if input_scale != 1.0 {
            Some(input_scale)
        } else {
            None
        };
        materialized(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale,
        })
    }

    /// `SuScaledRoPE` (`longrope` / `su`): always non-traditional, always scales the input.
    pub fn su_scaled(
        dims: i32,
        base: f64,
        max_position_embeddings: f64,
        original_max_position_embeddings: f64,
        long_factor: &[f64],
    ) -> NnResult<Rope> {
        let freqs = f32_scalar(base)?.power(&exponents(dims, Dtype::Float32)?)?;
        let long: Vec<f32> = long_factor.iter().map(|&v| v as f32).collect();
        let long = if long.len() == 1 {
            Array::scalar(long[0])?
        } else {
            Array::from_vec(long)?
        };
        let freqs = long.multiply(&freqs)?;
        let factor = max_position_embeddings / original_max_position_embeddings;
        let scale = if factor <= 1.0 {
            1.0
        } else {
            (1.0 + factor.ln() / original_max_position_embeddings.ln()).sqrt()
        };
        materialized(Rope::Freqs {
            dims,
            traditional: false,
            freqs,
            input_scale: Some(scale),
        })
    }

    /// `ProportionalRoPE`: only the first `rotated_dims` features get finite frequencies.
    pub fn proportional(
        dims: i32,
        rotated_dims: i32,
        traditional: bool,
        base: f64,
        factor: f64,
    ) -> NnResult<Rope> {
        if rotated_dims > dims {
            return Err(Error::RopeConfig(
                "rotated_dims should be smaller than dims".into(),
            ));
        }
        let exps = ops::arange(0.0, rotated_dims as f64, 2.0, Dtype::Float32)?.divide(dims)?;
        let finite = f32_scalar(base)?.power(&exps)?.multiply(factor)?;
        let inf = ops::full(
            &[(dims - rotated_dims) / 2],
            &f32_scalar(f64::INFINITY)?,
            Dtype::Float32,
        )?;
        let freqs = ops::concatenate(&[&finite, &inf], 0)?;
        materialized(Rope::Freqs {
            dims,
            traditional,
            freqs,
            input_scale: None,
        })
    }

    /// Rotates `x` (`[B, heads, L, head_dim]`) for positions `offset..offset + L`.
    #[track_caller]
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        self.forward_at(x, RopeOffset::Int(offset))
    }

    /// [`Rope::forward`] at an offset that may be an array (one per batch row, as
    /// mlx-lm passes a batch cache's `offset`). The dynamic-NTK variant needs a host
    /// offset (its base depends on it), as in mlx-lm.
    #[track_caller]
    pub fn forward_at(&self, x: &Array, offset: RopeOffset<'_>) -> Result<Array> {
        match self {
            Rope::Identity => Ok(x.clone()),
            Rope::Default {
                dims,
                traditional,
                base,
                scale,
            } => fast::rope(x, *dims, *traditional, Some(*base), *scale, offset, None),
            Rope::Dynamic {
                dims,
                max_position_embeddings,
                traditional,
                base,
                factor,
            } => {
                let RopeOffset::Int(offset) = offset else {
                    return Err(mlx_array::Error::InvalidArgument(
                        "dynamic NTK RoPE needs a scalar offset (no batch caches)".into(),
                    ));
                };
                let seq_len = (x.dim(-2)? + offset).max(*max_position_embeddings) as f64;
                let mp = *max_position_embeddings as f64;
                let d = *dims as f64;
                let base = base * ((factor * seq_len / mp) - (factor - 1.0)).powf(d / (d - 2.0));
                fast::rope(
                    x,
                    *dims,
                    *traditional,
                    Some(base as f32),
                    1.0,
                    RopeOffset::Int(offset),
                    None,
                )
            }
            Rope::Freqs {
                dims,
                traditional,
                freqs,
                input_scale,
            } => {
                let x = match input_scale {
                    Some(s) => scale_leading(x, *dims, *s)?,
                    None => x.clone(),
                };
                fast::rope(&x, *dims, *traditional, None, 1.0, offset, Some(freqs))
            }
        }
    }
}

/// `x.at[..., :dims].multiply(s)`.
fn scale_leading(x: &Array, dims: i32, s: f64) -> Result<Array> {
    let last = x.dim(-1)?;
    if dims >= last {
        return x.multiply(s);
    }
    let nd = x.ndim() as i32;
    let head = x.slice_axis(nd - 1, 0, dims)?.multiply(s)?;
    let mut start = vec![0; x.ndim()];
    let mut stop = x.shape();
    start[x.ndim() - 1] = 0;
    stop[x.ndim() - 1] = dims;
    x.slice_update(&head, &start, &stop, None)
}

/// mlx-lm's `initialize_rope(dims, base, traditional, scaling_config, max_position_embeddings)`.
pub fn initialize_rope(
    dims: i32,
    base: f64,
    traditional: bool,
    scaling: Option<&RopeScaling>,
    max_position_embeddings: Option<i32>,
) -> NnResult<Rope> {
    let Some(cfg) = scaling else {
        return Ok(Rope::new(dims, traditional, base, 1.0));
    };
    match cfg.rope_type.as_str() {
        "default" => Ok(Rope::new(dims, traditional, base, 1.0)),
        "linear" => Ok(Rope::new(
            dims,
            traditional,
            base,
            1.0 / cfg.need(cfg.factor, "factor")?,
        )),
        "dynamic" => Ok(Rope::Dynamic {
            dims,
            max_position_embeddings: max_position_embeddings.ok_or_else(|| {
                Error::RopeConfig("dynamic scaling needs max_position_embeddings".into())
            })?,
            traditional,
            base,
            factor: cfg.need(cfg.factor, "factor")?,
        }),
        "llama3" => Rope::llama3(dims, traditional, base, cfg),
        "yarn" | "deepseek_yarn" | "telechat3-yarn" => Rope::yarn(dims, traditional, base, cfg),
        "longrope" => {
            let orig = cfg.need(
                cfg.original_max_position_embeddings,
                "original_max_position_embeddings",
            )?;
            let long = cfg.long_factor.as_deref().ok_or_else(|| {
                Error::RopeConfig("`long_factor` is required for longrope".into())
            })?;
            let mp = max_position_embeddings.ok_or_else(|| {
                Error::RopeConfig("longrope needs max_position_embeddings".into())
            })?;
            Rope::su_scaled(dims, base, mp as f64, orig, long)
        }
        "proportional" => {
            let rotated = (dims as f64 * cfg.partial_rotary_factor.unwrap_or(1.0)) as i32;
            Rope::proportional(dims, rotated, traditional, base, cfg.factor.unwrap_or(1.0))
        }
        "mrope" => Ok(Rope::new(dims, traditional, base, 1.0)),
        other => Err(Error::RopeConfig(format!(
            "unsupported RoPE type `{other}`"
        ))),
    }
}

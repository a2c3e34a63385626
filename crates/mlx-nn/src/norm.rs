//! `RMSNorm` and `LayerNorm` (mlx.nn), both on MLX's fused kernels.
use crate::error::Result as NnResult;
use crate::module::Param;
use mlx_array::{fast, ops, Array, Dtype, Result};

/// Root-mean-square normalization over the last axis, `x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[dims]`, initialised to ones.
    pub weight: Param,
    /// Added to the mean square.
    pub eps: f32,
}

crate::impl_module!(RmsNorm { weight });

impl RmsNorm {
    /// A norm with a weight of ones.
    pub fn new(dims: i32, eps: f64) -> NnResult<RmsNorm> {
        Ok(RmsNorm {
            weight: Param::new(ops::ones(&[dims], Dtype::Float32)?),
            eps: eps as f32,
        })
    }

    /// `mx.fast.rms_norm(x, weight, eps)`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

/// Layer normalization over the last axis with optional affine weight and bias.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// `[dims]` scale (ones), when affine.
    pub weight: Option<Param>,
    /// `[dims]` shift (zeros), when affine with bias.
    pub bias: Option<Param>,
    /// Added to the variance.
    pub eps: f32,
}

crate::impl_module!(LayerNorm { weight, bias });

impl LayerNorm {
    /// mlx.nn `LayerNorm(dims, eps, affine, bias)`.
    pub fn new(dims: i32, eps: f64, affine: bool, bias: bool) -> NnResult<LayerNorm> {
        let weight = if affine {
            Some(Param::new(ops::ones(&[dims], Dtype::Float32)?))
        } else {
            None
        };
        let bias = if affine && bias {
            Some(Param::new(ops::zeros(&[dims], Dtype::Float32)?))
        } else {
            None
        };
        Ok(LayerNorm {
            weight,
            bias,
            eps: eps as f32,
        })
    }

    /// `mx.fast.layer_norm(x, weight, bias, eps)`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        fast::layer_norm(
            x,
            self.weight.as_ref().map(|w| w.value()),
            self.bias.as_ref().map(|b| b.value()),
            self.eps,
        )
    }
}

//! mlx-lm's `models/mla.py`: `MultiLinear`, one `[output, input]` matrix per attention
//! head (`[heads, output, input]`), which multi-head latent attention uses to move
//! queries into the compressed key space and attention outputs out of it; quantized as a
//! whole like mlx-lm's `QuantizedMultiLinear`.
use mlx_array::quant::{dequantize, quantize};
use mlx_array::{ops, Array, Dtype, Result};
use mlx_nn::module::{join, QuantVisitor};
use mlx_nn::{Module, Param, QuantSpec, Quantizable};

/// Per-head linear maps, dense or quantized.
#[derive(Debug, Clone)]
pub enum MultiLinear {
    /// `weight`: `[heads, output_dims, input_dims]`.
    Dense {
        /// The stacked matrices.
        weight: Param,
    },
    /// The packed weight, its scales and (affine) biases.
    Quantized {
        /// Packed `[heads, output_dims, input_dims * bits / 32]`.
        weight: Param,
        /// Per-group scales.
        scales: Param,
        /// Per-group biases (affine mode only).
        biases: Option<Param>,
        /// Group size, bits and mode.
        spec: QuantSpec,
    },
}

impl MultiLinear {
    /// Zero placeholders of `[num_heads, output_dims, input_dims]`.
    pub fn new(input_dims: i32, output_dims: i32, num_heads: i32) -> crate::Result<MultiLinear> {
        Ok(MultiLinear::Dense {
            weight: Param::new(ops::zeros(
                &[num_heads, output_dims, input_dims],
                Dtype::Float32,
            )?),
        })
    }

    /// `x @ weight.swapaxes(-1, -2)` when `transpose`, else `x @ weight` (mlx-lm's
    /// `__call__(x, transpose)`); one `quantized_matmul` when quantized.
    #[track_caller]
    pub fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        match self {
            MultiLinear::Dense { weight } => {
                if transpose {
                    x.matmul(&weight.swapaxes(-1, -2)?)
                } else {
                    x.matmul(weight)
                }
            }
            MultiLinear::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => mlx_nn::quantized_params_matmul(
                x,
                weight,
                scales,
                biases.as_ref(),
                transpose,
                *spec,
            ),
        }
    }
}

impl Module for MultiLinear {
    fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        match self {
            MultiLinear::Dense { weight } => f(&join(prefix, "weight"), weight),
            MultiLinear::Quantized {
                weight,
                scales,
                biases,
                ..
            } => {
                f(&join(prefix, "weight"), weight);
                f(&join(prefix, "scales"), scales);
                if let Some(b) = biases {
                    f(&join(prefix, "biases"), b);
                }
            }
        }
    }
    fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        match self {
            MultiLinear::Dense { weight } => f(&join(prefix, "weight"), weight),
            MultiLinear::Quantized {
                weight,
                scales,
                biases,
                ..
            } => {
                f(&join(prefix, "weight"), weight);
                f(&join(prefix, "scales"), scales);
                if let Some(b) = biases {
                    f(&join(prefix, "biases"), b);
                }
            }
        }
    }
    fn visit_quantizable_mut(
        &mut self,
        prefix: &str,
        f: &mut QuantVisitor<'_>,
    ) -> mlx_nn::Result<()> {
        f(prefix, self)
    }
}

impl Quantizable for MultiLinear {
    fn dense_weight_shape(&self) -> Vec<i32> {
        match self {
            MultiLinear::Dense { weight } => weight.shape(),
            MultiLinear::Quantized { weight, spec, .. } => {
                let mut s = weight.shape();
                if let Some(last) = s.last_mut() {
                    *last = *last * 32 / spec.bits;
                }
                s
            }
        }
    }
    fn quant_spec(&self) -> Option<QuantSpec> {
        match self {
            MultiLinear::Dense { .. } => None,
            MultiLinear::Quantized { spec, .. } => Some(*spec),
        }
    }
    /// mlx-lm's `MultiLinear.to_quantized`: `mx.quantize` of the stacked weight.
    fn quantize(&mut self, spec: QuantSpec) -> Result<()> {
        if self.quant_spec() == Some(spec) {
            return Ok(());
        }
        if self.quant_spec().is_some() {
            self.dequantize(None)?;
        }
        let MultiLinear::Dense { weight } = self else {
            return Ok(());
        };
        let q = quantize(weight, Some(spec.group_size), Some(spec.bits), spec.mode)?;
        *self = MultiLinear::Quantized {
            weight: Param::frozen(q.weight),
            scales: Param::frozen(q.scales),
            biases: q.biases.map(Param::frozen),
            spec,
        };
        Ok(())
    }
    fn dequantize(&mut self, dtype: Option<Dtype>) -> Result<()> {
        if let MultiLinear::Quantized {
            weight,
            scales,
            biases,
            spec,
        } = self
        {
            let w = dequantize(
                weight,
                scales,
                biases.as_ref().map(|b| b.value()),
                Some(spec.group_size),
                Some(spec.bits),
                spec.mode,
                dtype,
            )?;
            *self = MultiLinear::Dense {
                weight: Param::new(w),
            };
        }
        Ok(())
    }
}

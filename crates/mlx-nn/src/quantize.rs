//! Quantizing and dequantizing the layers of a module tree (mlx.nn's `quantize`).
use crate::error::{Error, Result};
use crate::module::Module;
use mlx_array::quant::QuantMode;
use mlx_array::Dtype;

/// How one layer is (or is to be) quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    /// Elements sharing one scale (and bias).
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
    /// MLX quantization mode.
    pub mode: QuantMode,
}

impl QuantSpec {
    /// A spec with the mode's defaults filled in for absent values
    /// (affine 64/4, mxfp4 32/4, nvfp4 16/4, mxfp8 32/8), like mlx.nn.
    pub fn new(group_size: Option<i32>, bits: Option<i32>, mode: QuantMode) -> QuantSpec {
        let (g, b) = mode.defaults();
        QuantSpec {
            group_size: group_size.unwrap_or(g),
            bits: bits.unwrap_or(b),
            mode,
        }
    }

    /// Packed width of a row of `in_dims` elements (uint32 words).
    pub fn packed_dims(&self, in_dims: i32) -> i32 {
        in_dims * self.bits / 32
    }
}

/// A layer that has a dense and a quantized form.
pub trait Quantizable {
    /// Shape of the dense weight (for a quantized layer: the shape it unpacks to).
    fn dense_weight_shape(&self) -> Vec<i32>;

    /// The current quantization, `None` when dense.
    fn quant_spec(&self) -> Option<QuantSpec>;

    /// Replaces the dense weight with its quantized form (a no-op if already quantized
    /// with the same spec).
    fn quantize(&mut self, spec: QuantSpec) -> mlx_array::Result<()>;

    /// Replaces the quantized weight with a dense one of `dtype` (`None`: the scales'
    /// dtype, like `mx.dequantize`). A dense layer is left as is.
    fn dequantize(&mut self, dtype: Option<Dtype>) -> mlx_array::Result<()>;

    /// The layer as a [`crate::LinearLayer`], when it is one (adapters go on those).
    fn as_linear_layer_mut(&mut self) -> Option<&mut crate::LinearLayer> {
        None
    }

    /// The layer as a [`crate::SwitchLinearLayer`], when it is one (expert adapters go
    /// on those).
    fn as_switch_layer_mut(&mut self) -> Option<&mut crate::SwitchLinearLayer> {
        None
    }

    /// The layer as a [`crate::EmbeddingLayer`], when it is one (embedding adapters go
    /// on those).
    fn as_embedding_layer_mut(&mut self) -> Option<&mut crate::EmbeddingLayer> {
        None
    }
}

/// Decides how (or whether) the layer at a path is quantized.
pub type QuantPredicate<'a> = dyn FnMut(&str, &dyn Quantizable) -> Result<Option<QuantSpec>> + 'a;

/// Quantizes every quantizable layer for which `predicate(path, layer)` returns a spec,
/// the way `mlx.nn.quantize(model, class_predicate=...)` does. Errors name the layer.
pub fn quantize_module(module: &mut dyn Module, predicate: &mut QuantPredicate<'_>) -> Result<()> {
    module.visit_quantizable_mut("", &mut |path, layer| {
        if let Some(spec) = predicate(path, layer)? {
            let in_dims = layer.dense_weight_shape().last().copied().unwrap_or(0);
            if spec.group_size <= 0 || in_dims % spec.group_size != 0 {
                return Err(Error::Quantization {
                    path: path.to_string(),
                    message: format!(
                        "input dimension {in_dims} is not a multiple of the group size {}",
                        spec.group_size
                    ),
                });
            }
            layer.quantize(spec).map_err(|e| Error::Quantization {
                path: path.to_string(),
                message: e.to_string(),
            })?;
        }
        Ok(())
    })
}

/// Dequantizes every quantized layer (mlx-lm's `dequantize_model`), to `dtype` or the
/// scales' dtype.
pub fn dequantize_module(module: &mut dyn Module, dtype: Option<Dtype>) -> Result<()> {
    module.visit_quantizable_mut("", &mut |path, layer| {
        if layer.quant_spec().is_some() {
            layer.dequantize(dtype).map_err(|e| Error::Quantization {
                path: path.to_string(),
                message: e.to_string(),
            })?;
        }
        Ok(())
    })
}

//! The plumbing of a layer enum with three variants: `Dense` (the layer), `Quantized`
//! (its quantized form) and `Lora` (a low-rank adapter over either, in a box with the
//! wrapped layer as `base` and its training `dropout`). `LinearLayer`, `EmbeddingLayer`
//! and `SwitchLinearLayer` have that shape; each keeps its own math (forward, adapters)
//! and gets the rest from [`layer_variants!`]. Converting between the dense and the
//! quantized variant goes through [`pack`] and [`unpack`].
use crate::module::Param;
use crate::quantize::QuantSpec;
use mlx_array::quant::{dequantize, quantize};
use mlx_array::{Array, Dtype, Result};

/// A weight quantized by a [`QuantSpec`], frozen as mlx.nn's quantized layers keep it.
pub(crate) struct Packed {
    /// The packed weight.
    pub(crate) weight: Param,
    /// Per-group scales.
    pub(crate) scales: Param,
    /// Per-group biases (affine mode only).
    pub(crate) biases: Option<Param>,
}

/// `mx.quantize(weight, group_size, bits, mode)`.
pub(crate) fn pack(weight: &Array, spec: QuantSpec) -> Result<Packed> {
    let q = quantize(weight, Some(spec.group_size), Some(spec.bits), spec.mode)?;
    Ok(Packed {
        weight: Param::frozen(q.weight),
        scales: Param::frozen(q.scales),
        biases: q.biases.map(Param::frozen),
    })
}

/// `mx.dequantize` of a packed weight, in `dtype` (`None`: the scales' dtype).
pub(crate) fn unpack(
    weight: &Array,
    scales: &Array,
    biases: Option<&Param>,
    spec: QuantSpec,
    dtype: Option<Dtype>,
) -> Result<Array> {
    dequantize(
        weight,
        scales,
        biases.map(|b| b.value()),
        Some(spec.group_size),
        Some(spec.bits),
        spec.mode,
        dtype,
    )
}

/// Implements, for the enum `$ty`: [`crate::Module`] (the variant's parameters; the
/// enum is the quantizable unit), [`crate::quantize::Quantizable`] (quantizing and
/// dequantizing through the variants' `to_quantized` / `to_dense`, an adapter answering
/// with its `base`; `|$q| $shape` is the dense weight shape of a quantized variant `$q`,
/// `$as_mut` the accessor that hands out the layer) and `set_adapter_dropout`. Further
/// variants wrapping a `base` the same way (`adapters: [Resident]`) answer like `Lora`.
macro_rules! layer_variants {
    ($ty:ident, |$q:ident| $shape:expr, $as_mut:ident $(, adapters: [$($extra:ident),*])?) => {
        impl $crate::module::Module for $ty {
            fn visit_params<'a>(
                &'a self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &'a $crate::module::Param),
            ) {
                match self {
                    $ty::Dense(l) => l.visit_params(prefix, f),
                    $ty::Quantized(l) => l.visit_params(prefix, f),
                    $ty::Lora(l) => l.visit_params(prefix, f),
                    $($($ty::$extra(l) => l.visit_params(prefix, f),)*)?
                }
            }
            fn visit_params_mut(
                &mut self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &mut $crate::module::Param),
            ) {
                match self {
                    $ty::Dense(l) => l.visit_params_mut(prefix, f),
                    $ty::Quantized(l) => l.visit_params_mut(prefix, f),
                    $ty::Lora(l) => l.visit_params_mut(prefix, f),
                    $($($ty::$extra(l) => l.visit_params_mut(prefix, f),)*)?
                }
            }
            fn visit_quantizable_mut(
                &mut self,
                prefix: &str,
                f: &mut $crate::module::QuantVisitor<'_>,
            ) -> $crate::error::Result<()> {
                f(prefix, self)
            }
        }

        impl $crate::quantize::Quantizable for $ty {
            fn dense_weight_shape(&self) -> Vec<i32> {
                match self {
                    $ty::Dense(l) => l.weight.shape(),
                    $ty::Quantized($q) => $shape,
                    $ty::Lora(l) => l.base.dense_weight_shape(),
                    $($($ty::$extra(l) => l.base.dense_weight_shape(),)*)?
                }
            }
            fn quant_spec(&self) -> Option<$crate::quantize::QuantSpec> {
                match self {
                    $ty::Dense(_) => None,
                    $ty::Quantized(q) => Some(q.spec),
                    $ty::Lora(l) => l.base.quant_spec(),
                    $($($ty::$extra(l) => l.base.quant_spec(),)*)?
                }
            }
            fn quantize(&mut self, spec: $crate::quantize::QuantSpec) -> mlx_array::Result<()> {
                match self {
                    $ty::Dense(l) => *self = $ty::Quantized(l.to_quantized(spec)?),
                    $ty::Quantized(q) if q.spec != spec => {
                        let dense = q.to_dense(None)?;
                        *self = $ty::Quantized(dense.to_quantized(spec)?);
                    }
                    $ty::Quantized(_) => {}
                    $ty::Lora(l) => l.base.quantize(spec)?,
                    $($($ty::$extra(l) => l.base.quantize(spec)?,)*)?
                }
                Ok(())
            }
            fn dequantize(&mut self, dtype: Option<mlx_array::Dtype>) -> mlx_array::Result<()> {
                match self {
                    $ty::Quantized(q) => *self = $ty::Dense(q.to_dense(dtype)?),
                    $ty::Lora(l) => l.base.dequantize(dtype)?,
                    $($($ty::$extra(l) => l.base.dequantize(dtype)?,)*)?
                    $ty::Dense(_) => {}
                }
                Ok(())
            }
            fn $as_mut(&mut self) -> Option<&mut $ty> {
                Some(self)
            }
        }

        impl $ty {
            /// Sets the training dropout of the layer's adapter (no-op without one).
            pub fn set_adapter_dropout(&mut self, p: f64) {
                if let $ty::Lora(l) = self {
                    l.dropout = p;
                }
            }
        }
    };
}

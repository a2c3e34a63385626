//! `Linear` and `QuantizedLinear` (mlx.nn), and [`LinearLayer`], which is either.
use crate::error::Result as NnResult;
use crate::lora::{LoraLinear, ResidentAdapter, ResidentLoraLinear};
use crate::module::Param;
use crate::quantize::QuantSpec;
use crate::variants::{pack, unpack};
use mlx_array::quant::{
    quantized_matmul, quantized_matmul_add, quantized_matmul_many, quantized_matmul_swiglu, GateUp,
    QuantMode, QuantizedWeight,
};
use mlx_array::{ops, Array, Dtype, Result};

/// `y = x W^T + b`, with `W` of shape `[output_dims, input_dims]`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[output_dims, input_dims]`.
    pub weight: Param,
    /// `[output_dims]`, when the layer has a bias.
    pub bias: Option<Param>,
}

crate::impl_module!(Linear { weight, bias });

impl Linear {
    /// A layer with zero placeholders (lazy, nothing is allocated until evaluated);
    /// load real weights with [`crate::Module::load_weights`].
    pub fn new(input_dims: i32, output_dims: i32, bias: bool) -> NnResult<Linear> {
        let weight = Param::new(ops::zeros(&[output_dims, input_dims], Dtype::Float32)?);
        let bias = if bias {
            Some(Param::new(ops::zeros(&[output_dims], Dtype::Float32)?))
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// A layer from given arrays.
    pub fn from_weights(weight: Array, bias: Option<Array>) -> Linear {
        Linear {
            weight: Param::new(weight),
            bias: bias.map(Param::new),
        }
    }

    /// `addmm(b, x, W.T)` with a bias, else `x @ W.T`, exactly like mlx.nn.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        crate::tap::observe(&self.weight, x);
        let wt = self.weight.transposed()?;
        match &self.bias {
            Some(b) => ops::addmm(b, x, &wt, 1.0, 1.0),
            None => x.matmul(&wt),
        }
    }

    /// The quantized version (mlx.nn `QuantizedLinear.from_linear`).
    pub fn to_quantized(&self, spec: QuantSpec) -> Result<QuantizedLinear> {
        let p = pack(&self.weight, spec)?;
        Ok(QuantizedLinear {
            weight: p.weight,
            scales: p.scales,
            biases: p.biases,
            bias: self.bias.clone(),
            spec,
        })
    }
}

/// A linear layer with a quantized weight matrix (mlx.nn `QuantizedLinear`).
#[derive(Debug, Clone)]
pub struct QuantizedLinear {
    /// Packed weight, uint32 `[output_dims, input_dims * bits / 32]`.
    pub weight: Param,
    /// Per-group scales.
    pub scales: Param,
    /// Per-group biases (affine mode only).
    pub biases: Option<Param>,
    /// Output bias.
    pub bias: Option<Param>,
    /// Group size, bits and mode.
    pub spec: QuantSpec,
}

crate::impl_module!(QuantizedLinear {
    weight,
    scales,
    biases,
    bias
});

/// The scales and biases an affine quantized product of `x` reads: for float32 `x` and
/// float16 / bfloat16 scales, their float32 casts kept by the parameters
/// ([`Param::cast`]) instead of a cast node per operand per call. MLX's
/// `quantized_matmul` / `gather_qmm` cast them to the promoted dtype themselves, so the
/// product is the same array either way. The casts cost their memory for as long as the
/// layer lives (twice the scales and biases); `MLX_QUANT_CAST_ONCE=0` (read once) casts
/// on every call instead.
pub(crate) fn quantized_operands(
    x: &Array,
    scales: &Param,
    biases: Option<&Param>,
    spec: QuantSpec,
) -> Result<(Array, Option<Array>)> {
    let half = |d: Dtype| matches!(d, Dtype::Float16 | Dtype::Bfloat16);
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("MLX_QUANT_CAST_ONCE").map_or(true, |v| v != "0"));
    let widen = on
        && spec.mode == QuantMode::Affine
        && x.dtype() == Dtype::Float32
        && half(scales.dtype())
        && biases.is_none_or(|b| b.dtype() == scales.dtype());
    if !widen {
        return Ok((scales.value().clone(), biases.map(|b| b.value().clone())));
    }
    Ok((
        scales.cast(Dtype::Float32)?,
        biases.map(|b| b.cast(Dtype::Float32)).transpose()?,
    ))
}

/// `quantized_matmul(x, weight, scales, biases, transpose)` of a layer's parameters (a
/// quantized linear layer, a tied quantized embedding's head, MLA's per-head products):
/// for float32 `x` and float16 / bfloat16 affine scales, with the scales' and biases'
/// float32 casts kept by the parameters ([`Param::cast`]), the same array as MLX's own
/// product (`MLX_QUANT_CAST_ONCE=0` casts every call).
#[track_caller]
pub fn quantized_params_matmul(
    x: &Array,
    weight: &Param,
    scales: &Param,
    biases: Option<&Param>,
    transpose: bool,
    spec: QuantSpec,
) -> Result<Array> {
    let (scales, biases) = quantized_operands(x, scales, biases, spec)?;
    quantized_matmul(
        x,
        weight,
        &scales,
        biases.as_ref(),
        transpose,
        Some(spec.group_size),
        Some(spec.bits),
        spec.mode,
    )
}

impl QuantizedLinear {
    /// `quantized_matmul(x, W, scales, biases, transpose=True) (+ bias)`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = quantized_params_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.spec,
        )?;
        self.add_bias(y)
    }

    /// The scales and affine biases (`None` in the other modes) to multiply `x` with
    /// (see [`quantized_operands`]).
    fn operands(&self, x: &Array) -> Result<(Array, Option<Array>)> {
        quantized_operands(x, &self.scales, self.biases.as_ref(), self.spec)
    }

    /// The packed weight with `operands` (from [`QuantizedLinear::operands`]).
    fn packed<'a>(&'a self, operands: &'a (Array, Option<Array>)) -> QuantizedWeight<'a> {
        QuantizedWeight {
            weight: self.weight.value(),
            scales: &operands.0,
            biases: operands.1.as_ref(),
        }
    }

    /// `y` plus the output bias, if the layer has one.
    fn add_bias(&self, y: Array) -> Result<Array> {
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// Input dimension the packed weight unpacks to.
    pub fn input_dims(&self) -> i32 {
        self.weight.shape().last().copied().unwrap_or(0) * 32 / self.spec.bits
    }

    /// The dense layer (mlx-lm's `dequantize_model` for one layer).
    pub fn to_dense(&self, dtype: Option<Dtype>) -> Result<Linear> {
        let w = unpack(
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            self.spec,
            dtype,
        )?;
        Ok(Linear {
            weight: Param::new(w),
            bias: self.bias.clone(),
        })
    }
}

/// A linear layer that is dense or quantized; models hold this so that loading a
/// quantized checkpoint swaps the layer in place, like mlx.nn's `quantize`.
#[derive(Debug, Clone)]
pub enum LinearLayer {
    /// Dense weights.
    Dense(Linear),
    /// Quantized weights.
    Quantized(QuantizedLinear),
    /// Either, with a low-rank adapter (mlx-lm's `LoRALinear` / `DoRALinear`).
    Lora(Box<LoraLinear>),
    /// Either, with LoRA adapters kept resident, picked per batch row (serving several
    /// adapters on one base model).
    Resident(Box<ResidentLoraLinear>),
}

impl LinearLayer {
    /// A dense layer with zero placeholders (see [`Linear::new`]).
    pub fn new(input_dims: i32, output_dims: i32, bias: bool) -> NnResult<LinearLayer> {
        Ok(LinearLayer::Dense(Linear::new(
            input_dims,
            output_dims,
            bias,
        )?))
    }

    /// Applies the layer.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            LinearLayer::Dense(l) => l.forward(x),
            LinearLayer::Quantized(l) => l.forward(x),
            LinearLayer::Lora(l) => l.forward(x),
            LinearLayer::Resident(l) => l.forward(x),
        }
    }

    /// The dense weight (dequantized, in the scales' dtype, for a quantized layer) and
    /// the output bias, of the layer under any adapter.
    pub fn dense_weight_and_bias(&self) -> Result<(Array, Option<Array>)> {
        match self {
            LinearLayer::Dense(l) => Ok((
                l.weight.value().clone(),
                l.bias.as_ref().map(|b| b.value().clone()),
            )),
            LinearLayer::Quantized(q) => {
                let d = q.to_dense(None)?;
                Ok((
                    d.weight.value().clone(),
                    q.bias.as_ref().map(|b| b.value().clone()),
                ))
            }
            LinearLayer::Lora(l) => l.base.dense_weight_and_bias(),
            LinearLayer::Resident(l) => l.base.dense_weight_and_bias(),
        }
    }

    /// Puts a low-rank adapter on the layer (see [`LoraLinear`]); an adapter already
    /// there is replaced.
    pub fn add_adapter(
        &mut self,
        lora_a: Array,
        lora_b: Array,
        magnitude: Option<Array>,
        scale: f64,
    ) {
        let placeholder = LinearLayer::Dense(Linear::from_weights(lora_a.clone(), None));
        let base = match std::mem::replace(self, placeholder) {
            LinearLayer::Lora(l) => l.base,
            LinearLayer::Resident(l) => l.base,
            other => other,
        };
        *self = LinearLayer::Lora(Box::new(LoraLinear {
            base,
            lora_a: Param::frozen(lora_a),
            lora_b: Param::frozen(lora_b),
            magnitude: magnitude.map(Param::frozen),
            scale,
            dropout: 0.0,
        }));
    }

    /// Keeps the LoRA adapter `id` (not 0) resident on the layer, next to any others (see
    /// [`ResidentLoraLinear`]); an adapter with that id already there is replaced.
    /// Refused on a layer with an adapter applied at load ([`LinearLayer::Lora`]).
    pub fn add_resident_adapter(
        &mut self,
        id: u32,
        lora_a: Array,
        lora_b: Array,
        scale: f64,
    ) -> Result<()> {
        if id == 0 {
            return Err(mlx_array::Error::InvalidArgument(
                "a resident adapter's id is not 0 (0 is no adapter)".into(),
            ));
        }
        let adapter = ResidentAdapter {
            id,
            lora_a: Param::frozen(lora_a),
            lora_b: Param::frozen(lora_b),
            scale,
        };
        match self {
            LinearLayer::Lora(_) => Err(mlx_array::Error::InvalidArgument(
                "the layer already has an adapter applied at load".into(),
            )),
            LinearLayer::Resident(r) => {
                r.adapters.retain(|a| a.id != id);
                r.adapters.push(adapter);
                Ok(())
            }
            LinearLayer::Dense(_) | LinearLayer::Quantized(_) => {
                let placeholder =
                    LinearLayer::Dense(Linear::from_weights(adapter.lora_a.value().clone(), None));
                let base = std::mem::replace(self, placeholder);
                *self = LinearLayer::Resident(Box::new(ResidentLoraLinear {
                    base,
                    adapters: vec![adapter],
                }));
                Ok(())
            }
        }
    }

    /// Drops the resident adapter `id` (the plain layer comes back with the last one);
    /// whether it was there.
    pub fn remove_resident_adapter(&mut self, id: u32) -> Result<bool> {
        let LinearLayer::Resident(r) = self else {
            return Ok(false);
        };
        let before = r.adapters.len();
        r.adapters.retain(|a| a.id != id);
        let removed = r.adapters.len() != before;
        if r.adapters.is_empty() {
            let placeholder = LinearLayer::Dense(Linear::from_weights(
                Array::from_slice(&[0f32], &[1, 1])?,
                None,
            ));
            if let LinearLayer::Resident(r) = std::mem::replace(self, placeholder) {
                *self = r.base;
            }
        }
        Ok(removed)
    }

    /// The ids of the adapters resident on the layer (none unless
    /// [`LinearLayer::Resident`]).
    pub fn resident_adapter_ids(&self) -> Vec<u32> {
        match self {
            LinearLayer::Resident(r) => r.ids().collect(),
            _ => Vec::new(),
        }
    }
    /// `residual + self.forward(x)`, the same array: for a layer without an output bias
    /// through one [`quantized_matmul_add`] (quantized) or
    /// [`mlx_array::fast::matmul_add`] (dense), which can do the add in our kernel's
    /// launch.
    #[track_caller]
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self {
            LinearLayer::Dense(d) if d.bias.is_none() => {
                crate::tap::observe(&d.weight, x);
                mlx_array::fast::matmul_add(x, &d.weight.transposed()?, residual)
            }
            LinearLayer::Quantized(q) if q.bias.is_none() => {
                let (scales, biases) = q.operands(x)?;
                quantized_matmul_add(
                    x,
                    &q.weight,
                    &scales,
                    biases.as_ref(),
                    residual,
                    Some(q.spec.group_size),
                    Some(q.spec.bits),
                    q.spec.mode,
                )
            }
            _ => residual.add(&self.forward(x)?),
        }
    }

    /// Each layer of `layers` applied to the same `x`: the same arrays as calling
    /// [`LinearLayer::forward`] on each. Quantized layers of one spec go through one
    /// [`quantized_matmul_many`], so a decoding step's q/k/v or gate/up projections can
    /// run as one launch of our kernels.
    #[track_caller]
    pub fn forward_many(layers: &[&LinearLayer], x: &Array) -> Result<Vec<Array>> {
        let quantized: Vec<&QuantizedLinear> = layers
            .iter()
            .filter_map(|l| match l {
                LinearLayer::Quantized(q) => Some(q),
                LinearLayer::Dense(_) | LinearLayer::Lora(_) | LinearLayer::Resident(_) => None,
            })
            .collect();
        let shared = match quantized.first() {
            Some(q0) if quantized.len() == layers.len() && layers.len() > 1 => quantized
                .iter()
                .all(|q| q.spec == q0.spec && q.biases.is_some() == q0.biases.is_some()),
            _ => false,
        };
        if !shared {
            return layers.iter().map(|l| l.forward(x)).collect();
        }
        let spec = quantized[0].spec;
        let operands = quantized
            .iter()
            .map(|q| q.operands(x))
            .collect::<Result<Vec<_>>>()?;
        let weights: Vec<QuantizedWeight<'_>> = quantized
            .iter()
            .zip(&operands)
            .map(|(q, o)| q.packed(o))
            .collect();
        let ys = quantized_matmul_many(
            x,
            &weights,
            Some(spec.group_size),
            Some(spec.bits),
            spec.mode,
        )?;
        ys.into_iter()
            .zip(&quantized)
            .map(|(y, q)| q.add_bias(y))
            .collect()
    }

    /// mlx-lm's `swiglu(gate(x), up(x))`, the same array as
    /// [`crate::activations::swiglu`] of [`LinearLayer::forward_many`]'s two outputs: for
    /// two quantized layers of one spec without output biases through one
    /// [`quantized_matmul_swiglu`] (one launch of our CUDA kernels for both products and
    /// the swiglu where it covers them: a decoding step's MLP).
    #[track_caller]
    pub fn forward_swiglu(gate: &LinearLayer, up: &LinearLayer, x: &Array) -> Result<Array> {
        let (g, u) = match (gate, up) {
            (LinearLayer::Quantized(g), LinearLayer::Quantized(u))
                if g.spec == u.spec && g.bias.is_none() && u.bias.is_none() =>
            {
                let spec = g.spec;
                let (go, uo) = (g.operands(x)?, u.operands(x)?);
                match quantized_matmul_swiglu(
                    x,
                    g.packed(&go),
                    u.packed(&uo),
                    Some(spec.group_size),
                    Some(spec.bits),
                    spec.mode,
                )? {
                    GateUp::Swiglu(y) => return Ok(y),
                    GateUp::Products(g, u) => (g, u),
                }
            }
            _ => {
                let [g, u]: [Array; 2] = LinearLayer::forward_many(&[gate, up], x)?
                    .try_into()
                    .map_err(|_| {
                        mlx_array::Error::InvalidArgument("forward_many: two outputs".into())
                    })?;
                (g, u)
            }
        };
        crate::activations::swiglu(&g, &u)
    }
}

layer_variants!(
    LinearLayer,
    |q| vec![q.weight.shape()[0], q.input_dims()],
    as_linear_layer_mut,
    adapters: [Resident]
);

//! Mixture-of-experts layers of `mlx_lm/models/switch_layers.py`: `SwitchLinear`,
//! `QuantizedSwitchLinear` and `SwitchGLU`, on `gather_mm` / `gather_qmm`.
use crate::activations::{clamped_swiglu, geglu, swiglu, swiglu_oai};
use crate::error::Result as NnResult;
use crate::module::Param;
use crate::quantize::QuantSpec;
use crate::variants::{pack, unpack};
use mlx_array::quant::{gather_mm, gather_qmm};
use mlx_array::{ops, Array, Dtype, Result};

/// One linear layer per expert: weight `[num_experts, output_dims, input_dims]`.
#[derive(Debug, Clone)]
pub struct SwitchLinear {
    /// `[num_experts, output_dims, input_dims]`.
    pub weight: Param,
    /// `[num_experts, output_dims]`.
    pub bias: Option<Param>,
}

crate::impl_module!(SwitchLinear { weight, bias });

impl SwitchLinear {
    /// Zero placeholders to be loaded.
    pub fn new(
        input_dims: i32,
        output_dims: i32,
        num_experts: i32,
        bias: bool,
    ) -> NnResult<SwitchLinear> {
        let weight = Param::new(ops::zeros(
            &[num_experts, output_dims, input_dims],
            Dtype::Float32,
        )?);
        let bias = if bias {
            Some(Param::new(ops::zeros(
                &[num_experts, output_dims],
                Dtype::Float32,
            )?))
        } else {
            None
        };
        Ok(SwitchLinear { weight, bias })
    }

    /// `gather_mm(x, W.swapaxes(-1, -2), rhs_indices=indices)` (+ `bias[indices]`).
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array> {
        crate::tap::observe(&self.weight, x);
        let y = gather_mm(
            x,
            &self.weight.swapaxes(-1, -2)?,
            None,
            Some(indices),
            sorted_indices,
        )?;
        add_expert_bias(y, self.bias.as_ref(), indices)
    }

    /// The quantized version.
    pub fn to_quantized(&self, spec: QuantSpec) -> Result<QuantizedSwitchLinear> {
        let p = pack(&self.weight, spec)?;
        Ok(QuantizedSwitchLinear {
            weight: p.weight,
            scales: p.scales,
            biases: p.biases,
            bias: self.bias.clone(),
            spec,
        })
    }
}

fn add_expert_bias(y: Array, bias: Option<&Param>, indices: &Array) -> Result<Array> {
    match bias {
        // `self["bias"][indices]` indexes the first axis.
        Some(b) => y.add(&b.take(indices, Some(0))?.expand_dims(&[-2])?),
        None => Ok(y),
    }
}

/// Quantized per-expert linear layers.
#[derive(Debug, Clone)]
pub struct QuantizedSwitchLinear {
    /// Packed `[num_experts, output_dims, packed_in]`.
    pub weight: Param,
    /// Scales.
    pub scales: Param,
    /// Biases (affine only).
    pub biases: Option<Param>,
    /// Output bias `[num_experts, output_dims]`.
    pub bias: Option<Param>,
    /// Group size, bits and mode.
    pub spec: QuantSpec,
}

crate::impl_module!(QuantizedSwitchLinear {
    weight,
    scales,
    biases,
    bias
});

impl QuantizedSwitchLinear {
    /// `gather_qmm(x, W, scales, biases, rhs_indices=indices, transpose=True)`.
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array> {
        let (scales, biases) =
            crate::linear::quantized_operands(x, &self.scales, self.biases.as_ref(), self.spec)?;
        let y = gather_qmm(
            x,
            &self.weight,
            &scales,
            biases.as_ref(),
            None,
            Some(indices),
            true,
            Some(self.spec.group_size),
            Some(self.spec.bits),
            self.spec.mode,
            sorted_indices,
        )?;
        add_expert_bias(y, self.bias.as_ref(), indices)
    }

    /// The dense layers.
    pub fn to_dense(&self, dtype: Option<Dtype>) -> Result<SwitchLinear> {
        let w = unpack(
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            self.spec,
            dtype,
        )?;
        Ok(SwitchLinear {
            weight: Param::new(w),
            bias: self.bias.clone(),
        })
    }
}

/// A switch layer that is dense or quantized.
#[derive(Debug, Clone)]
pub enum SwitchLinearLayer {
    /// Dense experts.
    Dense(SwitchLinear),
    /// Quantized experts.
    Quantized(QuantizedSwitchLinear),
    /// Either, with per-expert low-rank adapters (mlx-lm's `LoRASwitchLinear`).
    Lora(Box<crate::lora::LoraSwitchLinear>),
}

impl SwitchLinearLayer {
    /// Applies the experts picked by `indices`.
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array> {
        match self {
            SwitchLinearLayer::Dense(l) => l.forward(x, indices, sorted_indices),
            SwitchLinearLayer::Quantized(l) => l.forward(x, indices, sorted_indices),
            SwitchLinearLayer::Lora(l) => l.forward(x, indices, sorted_indices),
        }
    }

    /// Puts per-expert low-rank adapters on the layer (`lora_a` `[E, r, in]`, `lora_b`
    /// `[E, out, r]`, frozen until unfrozen); an adapter already there is replaced.
    pub fn add_adapter(&mut self, lora_a: Array, lora_b: Array, scale: f64) {
        let placeholder = SwitchLinearLayer::Dense(SwitchLinear {
            weight: Param::frozen(lora_a.clone()),
            bias: None,
        });
        let base = match std::mem::replace(self, placeholder) {
            SwitchLinearLayer::Lora(l) => l.base,
            other => other,
        };
        *self = SwitchLinearLayer::Lora(Box::new(crate::lora::LoraSwitchLinear {
            base,
            lora_a: Param::frozen(lora_a),
            lora_b: Param::frozen(lora_b),
            scale,
            dropout: 0.0,
        }));
    }
}

layer_variants!(
    SwitchLinearLayer,
    |q| {
        let mut s = q.weight.shape();
        if let Some(last) = s.last_mut() {
            *last = *last * 32 / q.spec.bits;
        }
        s
    },
    as_switch_layer_mut
);

/// The gated activation of a [`SwitchGlu`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum GluActivation {
    /// mlx-lm's `SwiGLU`: `silu(gate) * up`.
    #[default]
    Swiglu,
    /// mlx-lm's `SwigluOAI` (GPT-OSS): [`swiglu_oai`].
    SwigluOai,
    /// Gemma 4's `GeGLU`: [`geglu`] (`gelu_approx(gate) * up`).
    Geglu,
    /// Step 3.5's `ClampedSwiGLU(limit)`: [`clamped_swiglu`].
    ClampedSwiglu(f64),
}

/// `SwitchGLU`: `down(activation(gate(x), up(x)))` with per-token experts.
#[derive(Debug, Clone)]
pub struct SwitchGlu {
    /// Gate projections.
    pub gate_proj: SwitchLinearLayer,
    /// Up projections.
    pub up_proj: SwitchLinearLayer,
    /// Down projections.
    pub down_proj: SwitchLinearLayer,
    /// The gated activation (SwiGLU unless set).
    pub activation: GluActivation,
}

crate::impl_module!(SwitchGlu {
    gate_proj,
    up_proj,
    down_proj
});

impl SwitchGlu {
    /// Zero placeholders to be loaded.
    pub fn new(
        input_dims: i32,
        hidden_dims: i32,
        num_experts: i32,
        bias: bool,
    ) -> NnResult<SwitchGlu> {
        let l = |i, o| dense_switch(i, o, num_experts, bias);
        Ok(SwitchGlu {
            gate_proj: l(input_dims, hidden_dims)?,
            up_proj: l(input_dims, hidden_dims)?,
            down_proj: l(hidden_dims, input_dims)?,
            activation: GluActivation::Swiglu,
        })
    }

    /// The same layers with another gated activation.
    pub fn with_activation(self, activation: GluActivation) -> SwitchGlu {
        SwitchGlu { activation, ..self }
    }

    /// `x`: `[..., dims]`, `indices`: `[..., k]` expert ids; returns `[..., k, dims]`.
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims(&[-2, -3])?;
        let indices = indices.stop_gradient()?;
        let do_sort = indices.size() >= 64;
        let (x, idx, inv_order) = if do_sort {
            let (x, idx, inv) = gather_sort(&x, &indices)?;
            (x, idx, Some(inv))
        } else {
            (x, indices.clone(), None)
        };
        let x_up = self.up_proj.forward(&x, &idx, do_sort)?;
        let x_gate = self.gate_proj.forward(&x, &idx, do_sort)?;
        let h = match self.activation {
            GluActivation::Swiglu => swiglu(&x_gate, &x_up)?,
            GluActivation::SwigluOai => swiglu_oai(&x_gate, &x_up)?,
            GluActivation::Geglu => geglu(&x_gate, &x_up)?,
            GluActivation::ClampedSwiglu(limit) => clamped_swiglu(&x_up, &x_gate, limit)?,
        };
        let mut y = self.down_proj.forward(&h, &idx, do_sort)?;
        if let Some(inv) = inv_order {
            y = scatter_unsort(&y, &inv, Some(&indices.shape()))?;
        }
        y.squeeze(Some(&[-2]))
    }
}

/// `SwitchMLP`: `fc2(activation(fc1(x)))` with per-token experts (phixtral's experts
/// use mlx-lm's default activation, `GELU(approx="precise")`: [`crate::activations::gelu_approx`]).
#[derive(Debug, Clone)]
pub struct SwitchMlp {
    /// Input projections.
    pub fc1: SwitchLinearLayer,
    /// Output projections.
    pub fc2: SwitchLinearLayer,
    /// The activation between them.
    pub activation: fn(&Array) -> Result<Array>,
}

crate::impl_module!(SwitchMlp { fc1, fc2 });

impl SwitchMlp {
    /// Zero placeholders to be loaded.
    pub fn new(
        input_dims: i32,
        hidden_dims: i32,
        num_experts: i32,
        bias: bool,
        activation: fn(&Array) -> Result<Array>,
    ) -> NnResult<SwitchMlp> {
        let l = |i, o| dense_switch(i, o, num_experts, bias);
        Ok(SwitchMlp {
            fc1: l(input_dims, hidden_dims)?,
            fc2: l(hidden_dims, input_dims)?,
            activation,
        })
    }

    /// `x`: `[..., dims]`, `indices`: `[..., k]` expert ids; returns `[..., k, dims]`.
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims(&[-2, -3])?;
        let indices = indices.stop_gradient()?;
        let do_sort = indices.size() >= 64;
        let (x, idx, inv_order) = if do_sort {
            let (x, idx, inv) = gather_sort(&x, &indices)?;
            (x, idx, Some(inv))
        } else {
            (x, indices.clone(), None)
        };
        let h = (self.activation)(&self.fc1.forward(&x, &idx, do_sort)?)?;
        let mut y = self.fc2.forward(&h, &idx, do_sort)?;
        if let Some(inv) = inv_order {
            y = scatter_unsort(&y, &inv, Some(&indices.shape()))?;
        }
        y.squeeze(Some(&[-2]))
    }
}

/// `_gather_sort`: orders tokens by expert id.
fn gather_sort(x: &Array, indices: &Array) -> Result<(Array, Array, Array)> {
    let m = indices.dim(-1)?;
    let flat = indices.flatten(0, -1)?;
    let order = flat.argsort(Some(-1))?;
    let inv_order = order.argsort(Some(-1))?;
    let nd = x.ndim() as i32;
    let xs = x
        .flatten(0, nd - 3)?
        .take(&order.floor_divide(m)?, Some(0))?;
    Ok((xs, flat.take(&order, Some(0))?, inv_order))
}

/// `_scatter_unsort`: restores token order.
fn scatter_unsort(x: &Array, inv_order: &Array, shape: Option<&[i32]>) -> Result<Array> {
    let x = x.take(inv_order, Some(0))?;
    match shape {
        Some(s) => x.unflatten(0, s),
        None => Ok(x),
    }
}

/// A dense [`SwitchLinear`] of `num_experts` experts from `input_dims` to `output_dims`.
fn dense_switch(
    input_dims: i32,
    output_dims: i32,
    num_experts: i32,
    bias: bool,
) -> NnResult<SwitchLinearLayer> {
    Ok(SwitchLinearLayer::Dense(SwitchLinear::new(
        input_dims,
        output_dims,
        num_experts,
        bias,
    )?))
}

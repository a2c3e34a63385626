//! A linear layer with a low-rank adapter, as mlx-lm runs it at inference
//! (`tuner.lora.LoRALinear`, `tuner.dora.DoRALinear`; dropout is off outside training).
use crate::linear::LinearLayer;
use crate::module::{join, Module, Param};
use mlx_array::{Array, Result};

/// `base(x) + (scale * ((x @ lora_a) @ lora_b)).astype(x.dtype)`; with a magnitude `m`
/// (DoRA) the sum is taken without the bias, rescaled per output by `m / ||W + delta||`
/// and the bias added after, as mlx-lm does.
#[derive(Debug, Clone)]
pub struct LoraLinear {
    /// The adapted layer.
    pub base: LinearLayer,
    /// `[input_dims, rank]`.
    pub lora_a: Param,
    /// `[rank, output_dims]`.
    pub lora_b: Param,
    /// DoRA's magnitude, `[output_dims]`.
    pub magnitude: Option<Param>,
    /// The factor of the low-rank update.
    pub scale: f64,
}

impl LoraLinear {
    /// Applies the layer.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let z = x.matmul(&self.lora_a)?.matmul(&self.lora_b)?;
        let update = z.multiply(self.scale)?.astype(x.dtype())?;
        let Some(m) = &self.magnitude else {
            return self.base.forward(x)?.add(&update);
        };
        let (w, bias) = self.base.dense_weight_and_bias()?;
        let y = x.matmul(&w.transpose(None)?)?;
        let out = y.add(&update)?;
        let delta = self
            .lora_b
            .value()
            .transpose(None)?
            .multiply(self.scale)?
            .matmul(&self.lora_a.value().transpose(None)?)?;
        let adapted = w.add(&delta)?;
        // Training takes no gradient through the norm (mlx-lm's `stop_gradient`).
        let denom = adapted
            .square()?
            .sum(Some(&[1]), false)?
            .sqrt()?
            .stop_gradient()?;
        let out = m
            .value()
            .divide(&denom)?
            .astype(x.dtype())?
            .multiply(&out)?;
        match bias {
            Some(b) => out.add(&b),
            None => Ok(out),
        }
    }

    pub(crate) fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.base.visit_params(prefix, f);
        f(&join(prefix, "lora_a"), &self.lora_a);
        f(&join(prefix, "lora_b"), &self.lora_b);
        if let Some(m) = &self.magnitude {
            f(&join(prefix, "m"), m);
        }
    }

    pub(crate) fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.base.visit_params_mut(prefix, f);
        f(&join(prefix, "lora_a"), &mut self.lora_a);
        f(&join(prefix, "lora_b"), &mut self.lora_b);
        if let Some(m) = &mut self.magnitude {
            f(&join(prefix, "m"), m);
        }
    }
}

/// mlx-lm's `LoRASwitchLinear`: per-expert low-rank adapters on a switch layer,
/// `base(x, idx) + (scale * gather_mm(gather_mm(x, A^T, idx), B^T, idx)).astype(x.dtype)`.
#[derive(Debug, Clone)]
pub struct LoraSwitchLinear {
    /// The adapted experts.
    pub base: crate::switch::SwitchLinearLayer,
    /// `[num_experts, rank, input_dims]`.
    pub lora_a: Param,
    /// `[num_experts, output_dims, rank]`.
    pub lora_b: Param,
    /// The factor of the low-rank update.
    pub scale: f64,
}

impl LoraSwitchLinear {
    /// Applies the experts picked by `indices`.
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array> {
        use mlx_array::quant::gather_mm;
        let y = self.base.forward(x, indices, sorted_indices)?;
        let z = gather_mm(
            x,
            &self.lora_a.swapaxes(-1, -2)?,
            None,
            Some(indices),
            sorted_indices,
        )?;
        let z = gather_mm(
            &z,
            &self.lora_b.swapaxes(-1, -2)?,
            None,
            Some(indices),
            sorted_indices,
        )?;
        y.add(&z.multiply(self.scale)?.astype(x.dtype())?)
    }

    pub(crate) fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        self.base.visit_params(prefix, f);
        f(&join(prefix, "lora_a"), &self.lora_a);
        f(&join(prefix, "lora_b"), &self.lora_b);
    }

    pub(crate) fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.base.visit_params_mut(prefix, f);
        f(&join(prefix, "lora_a"), &mut self.lora_a);
        f(&join(prefix, "lora_b"), &mut self.lora_b);
    }
}

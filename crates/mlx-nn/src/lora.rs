//! A linear layer with a low-rank adapter, as mlx-lm runs it at inference
//! (`tuner.lora.LoRALinear`, `tuner.dora.DoRALinear`; dropout is off outside training).
use crate::linear::LinearLayer;
use crate::module::{join, Module, Param};
use mlx_array::{random, Array, Result};
use std::cell::Cell;

thread_local! {
    static TRAINING: Cell<bool> = const { Cell::new(false) };
}

/// Puts this thread's adapter layers in training mode (mlx.nn's `model.train()`) or
/// evaluation mode (`model.eval()`, the default): their dropout applies in training only.
pub fn set_training(on: bool) {
    TRAINING.with(|t| t.set(on))
}

/// mlx.nn's `Dropout(p)`: in training, `(bernoulli(1 - p, x.shape) * x) * (1 / (1 - p))`
/// with a key from MLX's global sequence; else `x`.
fn dropout(x: &Array, p: f64) -> Result<Array> {
    let keep = 1.0 - p;
    if keep == 1.0 || !TRAINING.with(|t| t.get()) {
        return Ok(x.clone());
    }
    let prob = Array::from_slice(&[keep as f32], &[])?;
    let mask = random::bernoulli(&prob, &x.shape(), None)?;
    mask.multiply(x)?.multiply(1.0 / keep)
}

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
    /// Dropout of the adapter's input in training (0: none).
    pub dropout: f64,
}

impl LoraLinear {
    /// Applies the layer.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let z = dropout(x, self.dropout)?
            .matmul(&self.lora_a)?
            .matmul(&self.lora_b)?;
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
    /// Dropout of the adapter's input in training (0: none).
    pub dropout: f64,
}

impl LoraSwitchLinear {
    /// Applies the experts picked by `indices`.
    #[track_caller]
    pub fn forward(&self, x: &Array, indices: &Array, sorted_indices: bool) -> Result<Array> {
        use mlx_array::quant::gather_mm;
        let y = self.base.forward(x, indices, sorted_indices)?;
        let z = gather_mm(
            &dropout(x, self.dropout)?,
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

/// mlx-lm's `LoRAEmbedding`: `embedding(x) + (scale * (lora_a[x] @ lora_b)).astype(y.dtype)`
/// (dropout on the low-rank rows in training), and as a tied head
/// `embedding.as_linear(x) + (scale * ((x @ lora_b^T) @ lora_a^T)).astype(x.dtype)`.
#[derive(Debug, Clone)]
pub struct LoraEmbedding {
    /// The adapted table.
    pub base: crate::embedding::EmbeddingLayer,
    /// `[num_embeddings, rank]`.
    pub lora_a: Param,
    /// `[rank, dims]`.
    pub lora_b: Param,
    /// The factor of the low-rank update.
    pub scale: f64,
    /// Dropout in training (0: none).
    pub dropout: f64,
}

impl LoraEmbedding {
    /// Looks up rows.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.base.forward(x)?;
        let z = dropout(
            &self.lora_a.take(x, Some(0))?.matmul(&self.lora_b)?,
            self.dropout,
        )?;
        y.add(&z.multiply(self.scale)?.astype(y.dtype())?)
    }

    /// Uses the adapted table as the output projection (a tied head).
    #[track_caller]
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        let y = self.base.as_linear(x)?;
        let z = dropout(x, self.dropout)?
            .matmul(&self.lora_b.transpose(None)?)?
            .matmul(&self.lora_a.transpose(None)?)?;
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

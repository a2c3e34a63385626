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

thread_local! {
    static ROW_ADAPTERS: std::cell::RefCell<Option<std::rc::Rc<[u32]>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `rows` as the adapter of each batch row (`0`: none) for this thread's
/// [`ResidentLoraLinear`] layers: the engine sets it around a model call so that rows
/// with different adapters (or none) share one forward pass. Without a selection every
/// row runs the base layer.
pub fn with_row_adapters<R>(rows: &[u32], f: impl FnOnce() -> R) -> R {
    struct Restore(Option<std::rc::Rc<[u32]>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            ROW_ADAPTERS.with(|r| *r.borrow_mut() = prev);
        }
    }
    let sel: Option<std::rc::Rc<[u32]>> = rows.iter().any(|&a| a != 0).then(|| rows.into());
    let _restore = Restore(ROW_ADAPTERS.with(|r| r.replace(sel)));
    f()
}

fn row_adapters() -> Option<std::rc::Rc<[u32]>> {
    ROW_ADAPTERS.with(|r| r.borrow().clone())
}

/// One LoRA adapter kept resident on a [`ResidentLoraLinear`].
#[derive(Debug, Clone)]
pub struct ResidentAdapter {
    /// The adapter's id (never 0, which means "no adapter").
    pub id: u32,
    /// `[input_dims, rank]`.
    pub lora_a: Param,
    /// `[rank, output_dims]`.
    pub lora_b: Param,
    /// The factor of the low-rank update.
    pub scale: f64,
}

impl ResidentAdapter {
    /// mlx-lm's `LoRALinear` update, `(scale * ((x @ lora_a) @ lora_b)).astype(x.dtype)`
    /// (evaluation mode: no dropout).
    fn update(&self, x: &Array) -> Result<Array> {
        x.matmul(&self.lora_a)?
            .matmul(&self.lora_b)?
            .multiply(self.scale)?
            .astype(x.dtype())
    }
}

/// A linear layer shared by several LoRA adapters kept resident at once, each batch row
/// picking its own (see [`with_row_adapters`]): a row with adapter `k` gets
/// `base(x) + (scale_k * ((x @ A_k) @ B_k)).astype(x.dtype)`, the ops and order of
/// [`LoraLinear`] (mlx-lm's `LoRALinear`), a row without one (or with an adapter that
/// leaves this layer alone) `base(x)`. With several adapters in one batch each present
/// adapter's update is computed for the whole batch and the rows are picked with
/// `where`, so every row holds the same values as in a batch of that adapter alone.
#[derive(Debug, Clone)]
pub struct ResidentLoraLinear {
    /// The shared layer.
    pub base: LinearLayer,
    /// The adapters on it.
    pub adapters: Vec<ResidentAdapter>,
}

impl ResidentLoraLinear {
    /// Applies the layer with this thread's row selection.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.base.forward(x)?;
        let Some(rows) = row_adapters() else {
            return Ok(y);
        };
        let present: Vec<&ResidentAdapter> = self
            .adapters
            .iter()
            .filter(|a| rows.contains(&a.id))
            .collect();
        let Some(first) = present.first() else {
            return Ok(y);
        };
        if present.len() == 1 && rows.iter().all(|&r| r == first.id) {
            return y.add(&first.update(x)?);
        }
        let b = x.dim(0)?;
        if b as usize != rows.len() {
            return Err(mlx_array::Error::InvalidArgument(format!(
                "per-row adapters: {} rows selected for an input of batch size {b}",
                rows.len()
            )));
        }
        let mut mask_shape = vec![1i32; y.ndim()];
        mask_shape[0] = b;
        let mut out = y.clone();
        for a in present {
            let pick: Vec<bool> = rows.iter().map(|&r| r == a.id).collect();
            let mask = Array::from_slice(&pick, &mask_shape)?;
            out = mlx_array::ops::where_(&mask, &y.add(&a.update(x)?)?, &out)?;
        }
        Ok(out)
    }

    /// The ids of the adapters on the layer.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.adapters.iter().map(|a| a.id)
    }

    pub(crate) fn visit_params<'a>(&'a self, prefix: &str, f: &mut dyn FnMut(&str, &'a Param)) {
        // The resident adapters are not parameters of the checkpoint: only the base's.
        self.base.visit_params(prefix, f);
    }

    pub(crate) fn visit_params_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.base.visit_params_mut(prefix, f);
    }
}

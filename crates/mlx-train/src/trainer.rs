//! mlx-lm's `tuner.trainer`: the default loss (masked next-token cross-entropy over the
//! `(offset, length]` span of each row, averaged over those tokens), `evaluate`, and the
//! training loop (validation at the first step, every `steps_per_eval` and the last;
//! gradient accumulation; reports every `steps_per_report`; adapter files every
//! `steps_per_save`), with mlx-lm's op order so the losses and the trained weights are
//! the same bits.
use crate::batches::{Batch, BatchIter, TokenDataset};
use crate::error::{Result, TrainError};
use crate::membound::{MemoryBound, StepBound};
use crate::optim::Optimizer;
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_eval::RandomState;
use mlx_models::LanguageModel;
use mlx_nn::Module;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn mlx_err(e: impl std::fmt::Display) -> mlx_array::Error {
    mlx_array::Error::InvalidArgument(e.to_string())
}

/// mlx-lm's `default_loss`: `(loss, ntoks)` of a batch (`tokens` `[B, L]`, `lengths`
/// `[B, 2]` of `(offset, length)`).
pub fn default_loss(
    model: &dyn LanguageModel,
    tokens: &Array,
    lengths: &Array,
) -> mlx_array::Result<(Array, Array)> {
    let shape = tokens.shape();
    let (b, l) = (shape[0], shape[1]);
    let inputs = tokens.slice(&[0, 0], &[b, l - 1], None)?;
    let targets = tokens.slice(&[0, 1], &[b, l], None)?;
    let logits = model.forward(&inputs, &mut []).map_err(mlx_err)?;
    let steps = ops::arange(1.0, l as f64, 1.0, Dtype::Int32)?;
    let starts = lengths.slice(&[0, 0], &[b, 1], None)?;
    let ends = lengths.slice(&[0, 1], &[b, 2], None)?;
    let mask = steps
        .greater_equal(&starts)?
        .logical_and(&steps.less_equal(&ends)?)?;
    let ce = mlx_nn::losses::cross_entropy(&logits, &targets)
        .map_err(mlx_err)?
        .multiply(&mask)?;
    let ntoks = mask.sum(None, false)?;
    let ce = ce
        .astype(Dtype::Float32)?
        .sum(None, false)?
        .divide(&ntoks)?;
    Ok((ce, ntoks))
}

/// The trainable parameters of a model, by name, in the model's order (mlx.nn's
/// `trainable_parameters()` flattened).
pub struct Trainable {
    names: Vec<String>,
    index: HashMap<String, usize>,
}

impl Trainable {
    /// The unfrozen parameters of `module`.
    pub fn of(module: &dyn Module) -> Trainable {
        let names: Vec<String> = module
            .trainable_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Trainable { names, index }
    }

    /// Their names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Their current values.
    pub fn values(&self, module: &dyn Module) -> Vec<Array> {
        let mut out: Vec<Option<Array>> = vec![None; self.names.len()];
        module.visit_params("", &mut |n, p| {
            if let Some(&i) = self.index.get(n) {
                out[i] = Some(p.value().clone());
            }
        });
        out.into_iter().flatten().collect()
    }

    /// Replaces them.
    pub fn set(&self, module: &mut dyn Module, values: &[Array]) {
        module.visit_params_mut("", &mut |n, p| {
            if let Some(&i) = self.index.get(n) {
                if let Some(v) = values.get(i) {
                    p.set(v.clone());
                }
            }
        });
    }
}

fn module_mut(model: &mut dyn LanguageModel) -> Result<&mut dyn Module> {
    let ty = model.model_type().to_string();
    model.as_module_mut().ok_or_else(|| {
        TrainError::Unsupported(format!(
            "model type `{ty}` does not expose its parameters for training"
        ))
    })
}

/// `nn.value_and_grad(model, default_loss)(model, batch)`: the loss, the token count
/// and the gradients of the trainable parameters (in [`Trainable`]'s order).
pub fn loss_value_and_grad(
    model: &mut dyn LanguageModel,
    trainable: &Trainable,
    batch: &Batch,
) -> Result<(Array, Array, Vec<Array>)> {
    let params = trainable.values(module_mut(model)?);
    let n = params.len();
    let cell = RefCell::new(model);
    let f = |inputs: &[Array]| -> mlx_array::Result<Vec<Array>> {
        let mut m = cell.borrow_mut();
        let module = m
            .as_module_mut()
            .ok_or_else(|| mlx_err("the model does not expose its parameters"))?;
        trainable.set(module, &inputs[..n]);
        let (ce, ntoks) = default_loss(&**m, &inputs[n], &inputs[n + 1])?;
        Ok(vec![ce, ntoks])
    };
    let mut inputs: Vec<&Array> = params.iter().collect();
    inputs.push(&batch.tokens);
    inputs.push(&batch.lengths);
    let argnums: Vec<i32> = (0..n as i32).collect();
    let (values, grads) = transforms::value_and_grad(f, &inputs, &argnums)?;
    let model = cell.into_inner();
    trainable.set(module_mut(model)?, &params);
    let mut values = values.into_iter();
    let (Some(loss), Some(ntoks)) = (values.next(), values.next()) else {
        return Err(TrainError::Invalid("the loss gave no value".into()));
    };
    Ok((loss, ntoks, grads))
}

/// The rest of mlx-lm's `step` after the gradients: adds the accumulated ones, and on an
/// update averages them over the accumulation steps and applies the optimizer to the
/// model's trainable parameters. Returns the gradients to carry (none after an update).
fn accumulate_and_update(
    model: &mut dyn LanguageModel,
    optimizer: &mut Optimizer,
    trainable: &Trainable,
    grads: Vec<Array>,
    prev: Option<&[Array]>,
    do_update: bool,
    accum_steps: usize,
) -> Result<Option<Vec<Array>>> {
    let mut grad = match prev {
        Some(prev) => grads
            .iter()
            .zip(prev)
            .map(|(g, p)| g.add(p))
            .collect::<mlx_array::Result<Vec<_>>>()?,
        None => grads,
    };
    if !do_update {
        return Ok(Some(grad));
    }
    if accum_steps > 1 {
        grad = grad
            .iter()
            .map(|g| g.divide(accum_steps as i32))
            .collect::<mlx_array::Result<Vec<_>>>()?;
    }
    let module = module_mut(model)?;
    let params = trainable.values(module);
    let new = optimizer.apply_gradients(&grad, &params)?;
    trainable.set(module, &new);
    Ok(None)
}

/// The model and the optimizer, shared by the training loop and the compiled step.
struct Parts<'m> {
    model: &'m mut dyn LanguageModel,
    optimizer: &'m mut Optimizer,
}

/// The compiled step's function for one `(carries gradients, updates)` variant (mlx-lm's
/// `prev_grad is not None` and `do_update`, which key its compiled traces too). Inputs:
/// the `n` trainable parameters, the `k` optimizer state arrays, tokens, lengths, then
/// the `n` carried gradients if any. Outputs: loss, token count, the new parameters, the
/// new optimizer state, then the gradients to carry when it does not update.
fn step_fn<'a>(
    cell: &'a RefCell<Parts<'_>>,
    trainable: &'a Trainable,
    k: usize,
    has_prev: bool,
    do_update: bool,
    accum_steps: usize,
) -> transforms::BorrowingFn<'a> {
    Box::new(move |inputs: &[Array]| {
        let n = trainable.names().len();
        let want = n + k + 2 + if has_prev { n } else { 0 };
        if inputs.len() != want {
            return Err(mlx_err(format!(
                "the training step got {} inputs for {want}",
                inputs.len()
            )));
        }
        let mut g = cell
            .try_borrow_mut()
            .map_err(|_| mlx_err("the model is in use during the training step"))?;
        let parts = &mut *g;
        parts
            .optimizer
            .set_state_arrays(&inputs[n..n + k])
            .map_err(mlx_err)?;
        trainable.set(module_mut(parts.model).map_err(mlx_err)?, &inputs[..n]);
        let batch = Batch {
            tokens: inputs[n + k].clone(),
            lengths: inputs[n + k + 1].clone(),
        };
        let (loss, ntoks, grads) =
            loss_value_and_grad(&mut *parts.model, trainable, &batch).map_err(mlx_err)?;
        let prev = has_prev.then(|| &inputs[n + k + 2..]);
        let carried = accumulate_and_update(
            &mut *parts.model,
            parts.optimizer,
            trainable,
            grads,
            prev,
            do_update,
            accum_steps,
        )
        .map_err(mlx_err)?;
        let mut out = vec![loss, ntoks];
        out.extend(trainable.values(module_mut(parts.model).map_err(mlx_err)?));
        out.extend(parts.optimizer.state_arrays().into_iter().cloned());
        out.extend(carried.into_iter().flatten());
        Ok(out)
    })
}

/// Whether `MLX_TRAIN_COMPILE` leaves the compiled training step on (anything but `0`).
pub fn compile_enabled() -> bool {
    std::env::var("MLX_TRAIN_COMPILE").map_or(true, |v| v.trim() != "0")
}

/// mlx-lm's `evaluate`: the token-weighted mean loss over `num_batches` batches (`-1`:
/// one pass over all), float32 as mlx-lm reads it. `progress` is called per batch.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    model: &dyn LanguageModel,
    data: &mut TokenDataset<'_>,
    batch_size: usize,
    num_batches: i64,
    max_seq_length: usize,
    rng: &mut RandomState,
    warn: &mut dyn FnMut(&str),
    progress: &mut dyn FnMut(),
) -> Result<f32> {
    // `model.eval()`: no dropout.
    mlx_nn::lora::set_training(false);
    let mut all_losses = Array::from_slice(&[0.0f32], &[])?;
    let mut ntokens = Array::from_slice(&[0i32], &[])?;
    let mut it = BatchIter::new(data, batch_size, max_seq_length, false)?;
    let mut done = 0i64;
    while num_batches < 0 || done < num_batches {
        let Some(batch) = it.next(data, rng, warn)? else {
            break;
        };
        done += 1;
        let (loss, toks) = default_loss(model, &batch.tokens, &batch.lengths)?;
        all_losses = all_losses.add(&loss.multiply(&toks)?)?;
        ntokens = ntokens.add(&toks)?;
        transforms::eval(&[&all_losses, &ntokens])?;
        progress();
    }
    Ok(all_losses.divide(&ntokens)?.item::<f32>()?)
}

/// mlx-lm's `TrainingArgs`.
#[derive(Debug, Clone)]
pub struct TrainingArgs {
    /// `batch_size`.
    pub batch_size: usize,
    /// `iters`.
    pub iters: usize,
    /// `val_batches` (`-1`: all).
    pub val_batches: i64,
    /// `steps_per_report`.
    pub steps_per_report: usize,
    /// `steps_per_eval`.
    pub steps_per_eval: usize,
    /// `steps_per_save`.
    pub steps_per_save: usize,
    /// `max_seq_length`.
    pub max_seq_length: usize,
    /// `adapter_file`: `<adapter_path>/adapters.safetensors`.
    pub adapter_file: PathBuf,
    /// `grad_accumulation_steps`.
    pub grad_accumulation_steps: usize,
    /// `clear_cache_threshold` (bytes; 0: never).
    pub clear_cache_threshold: usize,
    /// `grad_checkpoint`: every decoder layer call checkpointed (mlx-lm's
    /// `grad_checkpoint(model.layers[0])`), recomputed in the backward pass.
    pub grad_checkpoint: bool,
    /// Compile the training step (`mx.compile(step, inputs=state, outputs=state)`, as
    /// mlx-lm does). Only where no random draw happens inside it (no adapter dropout) and
    /// without `grad_checkpoint`; `MLX_TRAIN_COMPILE=0` turns it off.
    pub compile: bool,
    /// Whether the steps' queued GPU work is held to the first step's peak
    /// ([`crate::membound`]; `MLX_TRAIN_MEMORY_BOUND`).
    pub memory_bound: MemoryBound,
}

/// A training report (mlx-lm's `on_train_loss_report` fields).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// The iteration.
    pub iteration: usize,
    /// Mean training loss since the last report.
    pub train_loss: f64,
    /// The optimizer's learning rate.
    pub learning_rate: f64,
    /// Iterations per second.
    pub iterations_per_second: f64,
    /// Tokens per second.
    pub tokens_per_second: f64,
    /// Tokens trained on so far.
    pub trained_tokens: u64,
    /// Peak memory in GB.
    pub peak_memory: f64,
}

/// What the training loop tells its caller.
pub trait TrainCallback {
    /// Validation starts with `total` batches at iteration `it`.
    fn val_start(&mut self, _it: usize, _total: usize) {}
    /// One validation batch is done.
    fn val_advance(&mut self) {}
    /// A validation loss.
    fn val_loss(&mut self, it: usize, val_loss: f64, val_time: f64);
    /// A training report.
    fn train_report(&mut self, report: &TrainReport);
    /// A checkpoint was written.
    fn saved(&mut self, checkpoint: &Path);
    /// One iteration is done.
    fn advance(&mut self) {}
    /// A warning from the data (truncated rows).
    fn warning(&mut self, message: &str);
}

/// Writes the trainable parameters as mlx-lm does (`mx.save_safetensors` of the
/// flattened `trainable_parameters()`, in its order).
pub fn save_adapters(path: &Path, names: &[String], values: &[Array]) -> Result<()> {
    let order = python_order(names);
    let arrays: Vec<(&str, &Array)> = order
        .iter()
        .map(|&i| (names[i].as_str(), &values[i]))
        .collect();
    mlx_array::io::save_safetensors(path, arrays, std::iter::empty())?;
    Ok(())
}

/// mlx.nn's flattening order of our parameter names: the same, except that a DoRA
/// layer holds its magnitude `m` before `lora_a` / `lora_b` (its attribute order).
fn python_order(names: &[String]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    let layer = |i: usize| names[i].rsplit_once('.').map(|(l, _)| l.to_string());
    let mut i = 0;
    while i < order.len() {
        let n = &names[order[i]];
        if n.ends_with(".m") && i >= 2 {
            let l = layer(order[i]);
            if layer(order[i - 1]) == l && layer(order[i - 2]) == l {
                let m = order.remove(i);
                order.insert(i - 2, m);
            }
        }
        i += 1;
    }
    order
}

/// The error for a non-finite loss at iteration `it`: the loss was computed with the
/// weights after iteration `it - 1`, so the last good checkpoint is one saved before
/// that; `adapters.safetensors` is put back to it (or removed when there is none, so no
/// diverged weights are left under the name mlx-lm loads).
fn diverged(loss: f32, it: usize, saved: &[(usize, PathBuf)], adapter_file: &Path) -> TrainError {
    let good = saved.iter().rev().find(|(j, _)| j + 1 < it);
    let kept = match good {
        Some((j, p)) => match std::fs::copy(p, adapter_file) {
            Ok(_) => format!(
                "{} holds the weights of iteration {j}, the last good checkpoint ({})",
                adapter_file.display(),
                p.display()
            ),
            Err(e) => format!(
                "the last good checkpoint is {} (copying it to {} failed: {e})",
                p.display(),
                adapter_file.display()
            ),
        },
        None => {
            let _ = std::fs::remove_file(adapter_file);
            "no checkpoint before it was good, so no adapters were kept".to_string()
        }
    };
    TrainError::Diverged(format!(
        "the training loss is {loss} at iteration {it}: training stopped; {kept}. Try a lower \
         learning rate"
    ))
}

/// mlx-lm's `train`. `rng` is NumPy's global state (seeded by the caller); the model's
/// trainable parameters are the ones trained.
#[allow(clippy::too_many_arguments)]
pub fn train(
    model: &mut dyn LanguageModel,
    optimizer: &mut Optimizer,
    train_set: &mut TokenDataset<'_>,
    val_set: Option<&mut TokenDataset<'_>>,
    args: &TrainingArgs,
    rng: &mut RandomState,
    cb: &mut dyn TrainCallback,
) -> Result<()> {
    let accum_steps = args.grad_accumulation_steps;
    if accum_steps < 1 {
        return Err(TrainError::Invalid(
            "grad_accumulation_steps must be at least 1".into(),
        ));
    }
    let trainable = Trainable::of(module_mut(model)?);
    if trainable.names().is_empty() {
        return Err(TrainError::Invalid(
            "the model has no trainable parameter".into(),
        ));
    }
    let mut batches = BatchIter::new(train_set, args.batch_size, args.max_seq_length, true)?;
    // `model.train()`: adapter dropout on (off again however this returns).
    struct TrainMode;
    impl Drop for TrainMode {
        fn drop(&mut self) {
            mlx_nn::lora::set_training(false);
        }
    }
    let _mode = TrainMode;
    mlx_nn::lora::set_training(true);
    // `grad_checkpoint(model.layers[0])`: the layers' calls are checkpointed from here on,
    // validation included (as mlx-lm patches the layer class); off again however this
    // returns.
    struct Checkpointing;
    impl Drop for Checkpointing {
        fn drop(&mut self) {
            // SAFETY: turning it off keeps no pointer.
            unsafe { mlx_nn::checkpoint::set_enabled(false) }
        }
    }
    let _checkpointing = args.grad_checkpoint.then(|| {
        // SAFETY: the model is borrowed mutably by this function for its whole run, so it
        // stays alive and in place while any gradient of its outputs is taken (each one
        // inside `loss_value_and_grad`), and checkpointing is off again when it returns.
        unsafe { mlx_nn::checkpoint::set_enabled(true) };
        Checkpointing
    });
    let checkpointed_before = mlx_nn::checkpoint::calls();
    let compiled = args.compile && !args.grad_checkpoint;
    if compiled {
        // The state the compiled step reads and writes has its full length from the start.
        let module = module_mut(model)?;
        let params = trainable.values(module);
        optimizer.ensure_state(&params)?;
    }
    let k = optimizer.state_arrays().len();
    let cell = RefCell::new(Parts { model, optimizer });
    let fs = if compiled {
        [(false, false), (false, true), (true, false), (true, true)]
            .into_iter()
            .map(|(has_prev, do_update)| {
                step_fn(&cell, &trainable, k, has_prev, do_update, accum_steps)
            })
            .collect()
    } else {
        Vec::new()
    };
    transforms::with_compiled(fs, false, |compiled| {
        Ok(train_loop(
            &cell,
            compiled,
            &trainable,
            k,
            checkpointed_before,
            &mut batches,
            train_set,
            val_set,
            args,
            rng,
            cb,
        ))
    })?
}

/// The loop of [`train`]; `steps` holds the compiled step's variants (none: uncompiled).
#[allow(clippy::too_many_arguments)]
fn train_loop(
    cell: &RefCell<Parts<'_>>,
    compiled: &[transforms::Closure],
    trainable: &Trainable,
    k: usize,
    checkpointed_before: usize,
    batches: &mut BatchIter,
    train_set: &mut TokenDataset<'_>,
    mut val_set: Option<&mut TokenDataset<'_>>,
    args: &TrainingArgs,
    rng: &mut RandomState,
    cb: &mut dyn TrainCallback,
) -> Result<()> {
    let accum_steps = args.grad_accumulation_steps;
    let mut losses: Option<Array> = None;
    let mut n_tokens: Option<Array> = None;
    let mut steps = 0usize;
    let mut trained_tokens = 0u64;
    let mut train_time = 0f64;
    let mut grad_accum: Option<Vec<Array>> = None;
    let mut saved: Vec<(usize, PathBuf)> = Vec::new();
    let mut bound = StepBound::start(args.memory_bound)?;
    for it in 1..=args.iters {
        let mut warnings = Vec::new();
        let batch = batches
            .next(train_set, rng, &mut |w| warnings.push(w.to_string()))?
            .ok_or_else(|| TrainError::Invalid("the training batches ran out".into()))?;
        for w in &warnings {
            cb.warning(w);
        }
        let mut tic = Instant::now();
        if let Some(val) = val_set.as_deref_mut() {
            if !val.is_empty() && (it == 1 || it % args.steps_per_eval == 0 || it == args.iters) {
                let per_pass = val.len() / args.batch_size;
                let total = if args.val_batches < 0 {
                    per_pass
                } else {
                    per_pass.min(args.val_batches as usize)
                };
                tic = Instant::now();
                cb.val_start(it, total);
                let mut warnings = Vec::new();
                let parts = cell.borrow();
                let val_loss = evaluate(
                    &*parts.model,
                    val,
                    args.batch_size,
                    args.val_batches,
                    args.max_seq_length,
                    rng,
                    &mut |w| warnings.push(w.to_string()),
                    &mut || cb.val_advance(),
                )?;
                drop(parts);
                for w in &warnings {
                    cb.warning(w);
                }
                let val_time = tic.elapsed().as_secs_f64();
                cb.val_loss(it, f64::from(val_loss), val_time);
                mlx_nn::lora::set_training(true);
                tic = Instant::now();
            }
        }
        let do_update = it % accum_steps == 0;
        let (lvalue, toks) = if compiled.is_empty() {
            let mut g = cell.borrow_mut();
            let parts = &mut *g;
            let (lvalue, toks, grads) = loss_value_and_grad(&mut *parts.model, trainable, &batch)?;
            if args.grad_checkpoint && mlx_nn::checkpoint::calls() == checkpointed_before {
                return Err(TrainError::Unsupported(format!(
                    "--grad-checkpoint: model type `{}` does not route its decoder layers \
                     through gradient checkpointing in this build; train without \
                     --grad-checkpoint",
                    parts.model.model_type()
                )));
            }
            grad_accum = accumulate_and_update(
                &mut *parts.model,
                parts.optimizer,
                trainable,
                grads,
                grad_accum.as_deref(),
                do_update,
                accum_steps,
            )?;
            (lvalue, toks)
        } else {
            let prev = grad_accum.take();
            let variant = usize::from(prev.is_some()) * 2 + usize::from(do_update);
            let step = compiled
                .get(variant)
                .ok_or_else(|| TrainError::Invalid("no compiled training step".into()))?;
            let (params, state) = {
                let mut g = cell.borrow_mut();
                let parts = &mut *g;
                let params = trainable.values(module_mut(parts.model)?);
                let state: Vec<Array> = parts
                    .optimizer
                    .state_arrays()
                    .into_iter()
                    .cloned()
                    .collect();
                (params, state)
            };
            let n = params.len();
            let mut inputs: Vec<&Array> = params.iter().chain(&state).collect();
            inputs.push(&batch.tokens);
            inputs.push(&batch.lengths);
            inputs.extend(prev.iter().flatten());
            let out = step.call(&inputs)?;
            if out.len() != 2 + n + k + if do_update { 0 } else { n } {
                return Err(TrainError::Invalid(format!(
                    "the compiled training step gave {} outputs",
                    out.len()
                )));
            }
            let mut g = cell.borrow_mut();
            let parts = &mut *g;
            trainable.set(module_mut(parts.model)?, &out[2..2 + n]);
            parts.optimizer.set_state_arrays(&out[2 + n..2 + n + k])?;
            if !do_update {
                grad_accum = Some(out[2 + n + k..].to_vec());
            }
            (out[0].clone(), out[1].clone())
        };
        losses = Some(match losses {
            Some(l) => l.add(&lvalue)?,
            None => lvalue.clone(),
        });
        n_tokens = Some(match n_tokens {
            Some(n) => n.add(&toks)?,
            None => toks,
        });
        steps += 1;
        {
            let mut g = cell.borrow_mut();
            let parts = &mut *g;
            let params = trainable.values(module_mut(parts.model)?);
            let mut all: Vec<&Array> = params.iter().collect();
            all.extend(parts.optimizer.state_arrays());
            all.extend(losses.iter());
            all.extend(n_tokens.iter());
            all.extend(grad_accum.iter().flatten());
            transforms::eval(&all)?;
        }
        if let Some(b) = bound.as_mut() {
            b.step_done()?;
        }
        if args.clear_cache_threshold > 0
            && mlx_array::memory::cache_memory() > args.clear_cache_threshold
        {
            mlx_array::memory::clear_cache();
        }
        train_time += tic.elapsed().as_secs_f64();
        let lv = lvalue.item::<f32>()?;
        if !lv.is_finite() {
            return Err(diverged(lv, it, &saved, &args.adapter_file));
        }
        cb.advance();
        if it % args.steps_per_report == 0 || it == args.iters {
            let train_loss = f64::from(
                losses
                    .take()
                    .map(|l| l.item::<f32>())
                    .transpose()?
                    .unwrap_or(0.0),
            ) / steps as f64;
            let ntok = n_tokens
                .take()
                .map(|n| n.item::<i32>())
                .transpose()?
                .unwrap_or(0) as u64;
            let learning_rate = f64::from(cell.borrow().optimizer.learning_rate().item::<f32>()?);
            trained_tokens += ntok;
            cb.train_report(&TrainReport {
                iteration: it,
                train_loss,
                learning_rate,
                iterations_per_second: args.steps_per_report as f64 / train_time,
                tokens_per_second: ntok as f64 / train_time,
                trained_tokens,
                peak_memory: mlx_array::memory::peak_memory() as f64 / 1e9,
            });
            steps = 0;
            train_time = 0.0;
        }
        if it % args.steps_per_save == 0 {
            let values = trainable.values(module_mut(cell.borrow_mut().model)?);
            save_adapters(&args.adapter_file, trainable.names(), &values)?;
            let dir = args.adapter_file.parent().unwrap_or(Path::new("."));
            let checkpoint = dir.join(format!("{it:07}_adapters.safetensors"));
            save_adapters(&checkpoint, trainable.names(), &values)?;
            cb.saved(&checkpoint);
            saved.push((it, checkpoint));
        }
    }
    let values = trainable.values(module_mut(cell.borrow_mut().model)?);
    save_adapters(&args.adapter_file, trainable.names(), &values)?;
    Ok(())
}

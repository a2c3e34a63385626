//! mlx-lm's `quant.dwq` (distilled weight quantization): a quantized student learns its
//! quantization scales and biases (and its other unfrozen parameters: the norms) from
//! the full-precision teacher's output distribution.
//!
//! - [`load_data`]: the samples (NumPy's permutation seeded with `--seed`, the first
//!   `num_samples` for training and the next 32 for validation, each truncated to
//!   `max_seq_length` tokens).
//! - [`batch_order`] / [`make_batch`]: `iterate_batches` over those samples (sorted by
//!   length, batches visited in the order of a permutation drawn after reseeding NumPy
//!   with the seed, padded to one plus a multiple of 32).
//! - [`compute_targets`]: the teacher's top-1024 logits and their indices of every batch
//!   (MLX's `argpartition`, so the same 1024 in the same order), saved as
//!   `{valid,train}/{i:010}.safetensors`.
//! - [`unfreeze_for_dwq`] and [`dwq_quantize`]: the scales and biases of affine layers of
//!   fewer than 8 bits unfrozen, float32 master copies of every trainable parameter, cast
//!   to `dtype` (bfloat16) for each forward, the temperature-2 KL divergence to the
//!   targets masked by the rows' lengths, Adam with bias correction, validation at the
//!   start, every 200 iterations and at the end.
//!
//! Single process: mlx-lm's data-parallel and pipeline runs over several ranks are not
//! ported; one process behaves as mlx-lm's with one rank.
use crate::error::{Result, TrainError};
use crate::optim::{LearningRate, Optimizer, OptimizerKind};
use crate::trainer::Trainable;
use mlx_array::quant::QuantMode;
use mlx_array::{ops, transforms, Array, Dtype};
use mlx_eval::{Dataset, Features, RandomState};
use mlx_models::LanguageModel;
use mlx_nn::Module;
use mlx_tokenizer::Tokenizer;
use std::cell::RefCell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How many logits of each position [`compute_targets`] keeps.
pub const TOP_K: i32 = 1024;

/// Validation samples [`load_data`] takes after the training ones (mlx-lm's
/// `num_valid_samples`).
pub const NUM_VALID_SAMPLES: usize = 32;

/// One sample: its tokens (already truncated) and the offset where its loss starts.
pub type Sample = (Vec<u32>, usize);

/// Options of [`dwq_quantize`] and [`compute_targets`].
#[derive(Debug, Clone)]
pub struct DwqOptions {
    /// Rows per batch.
    pub batch_size: usize,
    /// Longest row (tokens).
    pub max_seq_length: usize,
    /// NumPy's seed before each pass over a split.
    pub seed: u32,
    /// Adam's learning rate.
    pub learning_rate: f64,
    /// Gradient checkpointing of the decoder layers (mlx-lm's `grad_checkpoint`).
    pub grad_checkpoint: bool,
    /// The dtype the trained parameters are cast to for each forward and at the end.
    pub dtype: Dtype,
    /// The distillation temperature (logits are divided by it).
    pub temperature: f64,
}

impl Default for DwqOptions {
    fn default() -> Self {
        DwqOptions {
            batch_size: 4,
            max_seq_length: 1025,
            seed: 123,
            learning_rate: 1e-6,
            grad_checkpoint: false,
            dtype: Dtype::Bfloat16,
            temperature: 2.0,
        }
    }
}

/// What the run reports: whole lines (mlx-lm's `print` / `tqdm.write`) and progress bars
/// (`desc`, batches done, batches in all).
pub struct Reporter<'a> {
    /// A line of the report.
    pub line: &'a mut dyn FnMut(&str),
    /// A progress bar's state.
    pub progress: &'a mut dyn FnMut(&str, usize, usize),
}

/// mlx-lm's `load_data` after `np.random.seed(seed)`: the rows of the `train` split as
/// a dataset (text, chat or completions, as the first row says), a permutation of their
/// indices, the first `num_samples` for training, the next [`NUM_VALID_SAMPLES`] for
/// validation, each row tokenized and truncated to `max_seq_length` tokens.
pub fn load_data(
    rows: Vec<serde_json::Value>,
    source: &str,
    tokenizer: &Tokenizer,
    num_samples: usize,
    max_seq_length: usize,
    seed: u32,
) -> Result<(Vec<Sample>, Vec<Sample>)> {
    if rows.is_empty() {
        return Err(TrainError::Data(
            "Training set not found or empty. Must provide training set for fine-tuning.".into(),
        ));
    }
    let dataset = Dataset::new(rows, &Features::default(), false, source)?;
    let perm = RandomState::new(seed).permutation(dataset.len());
    let n = perm.len();
    let (a, b) = (
        num_samples.min(n),
        num_samples.saturating_add(NUM_VALID_SAMPLES).min(n),
    );
    let process = |i: usize| -> Result<Sample> {
        let (mut tokens, offset) = dataset.process(i, tokenizer)?;
        tokens.truncate(max_seq_length);
        Ok((tokens, offset))
    };
    let train = perm[..a]
        .iter()
        .map(|&i| process(i))
        .collect::<Result<Vec<_>>>()?;
    let valid = perm[a..b]
        .iter()
        .map(|&i| process(i))
        .collect::<Result<Vec<_>>>()?;
    Ok((train, valid))
}

/// `iterate_batches(data, batch_size, max_seq_length, seed=seed)`'s batches, in the order
/// it visits them: the rows' indices sorted by length (stably), cut into full batches,
/// visited in the order of `np.random.permutation` after `np.random.seed(seed)`.
pub fn batch_order(data: &[Sample], batch_size: usize, seed: u32) -> Result<Vec<Vec<usize>>> {
    if batch_size == 0 {
        return Err(TrainError::Invalid(
            "--batch-size must be at least 1".into(),
        ));
    }
    let mut idx: Vec<usize> = (0..data.len()).collect();
    idx.sort_by_key(|&i| data[i].0.len());
    if data.len() < batch_size {
        return Err(TrainError::Data(format!(
            "Dataset must have at least batch_size={batch_size} examples but only has {}.",
            data.len()
        )));
    }
    let batches: Vec<Vec<usize>> = (0..=idx.len() - batch_size)
        .step_by(batch_size)
        .map(|i| idx[i..i + batch_size].to_vec())
        .collect();
    let order = RandomState::new(seed).permutation(batches.len());
    Ok(order.into_iter().map(|i| batches[i].clone()).collect())
}

/// One batch of `iterate_batches`: the rows' tokens zero-padded to one plus a multiple
/// of 32 (at most `max_seq_length`), int32 `[B, width]`, and `(offset, length)` per row,
/// int32 `[B, 2]`.
pub fn make_batch(
    data: &[Sample],
    rows: &[usize],
    max_seq_length: usize,
) -> Result<(Array, Array)> {
    let longest = rows.iter().map(|&j| data[j].0.len()).max().unwrap_or(0);
    let width = (1 + 32 * longest.div_ceil(32)).min(max_seq_length);
    let mut tokens = vec![0i32; rows.len() * width];
    let mut lengths = Vec::with_capacity(rows.len() * 2);
    for (r, &j) in rows.iter().enumerate() {
        let (t, offset) = &data[j];
        let n = t.len().min(max_seq_length);
        for (k, &id) in t[..n].iter().enumerate() {
            tokens[r * width + k] = id as i32;
        }
        lengths.push(*offset as i32);
        lengths.push(n as i32);
    }
    let b = rows.len() as i32;
    Ok((
        Array::from_slice(&tokens, &[b, width as i32])?,
        Array::from_slice(&lengths, &[b, 2])?,
    ))
}

/// `batch[:, :-1]`.
fn inputs_of(batch: &Array) -> mlx_array::Result<Array> {
    let s = batch.shape();
    batch.slice(&[0, 0], &[s[0], s[1] - 1], None)
}

fn mlx_err(e: impl std::fmt::Display) -> mlx_array::Error {
    mlx_array::Error::InvalidArgument(e.to_string())
}

/// The file of batch `i` of a split under a target directory.
pub fn target_file(dir: &Path, split: &str, i: usize) -> PathBuf {
    dir.join(split).join(format!("{i:010}.safetensors"))
}

/// Whether `dir` holds targets (mlx-lm's test: a `*.safetensors` file in both `train/`
/// and `valid/`).
pub fn has_targets(dir: &Path) -> bool {
    let any = |split: &str| {
        std::fs::read_dir(dir.join(split)).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
    };
    dir.is_dir() && any("train") && any("valid")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// mlx-lm's `compute_dwq_targets`: for every batch of `valid` then `train` (in
/// [`batch_order`]'s order), the teacher's logits of `batch[:, :-1]`, their
/// `argpartition(kth=-1024)[..., -1024:]` indices and those logits, saved as
/// `{"logits", "indices"}` in `dir/{split}/{i:010}.safetensors`. The files are written
/// in a staging directory inside `dir` and moved into place once both splits are done,
/// so a failed run leaves no targets that look complete.
pub fn compute_targets(
    teacher: &dyn LanguageModel,
    dir: &Path,
    train: &[Sample],
    valid: &[Sample],
    opts: &DwqOptions,
    report: &mut Reporter<'_>,
) -> Result<()> {
    let vocab = teacher.vocab_size();
    if vocab < TOP_K {
        return Err(TrainError::Unsupported(format!(
            "precomputed targets keep the top {TOP_K} logits, but the model's vocabulary has \
             only {vocab} entries (run without --target-dir)"
        )));
    }
    // Both splits' batches are checked before anything is written.
    let orders = [
        (
            "valid",
            valid,
            batch_order(valid, opts.batch_size, opts.seed)?,
        ),
        (
            "train",
            train,
            batch_order(train, opts.batch_size, opts.seed)?,
        ),
    ];
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let staging = dir.join(format!(".partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    struct Cleanup<'p>(&'p Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = Cleanup(&staging);
    for (split, data, order) in &orders {
        let out = staging.join(split);
        std::fs::create_dir_all(&out).map_err(io_err(&out))?;
        let desc = format!("Computing targets for {split}");
        let total = data.len() / opts.batch_size;
        (report.progress)(&desc, 0, total);
        for (i, rows) in order.iter().enumerate() {
            let (batch, _) = make_batch(data, rows, opts.max_seq_length)?;
            let logits = teacher
                .forward(&inputs_of(&batch)?, &mut [])
                .map_err(mlx_err)?;
            logits.eval()?;
            let n = logits.dim(-1)?;
            let idx = logits.argpartition(-TOP_K, Some(-1))?;
            let s = idx.shape();
            let idx = idx.slice(&[0, 0, n - TOP_K], &[s[0], s[1], n], None)?;
            let top = logits.take_along_axis(&idx, -1)?;
            let file = target_file(&staging, split, i);
            mlx_array::io::save_safetensors(&file, [("logits", &top), ("indices", &idx)], [])?;
            (report.progress)(&desc, i + 1, total);
        }
    }
    for split in ["valid", "train"] {
        let dest = dir.join(split);
        std::fs::create_dir_all(&dest).map_err(io_err(&dest))?;
        let from = staging.join(split);
        for e in std::fs::read_dir(&from).map_err(io_err(&from))?.flatten() {
            let to = dest.join(e.file_name());
            std::fs::rename(e.path(), &to).map_err(io_err(&to))?;
        }
    }
    Ok(())
}

/// Where the targets of a batch come from.
pub enum Targets<'a> {
    /// The teacher's full logits, computed for each batch.
    Teacher(&'a dyn LanguageModel),
    /// Precomputed top-k logits and indices under a directory ([`compute_targets`]).
    Dir(PathBuf),
}

/// One batch's targets.
enum Target {
    /// Full logits.
    Full(Array),
    /// Top-k logits and their vocabulary indices.
    TopK(Array, Array),
}

impl Targets<'_> {
    fn get(&self, inputs: &Array, i: usize, split: &str) -> Result<Target> {
        match self {
            Targets::Teacher(t) => {
                let logits = t.forward(inputs, &mut []).map_err(mlx_err)?;
                logits.eval()?;
                Ok(Target::Full(logits))
            }
            Targets::Dir(dir) => {
                let file = target_file(dir, split, i);
                if !file.is_file() {
                    return Err(TrainError::Data(format!(
                        "{}: missing target file (the targets in {} were computed for other \
                         data, --batch-size or --num-samples)",
                        file.display(),
                        dir.display()
                    )));
                }
                let (mut t, _) = mlx_array::io::load_safetensors(&file)?;
                let (Some(logits), Some(indices)) = (t.remove("logits"), t.remove("indices"))
                else {
                    return Err(TrainError::Data(format!(
                        "{}: a target file needs `logits` and `indices`",
                        file.display()
                    )));
                };
                transforms::eval(&[&logits, &indices])?;
                Ok(Target::TopK(logits, indices))
            }
        }
    }
}

/// MLX's `nn.losses.kl_div_loss(log_softmax(q), log_softmax(p), axis=-1)` as mlx-lm's
/// `kl_div_loss` computes it off Metal: `sum(exp(lp) * (lp - lq), -1)`.
fn kl_div_loss(q: &Array, p: &Array) -> mlx_array::Result<Array> {
    let lq = q.subtract(&q.logsumexp(Some(&[-1]), true)?)?;
    let lp = p.subtract(&p.logsumexp(Some(&[-1]), true)?)?;
    lp.exp()?
        .multiply(&lp.subtract(&lq)?)?
        .sum(Some(&[-1]), false)
}

/// mlx-lm's DWQ `loss_fn` after the parameters are set: `(loss, ntoks)`.
fn dwq_loss(
    model: &dyn LanguageModel,
    x: &Array,
    target: &Target,
    lengths: &Array,
    scale: f64,
) -> mlx_array::Result<(Array, Array)> {
    let mut logits = model.forward(x, &mut []).map_err(mlx_err)?;
    let targets = match target {
        Target::Full(t) => t,
        Target::TopK(t, ids) => {
            logits = logits.take_along_axis(ids, -1)?;
            t
        }
    };
    let losses = kl_div_loss(&logits.multiply(scale)?, &targets.multiply(scale)?)?;
    let t = targets.dim(1)?;
    let steps = ops::arange(1.0, 1.0 + t as f64, 1.0, Dtype::Int32)?;
    let b = lengths.dim(0)?;
    let ends = lengths.slice(&[0, 1], &[b, 2], None)?;
    let mask = steps.less(&ends)?;
    let ntoks = mask.sum(None, false)?;
    let loss = mask.multiply(&losses)?.sum(None, false)?.divide(&ntoks)?;
    Ok((loss, ntoks))
}

/// The quantized layers of `module`: `(path, trains its scales and biases)`.
fn quantized_layers(module: &mut dyn Module) -> Result<Vec<(String, bool)>> {
    let mut out = Vec::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        if let Some(s) = layer.quant_spec() {
            out.push((path.to_string(), s.mode == QuantMode::Affine && s.bits < 8));
        }
        Ok(())
    })?;
    Ok(out)
}

/// mlx-lm's DWQ `unfreeze` over a loaded model: the packed `weight`, `scales` and
/// `biases` of every quantized layer frozen (mlx.nn's quantized layers freeze them),
/// then the `scales` and `biases` of affine layers of fewer than 8 bits unfrozen; every
/// other parameter keeps its state (a loaded model's are trainable: the norms, layers
/// left unquantized, and a quantized layer's `bias`, which mlx.nn's `from_linear` and
/// mlx-lm's `to_quantized` set after freezing).
pub fn unfreeze_for_dwq(module: &mut dyn Module) -> Result<()> {
    let layers = quantized_layers(module)?;
    let split = |name: &str| {
        name.rsplit_once('.')
            .map(|(o, l)| (o.to_string(), l.to_string()))
    };
    let all: HashSet<&str> = layers.iter().map(|(p, _)| p.as_str()).collect();
    let trained: HashSet<&str> = layers
        .iter()
        .filter(|(_, t)| *t)
        .map(|(p, _)| p.as_str())
        .collect();
    module.set_frozen_where(true, &|n| {
        split(n).is_some_and(|(o, l)| {
            all.contains(o.as_str()) && matches!(l.as_str(), "weight" | "scales" | "biases")
        })
    });
    module.set_frozen_where(false, &|n| {
        split(n).is_some_and(|(o, l)| {
            trained.contains(o.as_str()) && matches!(l.as_str(), "scales" | "biases")
        })
    });
    Ok(())
}

/// mlx-lm's `print_trainable_parameters` line.
pub fn trainable_parameters_line(module: &mut dyn Module) -> Result<String> {
    let total = mlx_quant::model::model_parameters(module)? as f64 / 1e6;
    let trainable = module
        .trainable_parameters()
        .iter()
        .map(|(_, a)| a.size() as u64)
        .sum::<u64>() as f64
        / 1e6;
    Ok(format!(
        "Trainable parameters: {:.3}% ({:.3}M/{:.3}M)",
        trainable * 100.0 / total,
        trainable,
        total
    ))
}

fn module_mut(model: &mut dyn LanguageModel) -> Result<&mut dyn Module> {
    let ty = model.model_type().to_string();
    model.as_module_mut().ok_or_else(|| {
        TrainError::Unsupported(format!(
            "model type `{ty}` does not expose its parameters for training"
        ))
    })
}

/// What a DWQ run ends with.
#[derive(Debug, Clone, Copy)]
pub struct DwqReport {
    /// The validation loss before training.
    pub initial_valid_loss: f64,
    /// The validation loss after training.
    pub final_valid_loss: f64,
    /// Training iterations run.
    pub iterations: usize,
}

/// Sets the trainable parameters to `params` cast to `dtype` (mlx-lm's
/// `model.update(tree_map(lambda x: x.astype(dtype), params))`).
fn set_cast(
    module: &mut dyn Module,
    trainable: &Trainable,
    params: &[Array],
    dtype: Dtype,
) -> mlx_array::Result<()> {
    let cast = params
        .iter()
        .map(|p| p.astype(dtype))
        .collect::<mlx_array::Result<Vec<_>>>()?;
    trainable.set(module, &cast);
    Ok(())
}

/// mlx-lm's `dwq_quantize`: trains the student's scales and biases (see the module
/// docs), leaving the trained parameters in `opts.dtype`.
pub fn dwq_quantize(
    student: &mut dyn LanguageModel,
    targets: &Targets<'_>,
    train: &[Sample],
    valid: &[Sample],
    opts: &DwqOptions,
    report: &mut Reporter<'_>,
) -> Result<DwqReport> {
    unfreeze_for_dwq(module_mut(student)?)?;
    let line = trainable_parameters_line(module_mut(student)?)?;
    (report.line)(&line);
    // Every batch of both splits is checked before training.
    let train_order = batch_order(train, opts.batch_size, opts.seed)?;
    let valid_order = batch_order(valid, opts.batch_size, opts.seed)?;
    struct Checkpointing;
    impl Drop for Checkpointing {
        fn drop(&mut self) {
            // SAFETY: turning it off keeps no pointer.
            unsafe { mlx_nn::checkpoint::set_enabled(false) }
        }
    }
    let _checkpointing = opts.grad_checkpoint.then(|| {
        // SAFETY: the student and the teacher are borrowed by this function for its whole
        // run, so they stay alive and in place while any gradient of their outputs is
        // taken (each inside this function), and checkpointing is off again when it
        // returns.
        unsafe { mlx_nn::checkpoint::set_enabled(true) };
        Checkpointing
    });
    let scale = 1.0 / opts.temperature;
    let trainable = Trainable::of(module_mut(student)?);
    let mut params = trainable
        .values(module_mut(student)?)
        .iter()
        .map(|p| p.astype(Dtype::Float32))
        .collect::<mlx_array::Result<Vec<_>>>()?;
    let n = params.len();
    let mut optimizer = Optimizer::new(
        OptimizerKind::Adam {
            betas: (0.9, 0.999),
            eps: 1e-8,
            bias_correction: true,
        },
        LearningRate::Constant(opts.learning_rate),
    )?;

    let validate = |student: &mut dyn LanguageModel,
                    params: &[Array],
                    it: usize,
                    report: &mut Reporter<'_>|
     -> Result<f64> {
        let (mut v_loss, mut v_tokens) = (0.0f64, 0i64);
        let desc = "Computing validation loss";
        (report.progress)(desc, 0, valid_order.len());
        for (i, rows) in valid_order.iter().enumerate() {
            let (batch, lengths) = make_batch(valid, rows, opts.max_seq_length)?;
            let x = inputs_of(&batch)?;
            let target = targets.get(&x, i, "valid")?;
            set_cast(module_mut(student)?, &trainable, params, opts.dtype)?;
            let (loss, ntoks) = dwq_loss(&*student, &x, &target, &lengths, scale)?;
            transforms::eval(&[&loss, &ntoks])?;
            let loss = f64::from(loss.astype(Dtype::Float32)?.item::<f32>()?);
            let ntoks = i64::from(ntoks.astype(Dtype::Int32)?.item::<i32>()?);
            v_tokens += ntoks;
            v_loss += loss * ntoks as f64;
            (report.progress)(desc, i + 1, valid_order.len());
        }
        let loss = v_loss / v_tokens as f64;
        (report.line)(&format!("Validation: it={it}, loss={loss:.3}"));
        Ok(loss)
    };

    let initial_valid_loss = validate(student, &params, 0, report)?;
    let (mut total_loss, mut total_tokens, mut tokens) = (0.0f64, 0i64, 0i64);
    let mut tic = Instant::now();
    let mut last_it = 0;
    let total = train.len() / opts.batch_size;
    (report.progress)("", 0, total);
    for (it, rows) in train_order.iter().enumerate() {
        last_it = it;
        let (batch, lengths) = make_batch(train, rows, opts.max_seq_length)?;
        let x = inputs_of(&batch)?;
        let target = targets.get(&x, it, "train")?;
        // `mx.value_and_grad(loss_fn)(params, ...)`.
        let (values, grads) = {
            let cell = RefCell::new(&mut *student);
            let f = |inputs: &[Array]| -> mlx_array::Result<Vec<Array>> {
                let mut m = cell.borrow_mut();
                let module = m
                    .as_module_mut()
                    .ok_or_else(|| mlx_err("the model does not expose its parameters"))?;
                set_cast(module, &trainable, &inputs[..n], opts.dtype)?;
                let (loss, ntoks) = dwq_loss(&**m, &x, &target, &lengths, scale)?;
                Ok(vec![loss, ntoks])
            };
            let inputs: Vec<&Array> = params.iter().collect();
            let argnums: Vec<i32> = (0..n as i32).collect();
            transforms::value_and_grad(f, &inputs, &argnums)?
        };
        let mut values = values.into_iter();
        let (Some(loss), Some(ntoks)) = (values.next(), values.next()) else {
            return Err(TrainError::Invalid("the loss gave no value".into()));
        };
        params = optimizer.apply_gradients(&grads, &params)?;
        let mut ev: Vec<&Array> = vec![&loss, &ntoks];
        ev.extend(params.iter());
        ev.extend(optimizer.state_arrays());
        transforms::eval(&ev)?;
        let loss = f64::from(loss.astype(Dtype::Float32)?.item::<f32>()?);
        let ntoks = i64::from(ntoks.astype(Dtype::Int32)?.item::<i32>()?);
        tokens += ntoks;
        total_loss += loss * ntoks as f64;
        (report.progress)(&format!("loss={loss:.4}"), it + 1, total);
        if (it + 1) % 20 == 0 {
            let secs = tic.elapsed().as_secs_f64();
            let toks_per_sec = tokens as f64 / secs;
            let peak_memory_gb = mlx_array::memory::peak_memory() as f64 / 1e9;
            let avg_loss = total_loss / tokens as f64;
            total_tokens += tokens;
            (report.line)(&format!(
                "it={it}, avg_loss={avg_loss:.4}, total_tokens={total_tokens}, \
                 toks_per_sec={toks_per_sec:.3}, peak_memory_gb={peak_memory_gb:.3}"
            ));
            tic = Instant::now();
            tokens = 0;
            total_loss = 0.0;
        }
        if (it + 1) % 200 == 0 {
            validate(student, &params, it, report)?;
        }
    }
    let final_valid_loss = validate(student, &params, last_it, report)?;
    if initial_valid_loss < final_valid_loss {
        (report.line)(&format!(
            "❌❌❌\n[WARNING] Final validation loss {final_valid_loss:.3} is worse than \
             initial validation loss {initial_valid_loss:.3}. Model quality will likely be \
             degraded.\n❌❌❌"
        ));
    }
    set_cast(module_mut(student)?, &trainable, &params, opts.dtype)?;
    let mut ev: Vec<Array> = Vec::new();
    module_mut(student)?.visit_params("", &mut |_, p| ev.push(p.value().clone()));
    transforms::eval(&ev.iter().collect::<Vec<_>>())?;
    Ok(DwqReport {
        initial_valid_loss,
        final_valid_loss,
        iterations: train_order.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(lens: &[usize]) -> Vec<Sample> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| ((0..n as u32).map(|t| t + i as u32).collect(), 0))
            .collect()
    }

    #[test]
    fn batches_sort_by_length_and_drop_the_remainder() {
        // Rows of 5, 3, 9, 3, 7 tokens in batches of 2: sorted (stably) 1, 3, 0, 4, 2;
        // the last row is left out.
        let data = samples(&[5, 3, 9, 3, 7]);
        let mut got = batch_order(&data, 2, 123).unwrap();
        got.sort();
        assert_eq!(got, vec![vec![0, 4], vec![1, 3]]);
        let err = batch_order(&data[..1], 2, 123).unwrap_err().to_string();
        assert_eq!(
            err,
            "Dataset must have at least batch_size=2 examples but only has 1."
        );
        assert!(batch_order(&data, 0, 123).is_err());
    }

    #[test]
    fn a_batch_pads_to_one_plus_a_multiple_of_32() {
        let data = samples(&[5, 40]);
        let (tokens, lengths) = make_batch(&data, &[0, 1], 1025).unwrap();
        assert_eq!(tokens.shape(), vec![2, 65]);
        assert_eq!(lengths.to_vec::<i32>().unwrap(), vec![0, 5, 0, 40]);
        let t = tokens.to_vec::<i32>().unwrap();
        assert_eq!(&t[..6], &[0, 1, 2, 3, 4, 0]);
        assert_eq!(&t[65..67], &[1, 2]);
        // At most max_seq_length wide, rows cut to it.
        let (tokens, lengths) = make_batch(&data, &[0, 1], 16).unwrap();
        assert_eq!(tokens.shape(), vec![2, 16]);
        assert_eq!(lengths.to_vec::<i32>().unwrap(), vec![0, 5, 0, 16]);
    }

    #[test]
    fn target_files_are_numbered_with_ten_digits() {
        let f = target_file(Path::new("t"), "train", 42);
        assert_eq!(f, Path::new("t/train/0000000042.safetensors"));
    }
}

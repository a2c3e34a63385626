//! `mlx_lm.lora`'s `run` after the model is loaded: the datasets, training
//! (`train_model`) and testing (`evaluate_model`), with mlx-lm's messages, seeds and
//! outputs.
use crate::adapters::{Adapters, FineTuneType};
use crate::batches::TokenDataset;
use crate::config::LoraArgs;
use crate::error::{Result, TrainError};
use crate::lora_layers::{make_trainable, LoraSpec};
use crate::optim::{LearningRate, Optimizer, OptimizerKind};
use crate::pyval::PyVal;
use crate::schedule::Schedule;
use crate::trainer::{evaluate, train, TrainingArgs};
use crate::ui::{header, lr_label, TextUi};
use mlx_eval::datasets::{read_jsonl, Dataset, Features};
use mlx_eval::RandomState;
use mlx_models::LanguageModel;
use mlx_nn::Module;
use mlx_tokenizer::Tokenizer;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The options checked before anything is loaded, typed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `train`.
    pub train: bool,
    /// `test`.
    pub test: bool,
    /// `fine_tune_type`.
    pub kind: FineTuneType,
    /// `num_layers`.
    pub num_layers: i64,
    /// `lora_parameters` (LoRA / DoRA).
    pub lora: Option<LoraSpec>,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// The learning rate or schedule.
    pub lr: LearningRate,
    /// The loop's arguments.
    pub training: TrainingArgs,
    /// `test_batches`.
    pub test_batches: i64,
    /// `seed`.
    pub seed: u64,
    /// `adapter_path`.
    pub adapter_path: PathBuf,
    /// `resume_adapter_file`.
    pub resume: Option<PathBuf>,
    /// `data`.
    pub data: PathBuf,
    /// `mask_prompt`.
    pub mask_prompt: bool,
    /// The row keys (`*_feature`).
    pub features: Features,
    /// `hf_dataset`: Hugging Face datasets read instead of `data`.
    pub hf: Option<Vec<crate::hf::HfDataset>>,
}

fn unsupported(m: impl Into<String>) -> TrainError {
    TrainError::Unsupported(m.into())
}

/// Reads and checks every option (a wrong type or an unsupported choice is an error
/// naming the option), before the model is loaded.
pub fn plan(args: &LoraArgs) -> Result<Plan> {
    if let Some(r) = args.opt_str("report_to")? {
        return Err(unsupported(format!(
            "--report-to {r}: reporting to wandb or swanlab needs the network, which this \
             build does not use; every report is written to <adapter-path>/metrics.jsonl \
             instead"
        )));
    }
    let kind = match args.str("fine_tune_type")?.as_str() {
        "lora" => FineTuneType::Lora,
        "dora" => FineTuneType::Dora,
        "full" => FineTuneType::Full,
        other => {
            return Err(TrainError::Invalid(format!(
                "Received unknown fine-tune-type {other}"
            )))
        }
    };
    let lora = if kind == FineTuneType::Full {
        None
    } else {
        let p = args.get("lora_parameters");
        if !matches!(p, PyVal::Dict(_)) {
            return Err(TrainError::Invalid(format!(
                "option lora_parameters: expected a mapping, got {}",
                p.type_name()
            )));
        }
        let Some(scale) = p.get("scale") else {
            let hint = if p.get("alpha").is_some() {
                " Found 'alpha' instead — mlx-lm's LoRA config uses 'scale', not 'alpha' \
                 (unlike some other LoRA frameworks). See LORA.md."
            } else {
                ""
            };
            return Err(TrainError::Invalid(format!(
                "LoRA config is missing required key 'scale'.{hint}"
            )));
        };
        let num = |k: &str, v: Option<&PyVal>| -> Result<f64> {
            match v {
                Some(PyVal::Int(i)) => Ok(*i as f64),
                Some(PyVal::Float(f)) => Ok(*f),
                _ => Err(TrainError::Invalid(format!(
                    "lora_parameters.{k}: expected a number"
                ))),
            }
        };
        let rank = match p.get("rank") {
            Some(PyVal::Int(r)) if *r > 0 && *r <= i32::MAX as i64 => *r as i32,
            _ => {
                return Err(TrainError::Invalid(
                    "lora_parameters.rank: expected a positive integer".into(),
                ))
            }
        };
        let keys = match p.get("keys") {
            None | Some(PyVal::None) => None,
            Some(PyVal::List(l)) => Some(
                l.iter()
                    .map(|k| match k {
                        PyVal::Str(s) => Ok(s.clone()),
                        _ => Err(TrainError::Invalid(
                            "lora_parameters.keys: expected a list of strings".into(),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
            Some(_) => {
                return Err(TrainError::Invalid(
                    "lora_parameters.keys: expected a list of strings".into(),
                ))
            }
        };
        Some(LoraSpec {
            rank,
            scale: num("scale", Some(scale))?,
            dropout: num("dropout", p.get("dropout"))?,
            keys,
        })
    };
    let name = args.str("optimizer")?.to_lowercase();
    let cfg = match args.get("optimizer_config") {
        PyVal::Dict(_) => match args.get("optimizer_config").get(&name) {
            None | Some(PyVal::None) => serde_json::Map::new(),
            Some(v @ PyVal::Dict(_)) => match v.to_json() {
                serde_json::Value::Object(m) => m,
                _ => serde_json::Map::new(),
            },
            Some(v) => {
                return Err(TrainError::Invalid(format!(
                    "option optimizer_config.{name}: expected a mapping, got {}",
                    v.type_name()
                )))
            }
        },
        v => {
            return Err(TrainError::Invalid(format!(
                "option optimizer_config: expected a mapping, got {}",
                v.type_name()
            )))
        }
    };
    let optimizer = OptimizerKind::parse(&name, &cfg)?;
    let lr = match args.get("lr_schedule") {
        PyVal::None => LearningRate::Constant(args.float("learning_rate")?),
        s => LearningRate::Scheduled(Schedule::from_config(&s.to_json())?),
    };
    let adapter_path = PathBuf::from(args.str("adapter_path")?);
    let training = TrainingArgs {
        batch_size: args.positive("batch_size")?,
        iters: args.count("iters")?,
        val_batches: args.int("val_batches")?,
        steps_per_report: args.positive("steps_per_report")?,
        steps_per_eval: args.positive("steps_per_eval")?,
        steps_per_save: args.positive("save_every")?,
        max_seq_length: args.positive("max_seq_length")?,
        adapter_file: adapter_path.join("adapters.safetensors"),
        grad_accumulation_steps: args.positive("grad_accumulation_steps")?,
        clear_cache_threshold: args.count("clear_cache_threshold")?,
        grad_checkpoint: args.flag("grad_checkpoint")?,
        // Adapter dropout draws from the global random state, which the compiled step
        // does not carry yet: such a run is not compiled.
        compile: crate::trainer::compile_enabled()
            && lora.as_ref().is_none_or(|l| l.dropout == 0.0),
        memory_bound: crate::membound::MemoryBound::from_env()?,
    };
    let feature = |k: &str, d: &str| -> Result<String> {
        match args.get(k) {
            PyVal::None => Ok(d.to_string()),
            _ => args.str(k),
        }
    };
    let seed = args.int("seed")?;
    Ok(Plan {
        train: args.flag("train")?,
        test: args.flag("test")?,
        kind,
        num_layers: args.int("num_layers")?,
        lora,
        optimizer,
        lr,
        training,
        test_batches: args.int("test_batches")?,
        // NumPy's `np.random.seed` takes 0 ..= 2**32 - 1.
        seed: u32::try_from(seed).map(u64::from).map_err(|_| {
            TrainError::Invalid(format!(
                "option seed: {seed} is not between 0 and 2**32 - 1 (NumPy's seed range)"
            ))
        })?,
        adapter_path,
        resume: args.opt_str("resume_adapter_file")?.map(PathBuf::from),
        data: PathBuf::from(args.str("data")?),
        mask_prompt: args.flag("mask_prompt")?,
        features: Features {
            prompt: feature("prompt_feature", "prompt")?,
            completion: feature("completion_feature", "completion")?,
            text: feature("text_feature", "text")?,
            chat: feature("chat_feature", "messages")?,
        },
        hf: crate::hf::parse(args.get("hf_dataset"))?,
    })
}

/// mlx-lm's `load_dataset`: `hf_dataset` entries (their splits, concatenated), else a
/// local directory (`load_local_dataset`: `train`, `valid`, `test`, a missing file is
/// empty), else a Hugging Face dataset id (`load_hf_dataset`: its `train`, `valid` and
/// `test` splits). `hub` resolves a dataset id to a downloaded snapshot.
fn load_datasets(
    plan: &Plan,
    hub: Option<&crate::hf::Resolver<'_>>,
    out: &mut dyn Write,
) -> Result<[Option<Dataset>; 3]> {
    let io = |e: std::io::Error| TrainError::Io {
        path: PathBuf::from("<stdout>"),
        source: e,
    };
    let snapshot = |repo: &str| -> Result<PathBuf> {
        let hub = hub.ok_or_else(|| {
            unsupported(format!(
                "{repo}: Hugging Face datasets need the Hub, which this caller does not give"
            ))
        })?;
        hub(repo).map_err(|e| TrainError::Data(format!("Hugging Face dataset {repo}: {e}")))
    };
    let make =
        |rows: Vec<serde_json::Value>, f: &Features, source: &str| -> Result<Option<Dataset>> {
            if rows.is_empty() {
                return Ok(None);
            }
            Ok(Some(Dataset::new(rows, f, plan.mask_prompt, source)?))
        };
    if let Some(entries) = &plan.hf {
        let features = &entries[0].features;
        if entries.iter().any(|e| &e.features != features) {
            return Err(unsupported(
                "hf_dataset: a list of datasets with different *_feature keys cannot be \
                 concatenated by this build (give them the same keys)",
            ));
        }
        let mut splits: [(Vec<serde_json::Value>, Vec<String>); 3] = Default::default();
        for e in entries {
            writeln!(out, "Loading Hugging Face dataset {}.", e.path).map_err(io)?;
            let root = snapshot(&e.path)?;
            let mut take = |slot: usize, split: &str| -> Result<()> {
                let (rows, source) =
                    crate::hf::read(&root, &e.path, e.config_name.as_deref(), split)?;
                splits[slot].0.extend(rows);
                splits[slot].1.push(source);
                Ok(())
            };
            if plan.train {
                take(0, &e.train_split)?;
                take(1, &e.valid_split)?;
            }
            if plan.test {
                let split = e.test_split.as_deref().ok_or_else(|| {
                    TrainError::Invalid(format!(
                        "hf_dataset {}: --test needs its test_split",
                        e.path
                    ))
                })?;
                take(2, split)?;
            }
        }
        let [a, b, c] = splits;
        return Ok([
            make(a.0, features, &a.1.join(" + "))?,
            make(b.0, features, &b.1.join(" + "))?,
            make(c.0, features, &c.1.join(" + "))?,
        ]);
    }
    if !plan.data.exists() {
        let id = plan.data.to_string_lossy().to_string();
        let looks_like_id = {
            let parts: Vec<&str> = id.split('/').collect();
            parts.len() == 2
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && *p != "." && *p != "..")
        };
        if !looks_like_id || hub.is_none() {
            return Err(TrainError::Data(format!(
                "--data {id}: no such directory (a local dataset is a directory with \
                 train.jsonl, valid.jsonl and test.jsonl; a Hugging Face dataset is \
                 `org/name`)"
            )));
        }
        writeln!(out, "Loading Hugging Face dataset {id}.").map_err(io)?;
        let root = snapshot(&id)?;
        // `datasets` names a repo's splits `train`, `validation` and `test` (a `valid`
        // file is the `validation` split), and mlx-lm reads `dataset["valid"]`: so, as
        // there, no validation rows come from the naming conventions.
        let mut out: [Option<Dataset>; 3] = [None, None, None];
        for (slot, name) in [(0, "train"), (2, "test")] {
            if mlx_eval::hub_data::split_files(&root, name)?.is_empty() {
                continue;
            }
            let (rows, source) = crate::hf::read(&root, &id, None, name)?;
            out[slot] = make(rows, &plan.features, &source)?;
        }
        return Ok(out);
    }
    let mut out = [None, None, None];
    for (slot, name) in out.iter_mut().zip(["train", "valid", "test"]) {
        let path = plan.data.join(format!("{name}.jsonl"));
        if !path.exists() {
            continue;
        }
        let rows = read_jsonl(&path)?;
        if rows.is_empty() {
            continue;
        }
        *slot = Some(Dataset::new(
            rows,
            &plan.features,
            plan.mask_prompt,
            &path.display().to_string(),
        )?);
    }
    Ok(out)
}

/// mlx-lm's `get_total_parameters`: the parameters of the leaf modules (a module's own
/// parameters are not counted when it has submodules with parameters of their own:
/// Qwen3-Next's and Mamba's `A_log` and `dt_bias`, Gemma 4's `layer_scalar`), outside
/// adapters, a quantized weight counted as the values it packs (its scales and biases
/// not counted).
fn total_parameters(module: &mut dyn Module) -> Result<usize> {
    let mut bits: BTreeMap<String, i32> = BTreeMap::new();
    module.visit_quantizable_mut("", &mut |path, layer| {
        if let Some(spec) = layer.quant_spec() {
            bits.insert(path.to_string(), spec.bits);
        }
        Ok(())
    })?;
    // Every module above the one holding a parameter has a submodule with parameters.
    let mut inner: std::collections::BTreeSet<String> = Default::default();
    module.visit_params("", &mut |name, _| {
        let segs: Vec<&str> = name.split('.').collect();
        for k in 0..segs.len().saturating_sub(1) {
            inner.insert(segs[..k].join("."));
        }
    });
    let mut total = 0usize;
    module.visit_params("", &mut |name, p| {
        let (layer, leaf) = name.rsplit_once('.').unwrap_or(("", name));
        if matches!(leaf, "lora_a" | "lora_b" | "m") || inner.contains(layer) {
            return;
        }
        match bits.get(layer) {
            Some(&b) if leaf == "weight" => total += p.size() * 32 / b as usize,
            Some(_) if matches!(leaf, "scales" | "biases") => {}
            _ => total += p.size(),
        }
    });
    Ok(total)
}

/// mlx-lm's `load_weights(resume_adapter_file, strict=False)`, refusing names the
/// model does not have or shapes that differ (which mlx-lm would take silently).
fn resume(module: &mut dyn Module, file: &Path) -> Result<()> {
    let (weights, _) = mlx_array::io::load_safetensors(file)?;
    let shapes = module.parameter_shapes();
    let mut errors = Vec::new();
    for (k, w) in &weights {
        match shapes.get(k) {
            None => errors.push(format!("  {k}: not a parameter of the model")),
            Some(s) if *s != w.shape() => errors.push(format!(
                "  {k}: shape {:?} does not match the model's {s:?}",
                w.shape()
            )),
            _ => {}
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(format!(
            "{}:\n{}",
            file.display(),
            errors.join("\n")
        )));
    }
    module.update(weights)?;
    Ok(())
}

/// mlx-lm's `tuner.utils.load_adapters`: the adapter layers its config describes (as
/// `linear_to_lora_layers` makes them: dense, quantized and expert layers), then the
/// weights, each of which must be an adapter parameter of the model with its shape.
fn load_adapters(module: &mut dyn Module, dir: &Path) -> Result<()> {
    let adapters = Adapters::load(dir)?;
    let cfg = &adapters.config;
    let num_layers = cfg.num_layers.ok_or_else(|| TrainError::Config {
        path: dir.join("adapter_config.json"),
        message: "no num_layers".into(),
    })?;
    let spec = cfg.lora.as_ref().map(|l| LoraSpec {
        rank: l.rank as i32,
        scale: l.scale,
        // Dropout is off outside training.
        dropout: 0.0,
        keys: l.keys.clone(),
    });
    if cfg.fine_tune_type != FineTuneType::Full {
        make_trainable(module, cfg.fine_tune_type, num_layers, spec.as_ref())?;
    }
    let shapes = module.parameter_shapes();
    let mut errors = Vec::new();
    for (name, w) in &adapters.weights {
        let leaf = name.rsplit('.').next().unwrap_or("");
        let allowed =
            cfg.fine_tune_type == FineTuneType::Full || matches!(leaf, "lora_a" | "lora_b" | "m");
        match shapes.get(name) {
            Some(s) if allowed && *s != w.shape() => errors.push(format!(
                "  {name}: adapter shape {:?} does not match model parameter shape {s:?}",
                w.shape()
            )),
            Some(_) if allowed => {}
            _ => errors.push(format!("  {name}: not an adapter parameter in the model")),
        }
    }
    if !errors.is_empty() {
        return Err(TrainError::Mismatch(format!(
            "Adapter at {} contains incompatible tensors:\n{}",
            dir.display(),
            errors.join("\n")
        )));
    }
    module.update(adapters.weights)?;
    Ok(())
}

fn module_of(model: &mut dyn LanguageModel) -> Result<&mut dyn Module> {
    let ty = model.model_type().to_string();
    model
        .as_module_mut()
        .ok_or_else(|| unsupported(format!("model type `{ty}` does not expose its parameters")))
}

/// Everything after loading: datasets, then training and/or testing. `args` is the
/// merged namespace (`lora_parameters` becomes `None` for a full fine-tune, as in
/// mlx-lm); `out` gets the report.
pub fn run(
    args: &mut LoraArgs,
    plan: &Plan,
    model: &mut dyn LanguageModel,
    tokenizer: &Tokenizer,
    hub: Option<&crate::hf::Resolver<'_>>,
    out: &mut dyn Write,
) -> Result<()> {
    let io = |e: std::io::Error| TrainError::Io {
        path: PathBuf::from("<stdout>"),
        source: e,
    };
    let mut rng = RandomState::new(plan.seed as u32);
    writeln!(out, "Loading datasets").map_err(io)?;
    let [train_set, valid_set, test_set] = load_datasets(plan, hub, out)?;
    if plan.train && train_set.is_none() {
        return Err(TrainError::Data(
            "Training set not found or empty. Must provide training set for fine-tuning.".into(),
        ));
    }
    if plan.train && valid_set.is_none() {
        writeln!(
            out,
            "Warning: Validation set not found or empty. Training will proceed without \
             validation."
        )
        .map_err(io)?;
    }
    if plan.test && test_set.is_none() {
        return Err(TrainError::Data(
            "Test set not found or empty. Must provide test set for evaluation.".into(),
        ));
    }
    if plan.test && !plan.train {
        if !plan.adapter_path.as_os_str().is_empty() {
            load_adapters(module_of(model)?, &plan.adapter_path)?;
        }
    } else if plan.train {
        writeln!(out, "Training").map_err(io)?;
        let Some(train_data) = &train_set else {
            return Err(TrainError::Data("no training set".into()));
        };
        train_model(
            args,
            plan,
            model,
            tokenizer,
            train_data,
            valid_set.as_ref(),
            &mut rng,
            out,
        )?;
    } else {
        return Err(TrainError::Invalid(
            "Must provide at least one of --train or --test".into(),
        ));
    }
    if plan.test {
        writeln!(out, "Testing").map_err(io)?;
        let Some(test_data) = &test_set else {
            return Err(TrainError::Data("no test set".into()));
        };
        let mut test = TokenDataset::new(test_data, tokenizer);
        let loss = evaluate(
            &*model,
            &mut test,
            plan.training.batch_size,
            plan.test_batches,
            plan.training.max_seq_length,
            &mut rng,
            &mut |w| {
                let _ = writeln!(out, "{w}");
            },
            &mut || {},
        )?;
        let loss = f64::from(loss);
        writeln!(
            out,
            "Test loss {}, Test ppl {}.",
            crate::pyval::py_fixed(loss, 3),
            crate::pyval::py_fixed(loss.exp(), 3)
        )
        .map_err(io)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn train_model(
    args: &mut LoraArgs,
    plan: &Plan,
    model: &mut dyn LanguageModel,
    tokenizer: &Tokenizer,
    train_data: &Dataset,
    valid_data: Option<&Dataset>,
    rng: &mut RandomState,
    out: &mut dyn Write,
) -> Result<()> {
    let io = |e: std::io::Error| TrainError::Io {
        path: PathBuf::from("<stdout>"),
        source: e,
    };
    mlx_array::random::seed(plan.seed)?;
    let module = module_of(model)?;
    make_trainable(module, plan.kind, plan.num_layers, plan.lora.as_ref())?;
    if plan.kind == FineTuneType::Full {
        args.set("lora_parameters", PyVal::None);
    }
    if let Some(file) = &plan.resume {
        writeln!(out, "Loading fine-tuned weights from {}", file.display()).map_err(io)?;
        resume(module, file)?;
    }
    let type_label = match (&plan.lora, plan.kind) {
        (Some(l), k) => format!(
            "{} · {} layers · rank {}",
            k.name(),
            plan.num_layers,
            l.rank
        ),
        (None, _) => format!("full · {} layers", plan.num_layers),
    };
    // mlx-lm shows `learning_rate` whenever it is a number, even under a schedule.
    let lr = match args.get("learning_rate") {
        PyVal::Int(i) => Some(*i as f64),
        PyVal::Float(f) => Some(*f),
        _ => None,
    };
    let rows = [
        ("model", args.str("model")?),
        ("type", type_label),
        ("dataset", args.str("data")?),
        (
            "optimizer",
            format!("{} · lr {}", args.str("optimizer")?, lr_label(lr)),
        ),
        (
            "batch · iters",
            format!(
                "{} · {}",
                plan.training.batch_size,
                crate::pyval::py_thousands(plan.training.iters as i64)
            ),
        ),
        (
            "max seq",
            crate::pyval::py_thousands(plan.training.max_seq_length as i64),
        ),
    ];
    write!(out, "{}", header(&rows)).map_err(io)?;
    let total = total_parameters(module)? as f64 / 1e6;
    let trainable = module
        .trainable_parameters()
        .iter()
        .map(|(_, a)| a.size())
        .sum::<usize>() as f64
        / 1e6;
    writeln!(
        out,
        "Trainable parameters: {:.3}% ({trainable:.3}M/{total:.3}M)",
        trainable * 100.0 / total
    )
    .map_err(io)?;
    std::fs::create_dir_all(&plan.adapter_path).map_err(|source| TrainError::Io {
        path: plan.adapter_path.clone(),
        source,
    })?;
    let cfg_path = plan.adapter_path.join("adapter_config.json");
    std::fs::write(&cfg_path, args.adapter_config_json()).map_err(|source| TrainError::Io {
        path: cfg_path.clone(),
        source,
    })?;
    let mut optimizer = Optimizer::new(plan.optimizer.clone(), plan.lr.clone())?;
    let mut train_set = TokenDataset::new(train_data, tokenizer);
    let mut valid_set = valid_data.map(|v| TokenDataset::new(v, tokenizer));
    let metrics = plan.adapter_path.join("metrics.jsonl");
    let mut ui = TextUi::new(&mut *out, plan.training.iters, Some(&metrics)).map_err(|source| {
        TrainError::Io {
            path: metrics.clone(),
            source,
        }
    })?;
    let result = train(
        model,
        &mut optimizer,
        &mut train_set,
        valid_set.as_mut(),
        &plan.training,
        rng,
        &mut ui,
    );
    ui.finish();
    result
}

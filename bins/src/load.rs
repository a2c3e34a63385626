//! Loading a model and its tokenizer the way mlx-lm's `utils.load` does, plus the small
//! checks the generation commands share.
use anyhow::{bail, Context, Result};
use mlx_array::{Device, DeviceType};
use mlx_engine::KvQuantization;
use mlx_models::LanguageModel;
use mlx_nn::KvCache;
use mlx_tokenizer::Tokenizer;
use std::path::PathBuf;

/// What to load.
pub struct LoadArgs<'a> {
    /// `--model`: a directory, an HF cache id, a `.gguf` file, or `None` for the default.
    pub model: Option<&'a str>,
    /// How quantized weights run on the CPU.
    pub cpu_weights: CpuWeights,
    /// `--adapter-path`: adapters (as `mlx_lm.lora` writes them) applied unfused.
    pub adapter_path: Option<&'a str>,
}

/// The flags that choose how a quantized model runs on the CPU. By default it stays
/// quantized, as in mlx-lm: same arithmetic, same tokens. `--cpu-dequantize` trades
/// that for speed: the weights are dequantized to float32 once at load (about 6x the
/// memory of 4-bit weights, faster decoding on the CPU, different bits from mlx-lm).
/// No effect on other devices or on models that are not quantized.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct CpuWeights {
    /// On the CPU, dequantize a quantized model to float32 at load: faster decoding,
    /// ~6x the memory of 4-bit weights, and tokens that may differ from mlx-lm's
    /// (default: keep it quantized, with mlx-lm's arithmetic).
    #[arg(long)]
    pub cpu_dequantize: bool,
    /// Keep a quantized model quantized on the CPU: the default, accepted for scripts
    /// written before `--cpu-dequantize` existed.
    #[arg(long, hide = true, conflicts_with = "cpu_dequantize")]
    pub keep_quantized: bool,
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    /// The model.
    pub model: Box<dyn LanguageModel>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Where it was loaded from.
    pub path: PathBuf,
}

/// Resolves `--model`, loads weights and tokenizer.
pub fn load(args: &LoadArgs<'_>) -> Result<Loaded> {
    let path = mlx_hub::resolve_model(args.model)?;
    let on_cpu = Device::default_device()?.kind == DeviceType::Cpu;
    let opts = mlx_models::LoadOptions {
        dequantize: on_cpu && args.cpu_weights.cpu_dequantize,
        // MLX_FUSED_PROJECTIONS=0: every projection its own matmul (for A/B runs). Adapted
        // layers run on their own too.
        unfused: args.adapter_path.is_some()
            || std::env::var("MLX_FUSED_PROJECTIONS").is_ok_and(|v| v == "0"),
        ..Default::default()
    };
    let (mut model, _config) = mlx_models::load_model_with(&path, &opts)
        .with_context(|| format!("loading the model in {}", path.display()))?;
    let tokenizer = Tokenizer::from_dir(&path)
        .with_context(|| format!("loading the tokenizer in {}", path.display()))?;
    skip_init_keys(&path)?;
    if let Some(dir) = args.adapter_path {
        apply_adapters(model.as_mut(), dir)?;
    }
    Ok(Loaded {
        model,
        tokenizer,
        path,
    })
}

/// mlx-lm's `load_adapters`: the adapted layers get their adapters (after as many key
/// draws as its `linear_to_lora_layers` takes).
fn apply_adapters(model: &mut dyn LanguageModel, dir: &str) -> Result<()> {
    let adapters = mlx_train::Adapters::load(dir)?;
    let ty = model.model_type().to_string();
    let module = model
        .as_module_mut()
        .with_context(|| format!("model type `{ty}` does not expose its layers for adapters"))?;
    for _ in 0..mlx_train::lora_init_key_draws(module, &adapters)? {
        mlx_array::random::next_key()?;
    }
    let layers = mlx_train::apply_adapters(module, &adapters)?;
    tracing::info!(adapters = dir, layers = layers.len(), "adapters applied");
    Ok(())
}

/// Keeps the LoRA adapters in `dir` resident on `model` under `id` (the server's
/// per-request `adapters`; see `mlx_train::apply_resident_adapters`), the base weights
/// untouched.
pub fn add_resident_adapters(
    model: &mut dyn LanguageModel,
    dir: &str,
    id: u32,
) -> Result<(), mlx_server::pool::AdapterError> {
    use mlx_server::pool::AdapterError;
    use mlx_train::TrainError;
    let adapters = mlx_train::Adapters::load(dir).map_err(|e| match &e {
        TrainError::Io { .. } => AdapterError::NotFound(e.to_string()),
        TrainError::Config { path, .. } if !path.exists() => AdapterError::NotFound(e.to_string()),
        TrainError::Config { .. } | TrainError::Mlx(_) => AdapterError::Incompatible(e.to_string()),
        _ => AdapterError::Failed(e.to_string()),
    })?;
    let ty = model.model_type().to_string();
    let Some(module) = model.as_module_mut() else {
        return Err(AdapterError::OwnModel(format!(
            "model type `{ty}` does not expose its layers for resident adapters"
        )));
    };
    match mlx_train::apply_resident_adapters(module, &adapters, id) {
        Ok(layers) => {
            tracing::info!(
                adapters = dir,
                id,
                layers = layers.len(),
                "resident adapters added"
            );
            Ok(())
        }
        Err(e @ TrainError::Unsupported(_)) => Err(AdapterError::OwnModel(e.to_string())),
        Err(e @ TrainError::Mismatch(_)) => Err(AdapterError::Incompatible(e.to_string())),
        Err(e) => Err(AdapterError::Failed(e.to_string())),
    }
}

/// Drops the resident adapters `id` from `model` (see [`add_resident_adapters`]).
pub fn remove_resident_adapters(model: &mut dyn LanguageModel, id: u32) {
    if let Some(module) = model.as_module_mut() {
        if let Err(e) = mlx_train::remove_resident_adapters(module, id) {
            tracing::warn!(id, "removing resident adapters failed: {e}");
        }
    }
}

/// mlx-lm's commands seed MLX's global key sequence before loading, and building the
/// model takes keys from it for the random initial weights it then overwrites. Take
/// as many here, so a sampler seeded before [`load`] draws the keys mlx-lm's does.
fn skip_init_keys(path: &std::path::Path) -> Result<()> {
    let draws = mlx_models::model::mlx_lm_init_key_draws(path).with_context(|| {
        format!(
            "counting the initial-weight draws of the model in {}",
            path.display()
        )
    })?;
    for _ in 0..draws {
        mlx_array::random::next_key()?;
    }
    Ok(())
}

/// `--use-default-chat-template`: mlx-lm falls back to a ChatML template.
pub fn use_default_chat_template(tok: &mut Tokenizer) -> Result<()> {
    if !tok.has_chat_template() {
        tok.set_chat_template(CHATML);
    }
    Ok(())
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Refuses a prompt cache whose quantization differs from `--kv-bits`/`--kv-group-size`.
pub fn check_cache_kv_bits(
    caches: &[Box<dyn KvCache>],
    kv_bits: Option<i32>,
    group: i32,
) -> Result<()> {
    if let Some(q) = caches
        .first()
        .and_then(|c| c.as_any().downcast_ref::<mlx_cache::QuantizedKVCache>())
    {
        if kv_bits.is_some_and(|b| b != q.bits()) {
            bail!("--kv-bits does not match the kv cache loaded from --prompt-cache-file");
        }
        if group != q.group_size() {
            bail!("--kv-group-size does not match the kv cache loaded from --prompt-cache-file");
        }
    }
    Ok(())
}

/// The window `--max-kv-size` gives the caches, as mlx-lm's
/// `make_prompt_cache(model, max_kv_size)` decides: none for a model whose mlx-lm class
/// defines `make_cache` (llama and mistral, gemma3_text, gemma3 keep their own caches
/// and mlx-lm ignores the flag; a warning says so), else `max_kv_size` (every layer
/// then gets `RotatingKVCache(max_kv_size, keep=4)` from
/// [`mlx_cache::make_prompt_cache`]).
pub fn rotating_window(model: &dyn LanguageModel, max_kv_size: Option<i32>) -> Option<i32> {
    let max = max_kv_size?;
    if model.defines_make_cache() {
        tracing::warn!(
            "--max-kv-size {max} is ignored: {} models make their own caches (as in mlx-lm)",
            model.model_type()
        );
        return None;
    }
    Some(max)
}

/// A rotating cache keeps `max_kv_size` positions: the first 4 tokens and a sliding
/// window of the latest. A longer prompt is run as mlx-lm runs it (its beginning, past
/// the first 4 tokens, falls out of the window), with a one-line warning saying so.
/// A size below 1 is refused (mlx-lm fails on it with a shape error).
pub fn check_prompt_fits(prompt_len: usize, max_kv_size: i32) -> Result<()> {
    const KEEP: i32 = mlx_cache::MAX_KV_SIZE_KEEP;
    if max_kv_size < 1 {
        bail!("--max-kv-size must be at least 1, got {max_kv_size}");
    }
    if prompt_len > max_kv_size as usize {
        let window = if max_kv_size > KEEP {
            format!("the first {KEEP} and the last {}", max_kv_size - KEEP)
        } else {
            format!("the first {max_kv_size}, with no sliding window")
        };
        tracing::warn!(
            "the prompt has {prompt_len} tokens but --max-kv-size {max_kv_size} keeps only {window}: the rest of the prompt falls out of the attention window"
        );
    }
    Ok(())
}

/// `--kv-bits` and friends as the engine's option.
pub fn kv_quantization(bits: Option<i32>, group_size: i32, start: i32) -> Option<KvQuantization> {
    bits.map(|bits| KvQuantization {
        bits,
        group_size,
        start,
    })
}

//! `mlx-server`: mlx-lm's `mlx_lm.server` (OpenAI-compatible HTTP API) with its flags
//! and defaults, plus Anthropic Messages, the Responses API, API keys and limits.
use anyhow::Context;
use clap::Parser;
use mlx_bins::load::{load, use_default_chat_template, LoadArgs};
use mlx_server::pool::{
    AdapterError, AllowedModels, LoadError, LoadedModel, ModelLoader, ModelSpec, PoolConfig,
};
use mlx_server::ServerConfig;
use serde_json::Value as Json;
use std::process::ExitCode;

/// MLX Http Server.
#[derive(Parser, Debug)]
#[command(name = "mlx-server", version)]
struct Args {
    /// The path to the MLX model weights, tokenizer, and config (a directory, a Hugging
    /// Face repo in the local cache, or a .gguf file). Default: SmolLM2-135M-Instruct.
    #[arg(long)]
    model: Option<String>,
    /// Optional path for the trained adapter weights and config.
    #[arg(long)]
    adapter_path: Option<String>,
    /// Host for the HTTP server (default: 127.0.0.1)
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port for the HTTP server (default: 8080)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Allowed origins, comma separated (default: *)
    #[arg(long, default_value = "*")]
    allowed_origins: String,
    /// A model to be used for speculative decoding.
    #[arg(long)]
    draft_model: Option<String>,
    /// Number of tokens to draft when using speculative decoding.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    num_draft_tokens: i64,
    /// Requests speculating with the draft model go on without drafts (not in mlx-lm)
    /// once fewer than this share (0 to 1) of the drafts of their last 8 rounds were
    /// accepted; 0: never (a prediction's drafts are verified only when they pay)
    #[arg(long, value_name = "F", default_value_t = mlx_server::config::DEFAULT_DRAFT_MIN_ACCEPTANCE, allow_negative_numbers = true)]
    draft_min_acceptance: f64,
    /// Speculating requests go on without drafts (not in mlx-lm) while more than this
    /// many requests decode at once, speculating or not; 0: never
    #[arg(long, value_name = "N", default_value_t = mlx_server::config::DEFAULT_DRAFT_MAX_BATCH as i64, allow_negative_numbers = true)]
    draft_max_batch: i64,
    /// Enable trusting remote code for tokenizer (accepted; no remote code ever runs here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Set the logging level (default: INFO; the environment variable `MLX_LOG`, a
    /// `tracing` filter, overrides it)
    #[arg(long, default_value = "INFO", value_parser = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], ignore_case = true)]
    log_level: String,
    /// Specify a chat template for the tokenizer
    #[arg(long, default_value = "")]
    chat_template: String,
    /// Use the default chat template
    #[arg(long)]
    use_default_chat_template: bool,
    /// Default sampling temperature (default: 0.0)
    #[arg(long, default_value_t = 0.0)]
    temp: f64,
    /// Default nucleus sampling top-p (default: 1.0)
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Default top-k sampling (default: 0, disables top-k)
    #[arg(long, default_value_t = 0)]
    top_k: i64,
    /// Default min-p sampling (default: 0.0, disables min-p)
    #[arg(long, default_value_t = 0.0)]
    min_p: f64,
    /// Default maximum number of tokens to generate (default: 512)
    #[arg(long, default_value_t = 512)]
    max_tokens: i64,
    /// A JSON formatted string of arguments for the tokenizer's apply_chat_template, e.g. '{"enable_thinking":false}'
    #[arg(long, default_value = "{}")]
    chat_template_args: String,
    /// When a request is batchable then decode that many requests in parallel
    #[arg(long, default_value_t = 32)]
    decode_concurrency: usize,
    /// When a request is batchable then process that many prompts in parallel
    #[arg(long, default_value_t = 8)]
    prompt_concurrency: usize,
    /// Step size for prefill processing (default: 2048)
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// Maximum number of distinct KV caches to hold in the prompt cache
    #[arg(long, default_value_t = 10)]
    prompt_cache_size: usize,
    /// Maximum size in bytes of the KV caches (e.g. 8GB)
    #[arg(long, value_parser = mlx_server::parse_size)]
    prompt_cache_bytes: Option<u64>,
    /// Number of bits for KV cache quantization (e.g., 4 or 8).
    #[arg(long)]
    kv_bits: Option<i32>,
    /// Group size for KV cache quantization (default: 64)
    #[arg(long, default_value_t = 64)]
    kv_group_size: i32,
    /// Token position to start KV cache quantization (default: 5000)
    #[arg(long, default_value_t = mlx_server::config::DEFAULT_QUANTIZED_KV_START)]
    quantized_kv_start: i32,
    /// Use pipelining instead of tensor parallelism (not yet supported).
    #[arg(long)]
    pipeline: bool,
    /// Require this key (`Authorization: Bearer` or `x-api-key`) on every route but
    /// /health [default: the MLX_SERVER_API_KEY environment variable].
    #[arg(long)]
    api_key: Option<String>,
    /// Largest request body accepted, in bytes (larger ones get 413; e.g. 16M).
    #[arg(long, default_value = "16M", value_parser = mlx_server::parse_size)]
    max_request_bytes: u64,
    /// Requests allowed to wait for a decode slot; more get 429.
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// Other models to serve: a JSON or YAML file listing them (id, path or repo id,
    /// adapters, draft_model, pinned, idle_timeout, sampling defaults); see
    /// docs/server.md. Loaded on their first request.
    #[arg(long)]
    models_config: Option<std::path::PathBuf>,
    /// Models a request may name besides the configured ones, comma separated; `*`
    /// (the default, as mlx-lm) allows any path or Hub repo id, an empty string none.
    #[arg(long, default_value = "*")]
    allowed_models: String,
    /// Bytes loaded models may take together (e.g. 24GB); least recently used models
    /// are unloaded to make room, pinned ones never [default: 3/4 of MLX's memory limit].
    #[arg(long, value_parser = mlx_server::parse_size)]
    models_memory_budget: Option<u64>,
    /// Unload a model that is not pinned after this many seconds without requests
    /// (default: never; a model's `idle_timeout` overrides it).
    #[arg(long)]
    model_idle_timeout: Option<f64>,
    /// How long a request waits for its model to load, in seconds.
    #[arg(long, default_value_t = 300.0)]
    model_load_timeout: f64,
    /// MLX's memory limit in megabytes (1e6 bytes); requests whose KV cache and
    /// activations would pass it wait or get 503, and a generation step that passes
    /// it anyway stops its largest request with 503 [default: MLX's limit, for
    /// admission only].
    #[arg(long)]
    memory_limit_mb: Option<u64>,
    /// A prompt-cache file (from mlx-cache-prompt) whose prompt is put in the prompt
    /// cache at startup.
    #[arg(long)]
    prompt_cache_file: Option<std::path::PathBuf>,
    /// Keep prompt caches on disk in this directory too, to reuse them after a restart
    /// (files in mlx-lm's prompt-cache format).
    #[arg(long)]
    prompt_cache_dir: Option<std::path::PathBuf>,
    /// Bytes of files kept in --prompt-cache-dir; the least recently used go beyond it
    /// (e.g. 20GB).
    #[arg(long, default_value = "10GB", value_parser = mlx_server::parse_size)]
    prompt_cache_disk_bytes: u64,
    /// A prompt to prefill into the prompt cache before serving: a file of text, or of
    /// chat JSON ({"messages": [...]} or a list of messages). Repeatable.
    #[arg(long)]
    warm_prompt: Vec<std::path::PathBuf>,
    /// LoRA adapters kept resident per loaded model for requests' `adapters` (ours):
    /// requests with different adapters (or none) share the base weights and its
    /// batches; the least recently used idle adapters make room. 0 loads every adapter
    /// set as a model of its own (mlx-lm reloads the model).
    #[arg(long, default_value_t = 8)]
    max_resident_adapters: usize,
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
}

/// Loads the pool's models as `--model` is loaded (same chat-template flags).
struct Loader {
    cpu_weights: mlx_bins::load::CpuWeights,
    chat_template: String,
    use_default_chat_template: bool,
}

impl Loader {
    fn load_args<'a>(&self, path: &'a str, adapters: Option<&'a str>) -> LoadArgs<'a> {
        LoadArgs {
            model: Some(path),
            cpu_weights: self.cpu_weights,
            adapter_path: adapters,
        }
    }

    /// Loads the draft model at `path` for a model whose tokenizer is `target` (the
    /// same vocabulary, as mlx-lm checks).
    fn load_draft(
        &self,
        path: &str,
        target: &mlx_tokenizer::Tokenizer,
    ) -> anyhow::Result<Box<dyn mlx_models::LanguageModel>> {
        let draft = load(&self.load_args(path, None))
            .map_err(|e| anyhow::anyhow!("loading the draft model {path}: {e:#}"))?;
        mlx_bins::speculative::check_vocab(&draft.tokenizer, target)?;
        Ok(draft.model)
    }

    fn finish(&self, loaded: mlx_bins::load::Loaded) -> anyhow::Result<LoadedModel> {
        let mut tokenizer = loaded.tokenizer;
        if !self.chat_template.is_empty() {
            tokenizer.set_chat_template(self.chat_template.clone());
        }
        if self.use_default_chat_template {
            use_default_chat_template(&mut tokenizer)?;
        }
        Ok(LoadedModel {
            model: loaded.model,
            tokenizer,
            context_length: context_length(&loaded.path),
            aliases: vec![loaded.path.display().to_string()],
            config: std::fs::read_to_string(loaded.path.join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok()),
            draft: None,
        })
    }

    /// Where `spec` is on disk, without downloading.
    fn local_dir(spec: &str) -> Option<std::path::PathBuf> {
        let p = std::path::Path::new(spec);
        if p.exists() {
            return Some(p.to_path_buf());
        }
        let loc = mlx_hub::Locations::from_env().ok()?;
        snapshot_of(&loc.hf_hub_cache, spec)
    }
}

/// The `main` snapshot of `repo_id` in the Hugging Face cache.
fn snapshot_of(cache: &std::path::Path, repo_id: &str) -> Option<std::path::PathBuf> {
    let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
    let commit = std::fs::read_to_string(repo.join("refs/main")).ok()?;
    let snap = repo.join("snapshots").join(commit.trim());
    snap.is_dir().then_some(snap)
}

impl ModelLoader for Loader {
    fn load(&self, spec: &ModelSpec) -> Result<LoadedModel, LoadError> {
        mlx_hub::resolve_model(Some(&spec.path)).map_err(|e| LoadError::NotFound(e.to_string()))?;
        load(&self.load_args(&spec.path, spec.adapter_path.as_deref()))
            .and_then(|l| {
                let draft = match &spec.draft_model {
                    Some(d) => Some(self.load_draft(d, &l.tokenizer)?),
                    None => None,
                };
                let mut m = self.finish(l)?;
                m.draft = draft;
                Ok(m)
            })
            .map_err(|e| LoadError::Failed(format!("{e:#}")))
    }

    fn keeps_adapters_resident(&self) -> bool {
        true
    }

    fn add_adapter(
        &self,
        model: &mut dyn mlx_models::LanguageModel,
        path: &str,
        id: u32,
    ) -> Result<(), AdapterError> {
        mlx_bins::load::add_resident_adapters(model, path, id)
    }

    fn remove_adapter(&self, model: &mut dyn mlx_models::LanguageModel, id: u32) {
        mlx_bins::load::remove_resident_adapters(model, id)
    }

    fn estimate_bytes(&self, spec: &ModelSpec) -> Option<u64> {
        let dir = Loader::local_dir(&spec.path)?;
        if dir.is_file() {
            return std::fs::metadata(&dir).ok().map(|m| m.len());
        }
        let bytes: u64 = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .map(|m| m.len())
            .sum();
        (bytes > 0).then_some(bytes)
    }

    /// mlx-lm's `probably_mlx_lm`: model repos whose `main` snapshot has config.json,
    /// model.safetensors.index.json and tokenizer_config.json.
    fn cached_models(&self) -> Vec<String> {
        let Ok(loc) = mlx_hub::Locations::from_env() else {
            return Vec::new();
        };
        let Ok(scan) = mlx_hub::cache_scan::scan_cache_dir(&loc.hf_hub_cache) else {
            return Vec::new();
        };
        let files = [
            "config.json",
            "model.safetensors.index.json",
            "tokenizer_config.json",
        ];
        scan.repos
            .into_iter()
            .filter(|r| r.repo_type == "model")
            .filter(|r| {
                snapshot_of(&loc.hf_hub_cache, &r.repo_id)
                    .is_some_and(|s| files.iter().all(|f| s.join(f).exists()))
            })
            .map(|r| r.repo_id)
            .collect()
    }
}

fn log_filter(level: &str) -> &'static str {
    match level.to_ascii_uppercase().as_str() {
        "DEBUG" => "debug",
        "WARNING" => "warn",
        "ERROR" | "CRITICAL" => "error",
        _ => "info",
    }
}

/// The context length in the model's config.json (`max_position_embeddings`).
fn context_length(dir: &std::path::Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: Json = serde_json::from_str(&text).ok()?;
    let get = |v: &Json| v.get("max_position_embeddings").and_then(Json::as_u64);
    get(&v)
        .or_else(|| v.get("text_config").and_then(get))
        .map(|n| n as usize)
}

/// Three quarters of MLX's memory limit (on Apple silicon derived from the device's
/// memory; on the CPU from the machine's).
fn default_models_budget() -> Option<u64> {
    let limit = mlx_array::memory::memory_limit().ok()?;
    (limit > 0 && limit < usize::MAX / 2).then(|| limit as u64 / 4 * 3)
}

fn main() -> ExitCode {
    mlx_bins::run(|| {
        let args = Args::parse();
        // Accepted for compatibility; it changes nothing here.
        let _ = args.trust_remote_code;
        mlx_bins::init_logging(Some(log_filter(&args.log_level)));
        let num_draft_tokens =
            mlx_engine::speculative::check_num_draft_tokens(args.num_draft_tokens)
                .map_err(|e| anyhow::anyhow!("--num-draft-tokens: {e}"))? as usize;
        let draft_min_acceptance =
            mlx_engine::speculative::check_min_acceptance(args.draft_min_acceptance)
                .map_err(|e| anyhow::anyhow!("--draft-min-acceptance: {e}"))?;
        let draft_max_batch =
            mlx_engine::speculative::check_max_batch(args.draft_max_batch, args.decode_concurrency)
                .map_err(|e| anyhow::anyhow!("--draft-max-batch: {e}"))?;
        mlx_bins::unsupported("--pipeline", args.pipeline)?;
        let template_args: Json = serde_json::from_str(&args.chat_template_args)
            .context("--chat-template-args is not JSON")?;
        let Json::Object(chat_template_args) = template_args else {
            anyhow::bail!("--chat-template-args must be a JSON object");
        };
        let models = match &args.models_config {
            Some(p) => mlx_server::pool::read_models_file(p).map_err(anyhow::Error::msg)?,
            None => Vec::new(),
        };
        let seconds = |flag: &str, s: f64| -> anyhow::Result<std::time::Duration> {
            std::time::Duration::try_from_secs_f64(s)
                .map_err(|_| anyhow::anyhow!("{flag} must be a number of seconds, got {s}"))
        };
        let budget = match args.models_memory_budget {
            Some(b) => Some(b),
            None => args
                .memory_limit_mb
                .map(|mb| mb.saturating_mul(1_000_000) / 4 * 3)
                .or_else(default_models_budget),
        };
        let pool_cfg = PoolConfig {
            models,
            budget_bytes: budget,
            allowed: match args.allowed_models.trim() {
                "*" => AllowedModels::Any,
                list => AllowedModels::Only(
                    list.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                ),
            },
            load_timeout: seconds("--model-load-timeout", args.model_load_timeout)?,
            idle_timeout: args
                .model_idle_timeout
                .map(|s| seconds("--model-idle-timeout", s))
                .transpose()?,
            max_resident_adapters: args.max_resident_adapters,
        };
        let loader = Loader {
            cpu_weights: args.cpu_weights,
            chat_template: args.chat_template.clone(),
            use_default_chat_template: args.use_default_chat_template,
        };
        let loaded = load(&LoadArgs {
            model: args.model.as_deref(),
            cpu_weights: args.cpu_weights,
            adapter_path: args.adapter_path.as_deref(),
        })?;
        let model_id = args.model.clone().unwrap_or_else(|| {
            loaded
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "default_model".into())
        });
        let default_path = loaded.path.clone();
        let draft = match &args.draft_model {
            Some(d) => Some(loader.load_draft(d, &loaded.tokenizer)?),
            None => None,
        };
        let mut loaded = loader.finish(loaded)?;
        loaded.draft = draft;
        let cfg = ServerConfig {
            host: args.host,
            port: args.port,
            model_id,
            model_aliases: vec![default_path.display().to_string()],
            chat_template_args,
            temp: args.temp,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            max_tokens: args.max_tokens,
            decode_concurrency: args.decode_concurrency,
            prompt_concurrency: args.prompt_concurrency,
            prefill_step_size: args.prefill_step_size,
            prompt_cache_size: args.prompt_cache_size,
            prompt_cache_bytes: args.prompt_cache_bytes,
            allowed_origins: args
                .allowed_origins
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
            api_key: args
                .api_key
                .or_else(|| std::env::var("MLX_SERVER_API_KEY").ok())
                .filter(|k| !k.is_empty()),
            max_request_bytes: usize::try_from(args.max_request_bytes).unwrap_or(usize::MAX),
            max_queue: args.max_queue,
            kv_bits: args.kv_bits,
            kv_group_size: args.kv_group_size,
            quantized_kv_start: args.quantized_kv_start,
            context_length: loaded.context_length,
            memory_limit_bytes: args.memory_limit_mb.map(|mb| mb.saturating_mul(1_000_000)),
            prompt_cache_dir: args.prompt_cache_dir,
            prompt_cache_disk_bytes: args.prompt_cache_disk_bytes,
            prompt_cache_file: args.prompt_cache_file,
            warm_prompts: args.warm_prompt,
            prompt_cache_model_key: Some(match &args.adapter_path {
                Some(a) => format!("{} + {a}", default_path.display()),
                None => default_path.display().to_string(),
            }),
            num_draft_tokens,
            draft_min_acceptance,
            draft_max_batch,
            ..Default::default()
        };
        tracing::warn!("mlx-server only implements basic security checks; put it behind a proxy before exposing it");
        let mut spec = ModelSpec::new(&cfg.model_id);
        spec.path = default_path.display().to_string();
        spec.aliases = cfg.model_aliases.clone();
        spec.adapter_path = args.adapter_path.clone();
        spec.draft_model = args.draft_model.clone();
        if let Some(b) = budget {
            tracing::info!("models memory budget: {:.3} GB", b as f64 / 1e9);
        }
        let loader: std::sync::Arc<dyn ModelLoader> = std::sync::Arc::new(loader);
        mlx_server::serve_pool_blocking(
            cfg,
            pool_cfg,
            Some((spec, loaded)),
            Some(loader),
            |addr| {
                tracing::info!("Starting httpd at {} on port {}...", addr.ip(), addr.port());
                eprintln!("mlx-server listening on http://{addr}");
            },
        )?;
        Ok(())
    })
}

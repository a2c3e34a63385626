//! `mlx-server`: mlx-lm's `mlx_lm.server` (OpenAI-compatible HTTP API) with its flags
//! and defaults, plus Anthropic Messages, the Responses API, API keys and limits.
use anyhow::Context;
use clap::Parser;
use mlx_bins::load::{load, use_default_chat_template, LoadArgs};
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
    /// A model to be used for speculative decoding (not yet supported).
    #[arg(long)]
    draft_model: Option<String>,
    /// Number of tokens to draft when using speculative decoding.
    #[arg(long, default_value_t = 3)]
    num_draft_tokens: i64,
    /// Enable trusting remote code for tokenizer (accepted; no remote code ever runs here).
    #[arg(long)]
    trust_remote_code: bool,
    /// Set the logging level (default: INFO)
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
    #[command(flatten)]
    cpu_weights: mlx_bins::load::CpuWeights,
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

fn main() -> ExitCode {
    mlx_bins::run(|| {
        let args = Args::parse();
        // Accepted for compatibility; they change nothing here.
        let _ = (args.num_draft_tokens, args.trust_remote_code);
        mlx_bins::init_logging(Some(log_filter(&args.log_level)));
        mlx_bins::unsupported("--draft-model", args.draft_model.is_some())?;
        mlx_bins::unsupported("--pipeline", args.pipeline)?;
        let template_args: Json = serde_json::from_str(&args.chat_template_args)
            .context("--chat-template-args is not JSON")?;
        let Json::Object(chat_template_args) = template_args else {
            anyhow::bail!("--chat-template-args must be a JSON object");
        };
        let loaded = load(&LoadArgs {
            model: args.model.as_deref(),
            cpu_weights: args.cpu_weights,
            adapter_path: args.adapter_path.as_deref(),
        })?;
        let mut tokenizer = loaded.tokenizer;
        if !args.chat_template.is_empty() {
            tokenizer.set_chat_template(args.chat_template.clone());
        }
        if args.use_default_chat_template {
            use_default_chat_template(&mut tokenizer)?;
        }
        let model_id = args.model.clone().unwrap_or_else(|| {
            loaded
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "default_model".into())
        });
        let cfg = ServerConfig {
            host: args.host,
            port: args.port,
            model_id,
            model_aliases: vec![loaded.path.display().to_string()],
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
            context_length: context_length(&loaded.path),
            prompt_cache_dir: args.prompt_cache_dir,
            prompt_cache_disk_bytes: args.prompt_cache_disk_bytes,
            prompt_cache_file: args.prompt_cache_file,
            warm_prompts: args.warm_prompt,
            prompt_cache_model_key: Some(match &args.adapter_path {
                Some(a) => format!("{} + {a}", loaded.path.display()),
                None => loaded.path.display().to_string(),
            }),
            ..Default::default()
        };
        tracing::warn!("mlx-server only implements basic security checks; put it behind a proxy before exposing it");
        mlx_server::serve_blocking(cfg, loaded.model, tokenizer, |addr| {
            tracing::info!("Starting httpd at {} on port {}...", addr.ip(), addr.port());
            eprintln!("mlx-server listening on http://{addr}");
        })?;
        Ok(())
    })
}

//! Server settings: mlx-lm's `mlx_lm.server` flags with their defaults, plus ours.
use serde_json::{Map, Value as Json};
use std::path::PathBuf;
use std::time::Duration;

/// mlx-lm's `DEFAULT_QUANTIZED_KV_START`.
pub const DEFAULT_QUANTIZED_KV_START: i32 = 5000;

/// Everything the server needs besides the model and tokenizer.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `--host` (default `127.0.0.1`).
    pub host: String,
    /// `--port` (default 8080; 0 picks a free port).
    pub port: u16,
    /// The model id reported by `/v1/models` and echoed when a request names none.
    pub model_id: String,
    /// Other names a request's `model` may use for the loaded model (besides
    /// `model_id` and mlx-lm's `default_model`).
    pub model_aliases: Vec<String>,
    /// `--chat-template-args`: extra chat-template variables for every request.
    pub chat_template_args: Map<String, Json>,
    /// `--temp` (default 0.0).
    pub temp: f64,
    /// `--top-p` (default 1.0).
    pub top_p: f64,
    /// `--top-k` (default 0, off).
    pub top_k: i64,
    /// `--min-p` (default 0.0, off).
    pub min_p: f64,
    /// `--max-tokens` (default 512).
    pub max_tokens: i64,
    /// `--decode-concurrency` (default 32): sequences decoding at once.
    pub decode_concurrency: usize,
    /// `--prompt-concurrency` (default 8): prompts prefilled at once.
    pub prompt_concurrency: usize,
    /// `--prefill-step-size` (default 2048).
    pub prefill_step_size: usize,
    /// `--prompt-cache-size` (default 10): cached prefixes kept.
    pub prompt_cache_size: usize,
    /// `--prompt-cache-bytes`: bound on the bytes of cached prefixes.
    pub prompt_cache_bytes: Option<u64>,
    /// `--allowed-origins` (default `*`).
    pub allowed_origins: Vec<String>,
    /// `--api-key` / `MLX_SERVER_API_KEY`: required on every route but `/health`.
    pub api_key: Option<String>,
    /// `--max-request-bytes`: larger bodies get 413.
    pub max_request_bytes: usize,
    /// `--max-queue`: requests waiting for a slot beyond this get 429.
    pub max_queue: usize,
    /// `--kv-bits`: quantize KV caches.
    pub kv_bits: Option<i32>,
    /// `--kv-group-size` (default 64).
    pub kv_group_size: i32,
    /// `--quantized-kv-start` (default 5000).
    pub quantized_kv_start: i32,
    /// The model's context length (`max_position_embeddings`); longer prompts get 400.
    pub context_length: Option<usize>,
    /// Interval of SSE keep-alive comments while a streamed request waits.
    pub keepalive_interval: Duration,
    /// `--memory-limit-mb`: MLX's memory limit, set at start, the bound requests are
    /// admitted under (default: MLX's own limit) and, when set, the limit the engine
    /// enforces on every generation step (MLX's allocators do not).
    pub memory_limit_bytes: Option<u64>,
    /// The adapters the model is served with (a request's `adapters` must name these).
    pub adapter_path: Option<String>,
    /// The resident LoRA adapter its requests run with on a shared base model (`0`:
    /// none; set by the model pool for a request's `adapters`).
    pub resident_adapter: u32,
    /// `--prompt-cache-dir` (ours): the prompt cache's disk tier.
    pub prompt_cache_dir: Option<PathBuf>,
    /// `--prompt-cache-disk-bytes` (ours, default 10 GB): bound on its files.
    pub prompt_cache_disk_bytes: u64,
    /// `--prompt-cache-file`: a file of `mlx-cache-prompt` put in the prompt cache at
    /// startup.
    pub prompt_cache_file: Option<PathBuf>,
    /// `--warm-prompt` (ours): files (text, or chat JSON) prefilled before the first
    /// request.
    pub warm_prompts: Vec<PathBuf>,
    /// What the disk tier's files are keyed by (the model path and adapter; default:
    /// the first alias, else the model id).
    pub prompt_cache_model_key: Option<String>,
    /// `--num-draft-tokens` (default 3): tokens drafted per round by the draft model.
    pub num_draft_tokens: usize,
    /// `--draft-min-acceptance` (ours, default [`DEFAULT_DRAFT_MIN_ACCEPTANCE`]): a
    /// request speculating with the draft model whose drafts' acceptance over its last 8
    /// rounds falls below this decodes plainly from there (0: never). A prediction's
    /// rows stay; each step verifies as many of their drafts as pay.
    pub draft_min_acceptance: f64,
    /// `--draft-max-batch` (ours, default [`DEFAULT_DRAFT_MAX_BATCH`]): while more rows
    /// than this decode (speculating and plain), speculating requests decode plainly
    /// from there (0: never).
    pub draft_max_batch: usize,
    /// Verify every draft (of an OpenAI prediction, or the draft model's
    /// `num_draft_tokens`) in every step (no flag: tests and embedders; by default a
    /// step verifies as many as pay, see `mlx_engine::batch::EngineOptions::
    /// prediction_drafts` and `model_drafts`).
    pub verify_all_drafts: bool,
    /// The draft model's name (`--draft-model`, or a pool model's `draft_model`) when
    /// one is loaded: requests speculate with it unless they name another (400).
    pub draft_model: Option<String>,
}

/// `--draft-min-acceptance`'s default: a row speculating at under 30% acceptance costs
/// more than it gains (no mlx-lm counterpart: mlx-lm's server does not batch with a
/// draft model); the single generator's floor for greedy decoding, the same bound.
pub const DEFAULT_DRAFT_MIN_ACCEPTANCE: f64 = mlx_engine::speculative::GREEDY_MIN_ACCEPTANCE;

/// `--draft-max-batch`'s default: 0, speculation at any batch size (today's
/// behaviour). The only GPU measurement (benchmarks/RESULTS.md, issue 19: an 8B target
/// and its 4-bit draft) has speculation below plain decoding at 1, 8 and 32 streams
/// alike, so no batch size is measured safe to speculate at: the threshold belongs to
/// the model / draft pair, and is set where one measured it pays.
pub const DEFAULT_DRAFT_MAX_BATCH: usize = 0;

/// `--prompt-cache-disk-bytes`'s default.
pub const DEFAULT_PROMPT_CACHE_DISK_BYTES: u64 = 10_000_000_000;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            model_id: "default_model".into(),
            model_aliases: Vec::new(),
            chat_template_args: Map::new(),
            temp: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            max_tokens: 512,
            decode_concurrency: 32,
            prompt_concurrency: 8,
            prefill_step_size: 2048,
            prompt_cache_size: 10,
            prompt_cache_bytes: None,
            allowed_origins: vec!["*".into()],
            api_key: None,
            max_request_bytes: 16 << 20,
            max_queue: 1024,
            kv_bits: None,
            kv_group_size: 64,
            quantized_kv_start: DEFAULT_QUANTIZED_KV_START,
            context_length: None,
            keepalive_interval: Duration::from_secs(10),
            memory_limit_bytes: None,
            adapter_path: None,
            resident_adapter: 0,
            prompt_cache_dir: None,
            prompt_cache_disk_bytes: DEFAULT_PROMPT_CACHE_DISK_BYTES,
            prompt_cache_file: None,
            warm_prompts: Vec::new(),
            prompt_cache_model_key: None,
            num_draft_tokens: 3,
            draft_min_acceptance: DEFAULT_DRAFT_MIN_ACCEPTANCE,
            draft_max_batch: DEFAULT_DRAFT_MAX_BATCH,
            verify_all_drafts: false,
            draft_model: None,
        }
    }
}

impl ServerConfig {
    /// The key of the disk tier's files.
    pub fn cache_model_key(&self) -> String {
        self.prompt_cache_model_key
            .clone()
            .or_else(|| self.model_aliases.first().cloned())
            .unwrap_or_else(|| self.model_id.clone())
    }

    /// Whether a request's `model` field names the loaded model.
    pub fn serves_model(&self, name: &str) -> bool {
        name == "default_model"
            || name == self.model_id
            || self.model_aliases.iter().any(|a| a == name)
    }

    /// Checks values that would make the server misbehave.
    pub fn validate(&self) -> Result<(), String> {
        if self.decode_concurrency == 0 {
            return Err("--decode-concurrency must be at least 1".into());
        }
        if self.prompt_concurrency == 0 {
            return Err("--prompt-concurrency must be at least 1".into());
        }
        if self.prefill_step_size == 0 {
            return Err("--prefill-step-size must be at least 1".into());
        }
        if self.max_tokens < 1 {
            return Err("--max-tokens must be at least 1".into());
        }
        if self.temp.is_nan() || self.temp < 0.0 {
            return Err("--temp must be at least 0".into());
        }
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            return Err("--top-p and --min-p must be between 0 and 1".into());
        }
        if self.top_k < 0 {
            return Err("--top-k must be at least 0".into());
        }
        if let Some(b) = self.kv_bits {
            if !(1..=8).contains(&b) {
                return Err(format!("--kv-bits must be between 1 and 8, got {b}"));
            }
        }
        if self.kv_group_size <= 0 {
            return Err("--kv-group-size must be positive".into());
        }
        if self.memory_limit_bytes == Some(0) {
            return Err("--memory-limit-mb must be positive".into());
        }
        if self.prompt_cache_size == 0
            && (self.prompt_cache_dir.is_some()
                || self.prompt_cache_file.is_some()
                || !self.warm_prompts.is_empty())
        {
            return Err(
                "--prompt-cache-dir, --prompt-cache-file and --warm-prompt need a \
                 prompt cache: --prompt-cache-size must be at least 1"
                    .into(),
            );
        }
        if self.max_request_bytes == 0 {
            return Err("--max-request-bytes must be positive".into());
        }
        Ok(())
    }
}

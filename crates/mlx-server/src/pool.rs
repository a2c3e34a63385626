//! The models a server serves: the `--model` one, the ones of a models file
//! (`--models-config`) and, as mlx-lm allows, any model a request names (restricted by
//! `--allowed-models`). Each loaded model has its own engine thread; models load
//! lazily on their first request, are unloaded least-recently-used when a load would
//! pass the memory budget (`--models-memory-budget`; pinned ones never), and after
//! their idle timeout. A request for a model that is loading waits for it (up to
//! `--model-load-timeout`); a failed load is that request's error and nothing else's.
use crate::config::ServerConfig;
use crate::engine::Engine;
use crate::error::{ApiError, ErrorKind};
use crate::http::{AppState, ModelInfo};
use crate::metrics::Metrics;
use mlx_engine::batch::EngineOptions;
use mlx_models::LanguageModel;
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Map, Value as Json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Sampling defaults of one model; absent ones are the server's flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    /// `temperature`.
    pub temp: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k`.
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `max_tokens`.
    pub max_tokens: Option<i64>,
}

/// One servable model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The id requests name and `/v1/models` lists.
    pub id: String,
    /// Where it loads from: a directory, a Hugging Face repo id or a `.gguf` file.
    pub path: String,
    /// Other names requests may use for it.
    pub aliases: Vec<String>,
    /// LoRA adapters (as `mlx_lm.lora` writes them) applied at load.
    pub adapter_path: Option<String>,
    /// A draft model for speculative decoding (loaded with the model; its requests
    /// speculate with it, batched).
    pub draft_model: Option<String>,
    /// Never unloaded to make room, nor when idle.
    pub pinned: bool,
    /// Unloaded after this long without requests (else the server's
    /// `--model-idle-timeout`).
    pub idle_timeout: Option<Duration>,
    /// Sampling defaults.
    pub defaults: SamplingDefaults,
    /// For a model served with a request's `adapters`: the id of the model they are
    /// applied to (requests name that one).
    pub base: Option<String>,
    /// Named LoRA adapters `(name, path)` a request's `adapters` may name, kept
    /// resident on this model when first asked for (a request may also give a path).
    pub resident_adapters: Vec<(String, String)>,
}

impl ModelSpec {
    /// A spec loading `path` under the id `path`, with no settings.
    pub fn new(path: &str) -> ModelSpec {
        ModelSpec {
            id: path.to_string(),
            path: path.to_string(),
            aliases: Vec::new(),
            adapter_path: None,
            draft_model: None,
            pinned: false,
            idle_timeout: None,
            defaults: SamplingDefaults::default(),
            base: None,
            resident_adapters: Vec::new(),
        }
    }

    fn answers_to(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

/// A model and its tokenizer, as a [`ModelLoader`] gives them.
pub struct LoadedModel {
    /// The model.
    pub model: Box<dyn LanguageModel>,
    /// Its tokenizer (chat template settled).
    pub tokenizer: Tokenizer,
    /// Its context length (`max_position_embeddings`): longer prompts get 400.
    pub context_length: Option<usize>,
    /// More names for it (e.g. the directory it was resolved to).
    pub aliases: Vec<String>,
    /// Its config.json (sizes for the memory admission of its requests).
    pub config: Option<Json>,
    /// The draft model of speculative decoding (the spec's `draft_model`), loaded.
    pub draft: Option<Box<dyn LanguageModel>>,
}

/// Why a model could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// There is no such model (404).
    #[error("{0}")]
    NotFound(String),
    /// It exists but did not load (500).
    #[error("{0}")]
    Failed(String),
}

/// Why adapters could not be kept resident on a loaded model.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AdapterError {
    /// There are no such adapters (404).
    #[error("{0}")]
    NotFound(String),
    /// They do not fit the model (rank, layer names or shapes; 400).
    #[error("{0}")]
    Incompatible(String),
    /// They cannot share the base model (DoRA, a full fine-tune, adapters on embeddings
    /// or experts): they load as a model of their own, as mlx-lm reloads the model.
    #[error("{0}")]
    OwnModel(String),
    /// Reading them failed otherwise (500).
    #[error("{0}")]
    Failed(String),
}

/// Loads models for the pool (the `mlx-server` binary resolves paths and Hub ids,
/// applies adapters and lists the Hugging Face cache).
pub trait ModelLoader: Send + Sync + 'static {
    /// Whether it can keep adapters resident on a loaded model
    /// ([`ModelLoader::add_adapter`]); when not (the default), a request's `adapters`
    /// load as a model of their own.
    fn keeps_adapters_resident(&self) -> bool {
        false
    }
    /// Keeps the LoRA adapters at `path` resident on `model` under `id` (on the engine
    /// thread; see `mlx_nn::lora::ResidentLoraLinear`). By default none can be:
    /// adapters load as a model of their own.
    fn add_adapter(
        &self,
        model: &mut dyn LanguageModel,
        path: &str,
        id: u32,
    ) -> Result<(), AdapterError> {
        let _ = (model, id);
        Err(AdapterError::OwnModel(format!(
            "the adapters `{path}` cannot be kept resident by this server"
        )))
    }
    /// Drops the resident adapters `id` from `model` (on the engine thread).
    fn remove_adapter(&self, model: &mut dyn LanguageModel, id: u32) {
        let _ = (model, id);
    }
    /// Loads `spec` (on a blocking thread).
    fn load(&self, spec: &ModelSpec) -> Result<LoadedModel, LoadError>;
    /// Bytes the model will take once loaded, if known before loading it (its weight
    /// files' size), for the memory budget.
    fn estimate_bytes(&self, spec: &ModelSpec) -> Option<u64>;
    /// Ids of the MLX models in the Hugging Face cache (listed by `/v1/models`).
    fn cached_models(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Which models a request may name beyond the configured ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedModels {
    /// Any (mlx-lm's behaviour): the name is loaded as a path or Hub repo id.
    Any,
    /// Only these names.
    Only(Vec<String>),
}

/// The pool's settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Configured models besides the `--model` one.
    pub models: Vec<ModelSpec>,
    /// The bytes loaded models may take together (`None`: no bound).
    pub budget_bytes: Option<u64>,
    /// Models requests may name that are not configured (given a loader).
    pub allowed: AllowedModels,
    /// How long a request waits for its model to load.
    pub load_timeout: Duration,
    /// Default idle timeout of models that are not pinned (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// LoRA adapters kept resident per loaded model for requests' `adapters`
    /// (`--max-resident-adapters`); the least recently used idle one makes room. 0: none,
    /// every adapter set loads as a model of its own (mlx-lm's reload).
    pub max_resident_adapters: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            models: Vec::new(),
            budget_bytes: None,
            allowed: AllowedModels::Any,
            load_timeout: Duration::from_secs(300),
            idle_timeout: None,
            max_resident_adapters: 8,
        }
    }
}

/// Where a model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// Not in memory.
    Unloaded,
    /// Being loaded.
    Loading,
    /// Serving.
    Loaded,
}

impl ModelState {
    /// `"unloaded"`, `"loading"` or `"loaded"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Unloaded => "unloaded",
            ModelState::Loading => "loading",
            ModelState::Loaded => "loaded",
        }
    }
}

type LoadResult = Option<Result<(), ApiError>>;

enum Slot {
    Unloaded,
    Loading(watch::Receiver<LoadResult>),
    Loaded(Arc<AppState>),
}

struct Entry {
    spec: ModelSpec,
    slot: Slot,
    last_used: Instant,
    /// Bytes charged against the budget while loading or loaded.
    bytes: u64,
    /// Configured (listed even when unloaded), as opposed to named by a request.
    configured: bool,
    /// Can be loaded again after an unload (a model handed in without a loader cannot).
    reloadable: bool,
    /// LoRA adapters resident on the loaded model.
    resident: Vec<Resident>,
}

/// LoRA adapters resident on a loaded model, with the handler state of its requests.
struct Resident {
    /// What requests name it by (a configured name or a path).
    key: String,
    /// Its id in the model's layers and the engine's prompt cache.
    id: u32,
    /// The model's state with `resident_adapter` set, sharing its engine.
    app: Arc<AppState>,
    last_used: Instant,
}

impl Resident {
    /// No request holds or runs it.
    fn idle(&self) -> bool {
        Arc::strong_count(&self.app) == 1 && self.app.engine.in_use() == 0
    }
}

/// What a request's `adapters` resolve to on a model.
enum AdapterPlan {
    /// Resident adapters (loaded now if needed).
    Resident(Arc<AppState>),
    /// Adapters that load as a model of their own (the reloading path).
    OwnModel,
}

impl Entry {
    fn state(&self) -> ModelState {
        match self.slot {
            Slot::Unloaded => ModelState::Unloaded,
            Slot::Loading(_) => ModelState::Loading,
            Slot::Loaded(_) => ModelState::Loaded,
        }
    }

    /// Loaded and neither pinned nor in use: may be unloaded.
    fn evictable(&self) -> Option<&Arc<AppState>> {
        match &self.slot {
            Slot::Loaded(app) if !self.spec.pinned && idle(app) => Some(app),
            _ => None,
        }
    }

    /// When the model was last asked for or last finished an answer.
    fn last_activity(&self) -> Instant {
        match &self.slot {
            Slot::Loaded(app) => app
                .engine
                .last_done()
                .map_or(self.last_used, |t| t.max(self.last_used)),
            _ => self.last_used,
        }
    }
}

/// No request holds the model: only the pool refers to it, and no answer is running.
fn idle(app: &Arc<AppState>) -> bool {
    Arc::strong_count(app) == 1 && app.engine.in_use() == 0
}

/// The set of served models.
pub struct Pool {
    entries: Mutex<Vec<Entry>>,
    loader: Option<Arc<dyn ModelLoader>>,
    base: ServerConfig,
    cfg: PoolConfig,
    metrics: Arc<Metrics>,
    created: u64,
    /// The next resident adapter id (never reused: prompt-cache entries are keyed by it).
    next_adapter: std::sync::atomic::AtomicU32,
    /// Resident adapters load one at a time.
    adapter_loads: tokio::sync::Mutex<()>,
}

fn lock(m: &Mutex<Vec<Entry>>) -> std::sync::MutexGuard<'_, Vec<Entry>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn gb(bytes: u64) -> String {
    format!("{:.3} GB", bytes as f64 / 1e9)
}

impl Pool {
    /// A pool serving `default` (loaded already, pinned unless its spec says otherwise is
    /// moot: the `--model` one is always pinned) and the configured models, loading
    /// others through `loader`.
    pub fn new(
        base: ServerConfig,
        cfg: PoolConfig,
        default: Option<(ModelSpec, LoadedModel)>,
        loader: Option<Arc<dyn ModelLoader>>,
        metrics: Arc<Metrics>,
    ) -> Result<Pool, crate::ServerError> {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut entries = Vec::new();
        let mut pool_cfg = cfg;
        let configured = std::mem::take(&mut pool_cfg.models);
        let pool = Pool {
            entries: Mutex::new(Vec::new()),
            loader,
            base,
            cfg: pool_cfg,
            metrics,
            created,
            next_adapter: std::sync::atomic::AtomicU32::new(1),
            adapter_loads: tokio::sync::Mutex::new(()),
        };
        if let Some((mut spec, loaded)) = default {
            spec.pinned = true;
            if !spec.aliases.iter().any(|a| a == "default_model") {
                spec.aliases.push("default_model".into());
            }
            let bytes = pool
                .loader
                .as_ref()
                .and_then(|l| l.estimate_bytes(&spec))
                .unwrap_or(0);
            let app = pool.start_engine(&spec, loaded)?;
            entries.push(Entry {
                spec,
                slot: Slot::Loaded(Arc::new(app)),
                last_used: Instant::now(),
                bytes,
                configured: true,
                reloadable: pool.loader.is_some(),
                resident: Vec::new(),
            });
        }
        for spec in configured {
            if let Some(e) = entries.iter().find(|e: &&Entry| {
                e.spec.answers_to(&spec.id) || spec.aliases.iter().any(|a| e.spec.answers_to(a))
            }) {
                return Err(crate::ServerError::Config(format!(
                    "model `{}` is configured twice (it clashes with `{}`)",
                    spec.id, e.spec.id
                )));
            }
            entries.push(Entry {
                spec,
                slot: Slot::Unloaded,
                last_used: Instant::now(),
                bytes: 0,
                configured: true,
                reloadable: pool.loader.is_some(),
                resident: Vec::new(),
            });
        }
        *lock(&pool.entries) = entries;
        Ok(pool)
    }

    /// The handler state of a loaded model: its engine (started here), tokenizer,
    /// settings with the model's sampling defaults, and facts.
    fn start_engine(
        &self,
        spec: &ModelSpec,
        loaded: LoadedModel,
    ) -> Result<AppState, crate::ServerError> {
        let LoadedModel {
            model,
            tokenizer,
            context_length,
            aliases,
            config,
            draft,
        } = loaded;
        let mut cfg = self.base.clone();
        cfg.model_id = spec.id.clone();
        cfg.model_aliases = spec.aliases.clone();
        cfg.model_aliases.extend(aliases);
        cfg.adapter_path = spec.adapter_path.clone();
        cfg.draft_model = draft.as_ref().map(|_| {
            spec.draft_model
                .clone()
                .unwrap_or_else(|| "default_model".into())
        });
        if let Some(base) = &spec.base {
            if let Some(b) = lock(&self.entries).iter().find(|e| e.spec.id == *base) {
                cfg.model_aliases.push(b.spec.id.clone());
                cfg.model_aliases.extend(b.spec.aliases.iter().cloned());
            }
        }
        let d = &spec.defaults;
        cfg.temp = d.temp.unwrap_or(cfg.temp);
        cfg.top_p = d.top_p.unwrap_or(cfg.top_p);
        cfg.top_k = d.top_k.unwrap_or(cfg.top_k);
        cfg.min_p = d.min_p.unwrap_or(cfg.min_p);
        cfg.max_tokens = d.max_tokens.unwrap_or(cfg.max_tokens);
        if context_length.is_some() {
            cfg.context_length = context_length;
        }
        // The `--model` one keeps the binary's disk-cache key (its path and adapter) and
        // `--prompt-cache-file`; every other model keys its prompt-cache files by its own
        // pool id, unique per model and adapter set.
        let is_default = spec.id == self.base.model_id;
        if !is_default {
            cfg.prompt_cache_model_key = Some(spec.id.clone());
            cfg.prompt_cache_file = None;
            cfg.warm_prompts = Vec::new();
        }
        let mut xtc: Vec<i32> = tokenizer
            .encode("\n", false)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t as i32)
            .collect();
        xtc.extend(tokenizer.eos_token_ids().iter().map(|&t| t as i32));
        let info = ModelInfo {
            tool_format: crate::prompt::detect_tool_format(&tokenizer),
            xtc_special_tokens: xtc,
            vocab_size: model.vocab_size().max(0) as usize,
            created: self.created,
            fingerprint: format!("mlx-server-{}", env!("CARGO_PKG_VERSION")),
        };
        let drafts = if cfg.verify_all_drafts {
            mlx_engine::batch::DraftWidth::All
        } else {
            mlx_engine::batch::DraftWidth::Paying
        };
        let opts = EngineOptions {
            decode_concurrency: cfg.decode_concurrency,
            prompt_concurrency: cfg.prompt_concurrency,
            prefill_step_size: cfg.prefill_step_size,
            prompt_cache_size: cfg.prompt_cache_size,
            prompt_cache_bytes: cfg.prompt_cache_bytes,
            kv_quantization: cfg.kv_bits.map(|bits| mlx_engine::KvQuantization {
                bits,
                group_size: cfg.kv_group_size,
                start: cfg.quantized_kv_start,
            }),
            max_queue: cfg.max_queue,
            memory: match (config, crate::memory::limit(cfg.memory_limit_bytes)) {
                (Some(c), Some(limit)) => {
                    crate::memory::admission(&c, limit, cfg.kv_bits, cfg.kv_group_size)
                }
                _ => None,
            },
            memory_limit: cfg.memory_limit_bytes,
            disk_cache: cfg.prompt_cache_dir.as_ref().map(|dir| {
                mlx_engine::batch::DiskCacheOptions {
                    dir: dir.clone(),
                    max_bytes: cfg.prompt_cache_disk_bytes,
                    model_key: cfg.cache_model_key(),
                }
            }),
            preload: match &cfg.prompt_cache_file {
                Some(f) => vec![crate::warm::check_prompt_cache_file(&cfg, f)?],
                None => Vec::new(),
            },
            draft_min_acceptance: cfg.draft_min_acceptance,
            draft_max_batch: cfg.draft_max_batch,
            prediction_drafts: drafts,
            model_drafts: drafts,
        };
        let engine = Engine::start(model, draft, opts, Arc::clone(self.metrics.engine()))?;
        Ok(AppState {
            cfg,
            engine,
            tokenizer: Arc::new(tokenizer),
            metrics: Arc::clone(&self.metrics),
            info,
            constraints: std::sync::OnceLock::new(),
        })
    }

    /// The server's settings (shared by all models).
    pub fn base_config(&self) -> &ServerConfig {
        &self.base
    }

    /// The pool's settings.
    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    /// Server start time (Unix seconds).
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Whether every loaded model's engine thread is running.
    pub fn is_healthy(&self) -> bool {
        lock(&self.entries).iter().all(|e| match &e.slot {
            Slot::Loaded(app) => app.engine.is_healthy(),
            _ => true,
        })
    }

    /// The state of the model answering to `name`, if known.
    pub fn state_of(&self, name: &str) -> Option<ModelState> {
        lock(&self.entries)
            .iter()
            .find(|e| e.spec.answers_to(name))
            .map(Entry::state)
    }

    /// Bytes charged against the budget by loaded and loading models.
    pub fn used_bytes(&self) -> u64 {
        lock(&self.entries)
            .iter()
            .filter(|e| e.state() != ModelState::Unloaded)
            .map(|e| e.bytes)
            .sum()
    }

    fn allowed(&self, name: &str) -> bool {
        self.loader.is_some()
            && match &self.cfg.allowed {
                AllowedModels::Any => true,
                AllowedModels::Only(list) => list.iter().any(|a| a == name),
            }
    }

    fn unknown(&self, entries: &[Entry], name: &str) -> ApiError {
        let served: Vec<String> = entries
            .iter()
            .filter(|e| e.configured)
            .map(|e| format!("`{}`", e.spec.id))
            .collect();
        let why = if self.loader.is_some() {
            "it is not configured and not in --allowed-models"
        } else {
            "it is not configured"
        };
        ApiError {
            param: Some("model".into()),
            ..ApiError::not_found(format!(
                "The model `{name}` does not exist ({why}); this server serves {}",
                served.join(", ")
            ))
        }
    }

    /// The loaded model answering to `name`: loads it first when needed (waiting up to
    /// the load timeout), unloading idle least-recently-used ones to stay in budget.
    ///
    /// With `adapters` (a request's `adapters` field, as mlx-lm: a path, or a name the
    /// models file gives the model) other than the model's own, LoRA adapters are kept
    /// resident on the loaded model (up to `--max-resident-adapters` per model, least
    /// recently used idle ones dropped) and the request runs with them in the model's
    /// batches, next to requests with other adapters or none. Adapters that cannot share
    /// the base (DoRA, full fine-tunes, adapters on embeddings or experts, or any on a
    /// model loaded with adapters of its own) are served as an entry of their own,
    /// `<id>@<adapters>`: the base weights are loaded again with the adapters applied
    /// (mlx-lm reloads the model), and both stay loaded under the budget.
    pub async fn acquire(
        self: &Arc<Pool>,
        name: &str,
        adapters: Option<&str>,
    ) -> Result<Arc<AppState>, ApiError> {
        let resident = self.cfg.max_resident_adapters > 0
            && self
                .loader
                .as_ref()
                .is_some_and(|l| l.keeps_adapters_resident());
        let Some(a) = adapters.filter(|_| resident) else {
            return self.acquire_entry(name, adapters).await;
        };
        let base = self.acquire_entry(name, None).await?;
        if base.cfg.adapter_path.as_deref() == Some(a) {
            return Ok(base);
        }
        if base.cfg.adapter_path.is_some() {
            return self.acquire_entry(name, Some(a)).await;
        }
        match self.resident(&base, a).await? {
            AdapterPlan::Resident(app) => Ok(app),
            AdapterPlan::OwnModel => self.acquire_entry(name, Some(a)).await,
        }
    }

    /// The entry of the loaded model `base` and what `adapters` name on it: `(index,
    /// key, path)`.
    fn resolve_adapters(
        &self,
        entries: &[Entry],
        base: &AppState,
        adapters: &str,
    ) -> Result<(usize, String), ApiError> {
        let Some(i) = entries
            .iter()
            .position(|e| matches!(&e.slot, Slot::Loaded(app) if std::ptr::eq(&**app, base)))
        else {
            return Err(ApiError::unavailable(format!(
                "the model `{}` was unloaded; try again",
                base.cfg.model_id
            )));
        };
        if let Some((_, path)) = entries[i]
            .spec
            .resident_adapters
            .iter()
            .find(|(n, _)| n == adapters)
        {
            return Ok((i, path.clone()));
        }
        if !self.allowed(adapters) {
            return Err(ApiError::invalid_param(
                "adapters",
                format!(
                    "adapters `{adapters}` are not served here: {}",
                    if self.loader.is_some() {
                        "they are neither named in the models file nor in --allowed-models"
                    } else {
                        "this server cannot load adapters"
                    }
                ),
            ));
        }
        Ok((i, adapters.to_string()))
    }

    /// The handler state of `adapters` resident on the loaded model `base`, loading
    /// them on its engine thread when they are new.
    async fn resident(
        self: &Arc<Pool>,
        base: &Arc<AppState>,
        adapters: &str,
    ) -> Result<AdapterPlan, ApiError> {
        let found = |pool: &Pool| -> Result<(Option<Arc<AppState>>, String), ApiError> {
            let mut entries = lock(&pool.entries);
            let (i, path) = pool.resolve_adapters(&entries, base, adapters)?;
            let r = entries[i].resident.iter_mut().find(|r| r.key == adapters);
            Ok((
                r.map(|r| {
                    r.last_used = Instant::now();
                    Arc::clone(&r.app)
                }),
                path,
            ))
        };
        if let (Some(app), _) = found(self)? {
            return Ok(AdapterPlan::Resident(app));
        }
        let _one = self.adapter_loads.lock().await;
        let (app, path) = found(self)?;
        if let Some(app) = app {
            return Ok(AdapterPlan::Resident(app));
        }
        let Some(loader) = self.loader.clone() else {
            return Ok(AdapterPlan::OwnModel);
        };
        // Room first: the least recently used idle adapters of this model go.
        let evicted: Vec<u32> = {
            let mut entries = lock(&self.entries);
            let (i, _) = self.resolve_adapters(&entries, base, adapters)?;
            let resident = &mut entries[i].resident;
            let mut out = Vec::new();
            while resident.len() >= self.cfg.max_resident_adapters {
                let Some(v) = resident
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.idle())
                    .min_by_key(|(_, r)| r.last_used)
                    .map(|(j, _)| j)
                else {
                    return Err(ApiError::unavailable(format!(
                        "cannot keep the adapters `{adapters}` resident: the model `{}` holds {} adapters (--max-resident-adapters), all answering requests; retry when one is idle",
                        base.cfg.model_id,
                        resident.len()
                    )));
                };
                let r = resident.remove(v);
                tracing::info!(model = %base.cfg.model_id, adapters = %r.key, "dropping the least recently used resident adapters");
                out.push(r.id);
            }
            out
        };
        for id in evicted {
            let l = Arc::clone(&loader);
            base.engine
                .with_model(Box::new(move |m| l.remove_adapter(m, id)))?;
            base.engine.forget_adapter(id);
        }
        let id = self
            .next_adapter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (l, p) = (Arc::clone(&loader), path.clone());
        base.engine.with_model(Box::new(move |m| {
            let _ = tx.send(l.add_adapter(m, &p, id));
        }))?;
        let added = rx.await.map_err(|_| {
            ApiError::unavailable("the engine stopped while loading the adapters".to_string())
        })?;
        match added {
            Ok(()) => {}
            Err(AdapterError::OwnModel(why)) if path == adapters => {
                tracing::info!(adapters = %adapters, "adapters load as a model of their own: {why}");
                return Ok(AdapterPlan::OwnModel);
            }
            Err(AdapterError::OwnModel(why)) => {
                return Err(ApiError::invalid_param(
                    "adapters",
                    format!(
                        "the adapters named `{adapters}` ({path}) cannot share the model `{}`: {why}; name them by their path to load them as a model of their own",
                        base.cfg.model_id
                    ),
                ))
            }
            Err(AdapterError::NotFound(m)) => {
                return Err(ApiError {
                    param: Some("adapters".into()),
                    ..ApiError::not_found(format!("The adapters `{adapters}` could not be found: {m}"))
                })
            }
            Err(AdapterError::Incompatible(m)) => {
                return Err(ApiError::invalid_param(
                    "adapters",
                    format!(
                        "the adapters `{adapters}` do not fit the model `{}`: {m}",
                        base.cfg.model_id
                    ),
                ))
            }
            Err(AdapterError::Failed(m)) => {
                return Err(ApiError::internal(format!(
                    "the adapters `{adapters}` failed to load: {m}"
                )))
            }
        }
        tracing::info!(model = %base.cfg.model_id, adapters = %adapters, id, "adapters kept resident");
        let mut cfg = base.cfg.clone();
        cfg.adapter_path = Some(adapters.to_string());
        cfg.resident_adapter = id;
        let app = Arc::new(AppState {
            cfg,
            engine: base.engine.share(),
            tokenizer: Arc::clone(&base.tokenizer),
            metrics: Arc::clone(&base.metrics),
            info: base.info.clone(),
            constraints: std::sync::OnceLock::new(),
        });
        let mut entries = lock(&self.entries);
        match self.resolve_adapters(&entries, base, adapters) {
            Ok((i, _)) => entries[i].resident.push(Resident {
                key: adapters.to_string(),
                id,
                app: Arc::clone(&app),
                last_used: Instant::now(),
            }),
            // The model was unloaded meanwhile (its engine and adapters are gone).
            Err(e) => return Err(e),
        }
        Ok(AdapterPlan::Resident(app))
    }

    async fn acquire_entry(
        self: &Arc<Pool>,
        name: &str,
        adapters: Option<&str>,
    ) -> Result<Arc<AppState>, ApiError> {
        let deadline = Instant::now() + self.cfg.load_timeout;
        loop {
            let (mut rx, evicted) = {
                let mut entries = lock(&self.entries);
                let mut idx = match entries.iter().position(|e| e.spec.answers_to(name)) {
                    Some(i) => i,
                    None if self.allowed(name) => {
                        entries.push(Entry {
                            spec: ModelSpec::new(name),
                            slot: Slot::Unloaded,
                            last_used: Instant::now(),
                            bytes: 0,
                            configured: false,
                            reloadable: true,
                            resident: Vec::new(),
                        });
                        entries.len() - 1
                    }
                    None => return Err(self.unknown(&entries, name)),
                };
                if let Some(a) = adapters {
                    if entries[idx].spec.adapter_path.as_deref() != Some(a) {
                        idx = self.with_adapters(&mut entries, idx, a)?;
                    }
                }
                entries[idx].last_used = Instant::now();
                match &entries[idx].slot {
                    Slot::Loaded(app) => return Ok(Arc::clone(app)),
                    Slot::Loading(rx) => (rx.clone(), Vec::new()),
                    Slot::Unloaded => self.begin_load(&mut entries, idx)?,
                }
            };
            self.finish_unloads(evicted);
            let left = deadline.saturating_duration_since(Instant::now());
            let waited = tokio::time::timeout(left, rx.wait_for(Option::is_some)).await;
            match waited {
                Err(_) => {
                    return Err(ApiError::unavailable(format!(
                        "the model `{name}` is still loading after {:?} (--model-load-timeout); try again later",
                        self.cfg.load_timeout
                    )))
                }
                Ok(Err(_)) => {
                    return Err(ApiError::internal(format!(
                        "loading the model `{name}` was abandoned"
                    )))
                }
                Ok(Ok(r)) => {
                    if let Some(Err(e)) = r.as_ref() {
                        return Err(e.clone());
                    }
                }
            }
        }
    }

    /// The entry of the model of entry `base` with `adapters` (made when new).
    fn with_adapters(
        &self,
        entries: &mut Vec<Entry>,
        base: usize,
        adapters: &str,
    ) -> Result<usize, ApiError> {
        let id = format!("{}@{adapters}", entries[base].spec.id);
        if let Some(i) = entries.iter().position(|e| e.spec.id == id) {
            return Ok(i);
        }
        if !self.allowed(adapters) {
            return Err(ApiError::invalid_param(
                "adapters",
                format!(
                    "adapters `{adapters}` are not served here: {}",
                    if self.loader.is_some() {
                        "they are not in --allowed-models"
                    } else {
                        "this server cannot load models"
                    }
                ),
            ));
        }
        let b = &entries[base].spec;
        let spec = ModelSpec {
            id,
            path: b.path.clone(),
            aliases: Vec::new(),
            adapter_path: Some(adapters.to_string()),
            draft_model: b.draft_model.clone(),
            pinned: false,
            idle_timeout: b.idle_timeout,
            defaults: b.defaults.clone(),
            base: Some(b.id.clone()),
            resident_adapters: Vec::new(),
        };
        entries.push(Entry {
            spec,
            slot: Slot::Unloaded,
            last_used: Instant::now(),
            bytes: 0,
            configured: false,
            reloadable: true,
            resident: Vec::new(),
        });
        Ok(entries.len() - 1)
    }

    /// Marks entry `idx` loading (after making room in the budget) and starts loading
    /// it on a blocking thread; returns the receiver of the outcome and the models
    /// unloaded to make room.
    fn begin_load(
        self: &Arc<Pool>,
        entries: &mut [Entry],
        idx: usize,
    ) -> Result<(watch::Receiver<LoadResult>, Vec<Arc<AppState>>), ApiError> {
        let spec = entries[idx].spec.clone();
        if !entries[idx].reloadable {
            return Err(ApiError::unavailable(format!(
                "the model `{}` was unloaded and this server has no loader to load it again",
                spec.id
            )));
        }
        let Some(loader) = self.loader.clone() else {
            return Err(ApiError::unavailable(format!(
                "the model `{}` is not loaded and this server cannot load models",
                spec.id
            )));
        };
        let need = loader.estimate_bytes(&spec).unwrap_or(0);
        let evicted = self.make_room(entries, need, &spec.id)?;
        let (tx, rx) = watch::channel(None);
        entries[idx].slot = Slot::Loading(rx.clone());
        entries[idx].bytes = need;
        tracing::info!(model = %spec.id, path = %spec.path, bytes = need, "loading model");
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            let p = Arc::clone(&pool);
            let spec2 = spec.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                let tic = Instant::now();
                let loaded = loader.load(&spec2).map_err(|e| match e {
                    LoadError::NotFound(m) => ApiError {
                        param: Some("model".into()),
                        ..ApiError::not_found(format!(
                            "The model `{}` could not be found: {m}",
                            spec2.id
                        ))
                    },
                    LoadError::Failed(m) => ApiError::internal(format!(
                        "The model `{}` failed to load: {m}",
                        spec2.id
                    )),
                })?;
                let app = p.start_engine(&spec2, loaded).map_err(|e| {
                    ApiError::unavailable(format!(
                        "the model `{}` loaded but its engine did not start: {e}",
                        spec2.id
                    ))
                })?;
                tracing::info!(model = %spec2.id, "model loaded in {:.2} s", tic.elapsed().as_secs_f64());
                Ok(Arc::new(app))
            })
            .await
            .unwrap_or_else(|e| Err(ApiError::internal(format!("the model load panicked: {e}"))));
            let outcome = {
                let mut entries = lock(&pool.entries);
                let entry = entries.iter_mut().find(|e| e.spec.id == spec.id);
                match (loaded, entry) {
                    (Ok(app), Some(e)) => {
                        e.slot = Slot::Loaded(app);
                        e.last_used = Instant::now();
                        Ok(())
                    }
                    (Err(err), Some(e)) => {
                        tracing::warn!(model = %spec.id, "model load failed: {}", err.message);
                        e.slot = Slot::Unloaded;
                        e.bytes = 0;
                        Err(err)
                    }
                    (r, None) => r.map(|_| ()),
                }
            };
            if outcome.is_err() {
                // A model named only by the failed request is forgotten again.
                lock(&pool.entries).retain(|e| e.configured || e.state() != ModelState::Unloaded);
            }
            let _ = tx.send(Some(outcome));
        });
        Ok((rx, evicted))
    }

    /// Unloads idle unpinned models, least recently used first, until `need` more
    /// bytes fit the budget; 503 naming what holds memory when they cannot.
    fn make_room(
        &self,
        entries: &mut [Entry],
        need: u64,
        id: &str,
    ) -> Result<Vec<Arc<AppState>>, ApiError> {
        let Some(budget) = self.cfg.budget_bytes else {
            return Ok(Vec::new());
        };
        if need > budget {
            return Err(ApiError::unavailable(format!(
                "the model `{id}` needs about {} but the memory budget for models is {} (--models-memory-budget)",
                gb(need),
                gb(budget)
            )));
        }
        let used = |entries: &[Entry]| -> u64 {
            entries
                .iter()
                .filter(|e| e.state() != ModelState::Unloaded)
                .map(|e| e.bytes)
                .sum()
        };
        let mut evicted = Vec::new();
        while used(entries) + need > budget {
            let victim = entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.evictable().is_some())
                .min_by_key(|(_, e)| e.last_activity())
                .map(|(i, _)| i);
            let Some(v) = victim else {
                let holders: Vec<String> = entries
                    .iter()
                    .filter(|e| e.state() != ModelState::Unloaded)
                    .map(|e| {
                        let why = if e.spec.pinned {
                            "pinned"
                        } else if e.state() == ModelState::Loading {
                            "loading"
                        } else {
                            "in use"
                        };
                        format!("`{}` ({}, {why})", e.spec.id, gb(e.bytes))
                    })
                    .collect();
                // Undo nothing: the unloads so far stand (their memory is free).
                self.finish_unloads(std::mem::take(&mut evicted));
                return Err(ApiError::unavailable(format!(
                    "cannot load the model `{id}` (about {}): the memory budget for models ({}) is held by {}; retry when one is idle",
                    gb(need),
                    gb(budget),
                    holders.join(", ")
                )));
            };
            if let Some(app) = unload_entry(&mut entries[v]) {
                tracing::info!(model = %entries[v].spec.id, "unloading the least recently used model to make room");
                evicted.push(app);
            }
        }
        Ok(evicted)
    }

    /// Stops the engines of unloaded models on a blocking thread (the model's memory is
    /// freed when its engine thread ends).
    fn finish_unloads(&self, apps: Vec<Arc<AppState>>) {
        if apps.is_empty() {
            return;
        }
        let stop = move || {
            for app in apps {
                app.engine.shutdown();
                drop(app);
            }
            mlx_array::memory::clear_cache();
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(stop);
            }
            Err(_) => stop(),
        }
    }

    /// Loads the model answering to `name` (`POST /v1/models/{id}/load`).
    pub async fn load(self: &Arc<Pool>, name: &str) -> Result<(), ApiError> {
        self.acquire(name, None).await.map(drop)
    }

    /// Unloads the model answering to `name` (`POST /v1/models/{id}/unload`): 409 while
    /// it answers requests or loads, or when it could not be loaded again.
    pub fn unload(&self, name: &str) -> Result<ModelState, ApiError> {
        let app = {
            let mut entries = lock(&self.entries);
            let Some(i) = entries.iter().position(|e| e.spec.answers_to(name)) else {
                return Err(self.unknown(&entries, name));
            };
            let e = &mut entries[i];
            match &e.slot {
                Slot::Unloaded => return Ok(ModelState::Unloaded),
                Slot::Loading(_) => {
                    return Err(ApiError::new(
                        ErrorKind::Conflict,
                        format!("the model `{}` is loading; unload it once it is loaded", e.spec.id),
                    ))
                }
                Slot::Loaded(app) if !idle(app) => {
                    return Err(ApiError::new(
                        ErrorKind::Conflict,
                        format!("the model `{}` is answering requests; unload it when they are done", e.spec.id),
                    ))
                }
                Slot::Loaded(_) if !e.reloadable => {
                    return Err(ApiError::new(
                        ErrorKind::Conflict,
                        format!("the model `{}` was handed to the server without a loader and could not be loaded again", e.spec.id),
                    ))
                }
                Slot::Loaded(_) => {}
            }
            tracing::info!(model = %e.spec.id, "unloading model on request");
            unload_entry(e)
        };
        self.finish_unloads(app.into_iter().collect());
        Ok(ModelState::Unloaded)
    }

    /// Unloads models idle for longer than their timeout; returns how many.
    pub fn unload_idle(&self) -> usize {
        let now = Instant::now();
        let apps: Vec<Arc<AppState>> = {
            let mut entries = lock(&self.entries);
            entries
                .iter_mut()
                .filter(|e| e.reloadable && e.evictable().is_some())
                .filter(|e| {
                    e.spec
                        .idle_timeout
                        .or(self.cfg.idle_timeout)
                        .is_some_and(|t| now.saturating_duration_since(e.last_activity()) >= t)
                })
                .filter_map(|e| {
                    tracing::info!(model = %e.spec.id, "unloading idle model");
                    unload_entry(e)
                })
                .collect()
        };
        let n = apps.len();
        self.finish_unloads(apps);
        n
    }

    /// How often [`Pool::unload_idle`] should run (`None`: no model has a timeout).
    pub fn idle_check_interval(&self) -> Option<Duration> {
        let entries = lock(&self.entries);
        let shortest = entries
            .iter()
            .filter_map(|e| e.spec.idle_timeout)
            .chain(self.cfg.idle_timeout)
            .min()?;
        Some((shortest / 4).clamp(Duration::from_millis(20), Duration::from_secs(5)))
    }

    /// Stops every engine (queued and running requests get 503) and waits for them.
    pub fn shutdown(&self) {
        let apps: Vec<Arc<AppState>> = lock(&self.entries)
            .iter_mut()
            .filter_map(|e| match std::mem::replace(&mut e.slot, Slot::Unloaded) {
                Slot::Loaded(app) => Some(app),
                _ => None,
            })
            .collect();
        for app in apps {
            app.engine.shutdown();
        }
    }

    /// `/v1/models` entries: configured models and those loaded by name (with their
    /// state), then MLX models of the Hugging Face cache not among them.
    pub fn list(&self) -> Vec<Json> {
        let mut out: Vec<Json> = lock(&self.entries)
            .iter()
            .map(|e| self.entry_json(e))
            .collect();
        if let Some(loader) = &self.loader {
            let known: Vec<String> = lock(&self.entries)
                .iter()
                .flat_map(|e| std::iter::once(e.spec.id.clone()).chain(e.spec.aliases.clone()))
                .collect();
            for id in loader.cached_models() {
                if known.contains(&id) || !self.allowed(&id) {
                    continue;
                }
                out.push(json!({
                    "id": id, "object": "model", "created": self.created,
                    "owned_by": "mlx-server", "state": ModelState::Unloaded.as_str(),
                }));
            }
        }
        out
    }

    /// The `/v1/models/{id}` entry of the model answering to `name`.
    pub fn describe(&self, name: &str) -> Option<Json> {
        if let Some(e) = lock(&self.entries).iter().find(|e| e.spec.answers_to(name)) {
            return Some(self.entry_json(e));
        }
        self.list()
            .into_iter()
            .find(|m| m.get("id").and_then(Json::as_str) == Some(name))
    }

    fn entry_json(&self, e: &Entry) -> Json {
        let mut m = Map::new();
        m.insert("id".into(), json!(e.spec.id));
        m.insert("object".into(), json!("model"));
        m.insert("created".into(), json!(self.created));
        m.insert("owned_by".into(), json!("mlx-server"));
        m.insert("state".into(), json!(e.state().as_str()));
        m.insert("pinned".into(), json!(e.spec.pinned));
        if let Some(a) = &e.spec.adapter_path {
            m.insert("adapters".into(), json!(a));
        }
        if let Some(d) = &e.spec.draft_model {
            m.insert("draft_model".into(), json!(d));
        }
        if !e.resident.is_empty() {
            let keys: Vec<&str> = e.resident.iter().map(|r| r.key.as_str()).collect();
            m.insert("resident_adapters".into(), json!(keys));
        }
        if e.state() != ModelState::Unloaded && e.bytes > 0 {
            m.insert("memory_bytes".into(), json!(e.bytes));
        }
        Json::Object(m)
    }
}

/// Takes a loaded model out of its entry (its engine is stopped by the caller).
fn unload_entry(e: &mut Entry) -> Option<Arc<AppState>> {
    match std::mem::replace(&mut e.slot, Slot::Unloaded) {
        Slot::Loaded(app) => {
            e.bytes = 0;
            e.resident.clear();
            Some(app)
        }
        other => {
            e.slot = other;
            None
        }
    }
}

/// Reads a models file (`--models-config`): JSON, or YAML when the name ends in
/// `.yaml` / `.yml`. Either a list of models or `{"models": [...]}`; each model:
/// `id`, `path` (or `model`; default: the id), `aliases`, `adapters` (or
/// `adapter_path`), `draft_model`, `pinned`, `idle_timeout` (seconds), and sampling
/// defaults `temperature` (or `temp`), `top_p`, `top_k`, `min_p`, `max_tokens`.
pub fn read_models_file(path: &Path) -> Result<Vec<ModelSpec>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the models file {}: {e}", path.display()))?;
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    let value = if yaml {
        yaml_to_json(&text)?
    } else {
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?
    };
    parse_models(&value).map_err(|e| format!("{}: {e}", path.display()))
}

fn yaml_to_json(text: &str) -> Result<Json, String> {
    use yaml_rust2::{Yaml, YamlLoader};
    fn conv(y: &Yaml) -> Result<Json, String> {
        Ok(match y {
            Yaml::Real(s) => s
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Json::Number)
                .ok_or_else(|| format!("bad number {s:?}"))?,
            Yaml::Integer(i) => json!(i),
            Yaml::String(s) => json!(s),
            Yaml::Boolean(b) => json!(b),
            Yaml::Array(a) => Json::Array(a.iter().map(conv).collect::<Result<_, _>>()?),
            Yaml::Hash(h) => {
                let mut m = Map::new();
                for (k, v) in h {
                    let k = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        other => return Err(format!("unsupported key {other:?}")),
                    };
                    m.insert(k, conv(v)?);
                }
                Json::Object(m)
            }
            Yaml::Null => Json::Null,
            Yaml::Alias(_) | Yaml::BadValue => return Err("unsupported YAML value".into()),
        })
    }
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    match docs.as_slice() {
        [doc] => conv(doc),
        [] => Ok(Json::Array(Vec::new())),
        _ => Err("a models file holds one YAML document".into()),
    }
}

/// Parses the models of a models file (see [`read_models_file`]).
pub fn parse_models(value: &Json) -> Result<Vec<ModelSpec>, String> {
    let list = match value {
        Json::Array(a) => a,
        Json::Object(o) => {
            if let Some(k) = o.keys().find(|k| k.as_str() != "models") {
                return Err(format!("unknown top-level field `{k}` (expected `models`)"));
            }
            match o.get("models") {
                Some(Json::Array(a)) => a,
                _ => return Err("`models` must be a list".into()),
            }
        }
        _ => return Err("expected a list of models or {\"models\": [...]}".into()),
    };
    let mut out: Vec<ModelSpec> = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let spec = parse_model(m).map_err(|e| format!("models[{i}]: {e}"))?;
        if out.iter().any(|o| o.id == spec.id) {
            return Err(format!("models[{i}]: the id `{}` is used twice", spec.id));
        }
        out.push(spec);
    }
    Ok(out)
}

fn parse_model(v: &Json) -> Result<ModelSpec, String> {
    let Json::Object(o) = v else {
        return Err("a model must be an object".into());
    };
    let string = |k: &str| -> Result<Option<String>, String> {
        match o.get(k) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{k}` must be a non-empty string")),
        }
    };
    let number = |k: &str, min: f64, max: f64| -> Result<Option<f64>, String> {
        match o.get(k) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(f) if (min..=max).contains(&f) => Ok(Some(f)),
                _ => Err(format!("`{k}` must be a number between {min} and {max}")),
            },
        }
    };
    let integer = |k: &str, min: i64| -> Result<Option<i64>, String> {
        match o.get(k) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => match v.as_i64() {
                Some(i) if i >= min => Ok(Some(i)),
                _ => Err(format!("`{k}` must be an integer of at least {min}")),
            },
        }
    };
    const KNOWN: &[&str] = &[
        "id",
        "path",
        "model",
        "aliases",
        "adapters",
        "adapter_path",
        "resident_adapters",
        "draft_model",
        "pinned",
        "idle_timeout",
        "temperature",
        "temp",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
    ];
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field `{k}` (known: {})", KNOWN.join(", ")));
    }
    let path = match (string("path")?, string("model")?) {
        (Some(_), Some(_)) => return Err("give `path` or `model`, not both".into()),
        (p, m) => p.or(m),
    };
    let id = match (string("id")?, &path) {
        (Some(id), _) => id,
        (None, Some(p)) => p.clone(),
        (None, None) => return Err("a model needs an `id` or a `path`".into()),
    };
    let aliases = match o.get("aliases") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| "`aliases` must be a list of strings".to_string())
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`aliases` must be a list of strings".into()),
    };
    let adapter_path = match (string("adapters")?, string("adapter_path")?) {
        (Some(_), Some(_)) => return Err("give `adapters` or `adapter_path`, not both".into()),
        (a, b) => a.or(b),
    };
    let resident_adapters = match o.get("resident_adapters") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Object(m)) => m
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(p) if !p.is_empty() && !k.is_empty() => Ok((k.clone(), p.to_string())),
                _ => Err(format!(
                    "`resident_adapters` maps names to adapter paths; `{k}` is not a path"
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`resident_adapters` must map names to adapter paths".into()),
    };
    let pinned = match o.get("pinned") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err("`pinned` must be true or false".into()),
    };
    let idle_timeout = number("idle_timeout", 0.0, 1e9)?.map(Duration::from_secs_f64);
    let temp = match (
        number("temperature", 0.0, f64::MAX)?,
        number("temp", 0.0, f64::MAX)?,
    ) {
        (Some(_), Some(_)) => return Err("give `temperature` or `temp`, not both".into()),
        (a, b) => a.or(b),
    };
    Ok(ModelSpec {
        path: path.unwrap_or_else(|| id.clone()),
        id,
        aliases,
        adapter_path,
        draft_model: string("draft_model")?,
        pinned,
        idle_timeout,
        defaults: SamplingDefaults {
            temp,
            top_p: number("top_p", 0.0, 1.0)?,
            top_k: integer("top_k", 0)?,
            min_p: number("min_p", 0.0, 1.0)?,
            max_tokens: integer("max_tokens", 1)?,
        },
        base: None,
        resident_adapters,
    })
}

/// `GET /v1/models` (configured, loaded and cached models with their state) and
/// `GET /v1/models/{id}`.
pub fn models_response(pool: &Pool, path: &str) -> hyper::Response<crate::http::Body> {
    use crate::http::{error_response, json_response};
    let wanted = path
        .trim_end_matches('/')
        .strip_prefix("/v1/models/")
        .filter(|s| !s.is_empty());
    match wanted {
        Some(id) => match pool.describe(id) {
            Some(m) => json_response(hyper::StatusCode::OK, &m),
            None => error_response(
                crate::error::Dialect::OpenAi,
                &ApiError::not_found(format!("The model `{id}` does not exist")),
            ),
        },
        None => json_response(
            hyper::StatusCode::OK,
            &json!({"object": "list", "data": pool.list()}),
        ),
    }
}

/// `POST /v1/models/{id}/load` (answers once loaded) and `POST /v1/models/{id}/unload`.
pub async fn model_action(pool: &Arc<Pool>, path: &str) -> hyper::Response<crate::http::Body> {
    use crate::http::{error_response, json_response};
    let p = path.trim_end_matches('/');
    let rest = p.strip_prefix("/v1/models/").unwrap_or("");
    let (id, action) = match rest.rsplit_once('/') {
        Some((id, a)) if !id.is_empty() => (id, a),
        _ => {
            return error_response(
                crate::error::Dialect::OpenAi,
                &ApiError::not_found(format!("Not found: {path}")),
            )
        }
    };
    let result = match action {
        "load" => pool.load(id).await.map(|()| ModelState::Loaded),
        _ => pool.unload(id),
    };
    match result {
        Ok(state) => json_response(
            hyper::StatusCode::OK,
            &json!({"id": id, "object": "model", "state": state.as_str()}),
        ),
        Err(e) => error_response(crate::error::Dialect::OpenAi, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_files_parse_and_refuse_mistakes() {
        let v = json!({"models": [
            {"id": "a", "path": "/m/a", "pinned": true, "idle_timeout": 1.5,
             "temperature": 0.7, "max_tokens": 64, "adapters": "/ad", "draft_model": "d"},
            {"model": "org/b", "resident_adapters": {"support": "/ad/support"}},
        ]});
        let specs = parse_models(&v).unwrap();
        assert_eq!(specs[0].id, "a");
        assert_eq!(specs[0].path, "/m/a");
        assert!(specs[0].pinned);
        assert_eq!(specs[0].idle_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(specs[0].defaults.temp, Some(0.7));
        assert_eq!(specs[0].defaults.max_tokens, Some(64));
        assert_eq!(specs[0].adapter_path.as_deref(), Some("/ad"));
        assert_eq!(specs[0].draft_model.as_deref(), Some("d"));
        assert_eq!(specs[1].id, "org/b");
        assert_eq!(specs[1].path, "org/b");
        assert!(!specs[1].pinned);
        assert!(specs[0].resident_adapters.is_empty());
        assert_eq!(
            specs[1].resident_adapters,
            vec![("support".to_string(), "/ad/support".to_string())]
        );

        let err = |v: Json| parse_models(&v).unwrap_err();
        assert!(err(json!([{"id": "a", "pined": true}])).contains("unknown field `pined`"));
        assert!(err(json!([{"id": "a", "top_p": 2}])).contains("`top_p`"));
        assert!(err(json!([{"id": "a"}, {"id": "a"}])).contains("used twice"));
        assert!(err(json!([{}])).contains("needs an `id`"));
        assert!(err(json!([{"id": "a", "resident_adapters": ["/ad"]}]))
            .contains("`resident_adapters` must map names"));
        assert!(
            err(json!([{"id": "a", "resident_adapters": {"x": 1}}])).contains("`x` is not a path")
        );
        assert!(err(json!({"model": []})).contains("unknown top-level field"));
    }

    #[test]
    fn yaml_models_files_read_like_json() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("models.yaml");
        std::fs::write(
            &p,
            "models:\n  - id: a\n    path: /m/a\n    pinned: true\n    top_k: 20\n    idle_timeout: 30\n",
        )
        .unwrap();
        let specs = read_models_file(&p).unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].defaults.top_k, Some(20));
        assert_eq!(specs[0].idle_timeout, Some(Duration::from_secs(30)));
        std::fs::write(&p, "models:\n  - id: a\n    pinned: maybe\n").unwrap();
        assert!(read_models_file(&p).unwrap_err().contains("`pinned`"));
    }
}

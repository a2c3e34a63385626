//! An OpenAI- and Anthropic-compatible HTTP server for MLX language models, the
//! counterpart of `mlx_lm.server`.
//!
//! The generation engine (`mlx_engine::batch`: one thread that owns the model and every
//! MLX evaluation, with continuous batching) does the tensor work; this crate serves
//! HTTP: handlers (tokio + hyper) parse the protocol, tokenize, submit through a thin
//! handle ([`engine`]) and turn engine events into responses (tool calls, reasoning,
//! stop words). Endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//! `/health`, `/metrics`, `/v1/messages` (+ `count_tokens`), `/v1/responses`.
//!
//! ```no_run
//! # async fn run(model: Box<dyn mlx_models::LanguageModel>, tok: mlx_tokenizer::Tokenizer)
//! # -> Result<(), mlx_server::ServerError> {
//! let cfg = mlx_server::ServerConfig { port: 0, ..Default::default() };
//! let server = mlx_server::Server::start(cfg, model, tok).await?;
//! println!("listening on {}", server.local_addr());
//! server.shutdown().await
//! # }
//! ```
#![warn(missing_docs)]

pub mod anthropic;
pub mod completions;
pub mod config;
pub mod engine;
pub mod error;
pub mod http;
pub mod memory;
pub mod metrics;
pub mod openai;
pub mod output;
pub mod params;
pub mod pool;
pub mod prompt;
mod pylit;
pub mod responses;
pub mod structured;
pub mod text;
pub mod tool_grammar;
mod tool_parsers;
pub mod tools;
pub mod warm;

pub use config::ServerConfig;
pub use error::{ApiError, ServerError};
pub use metrics::Metrics;

use http::ServerState;
use mlx_models::LanguageModel;
use mlx_tokenizer::Tokenizer;
use pool::{LoadedModel, ModelLoader, ModelSpec, Pool, PoolConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long open requests may run on after a shutdown request.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// A running server.
pub struct Server {
    addr: SocketAddr,
    state: Arc<ServerState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
}

impl Server {
    /// Binds `cfg.host:cfg.port` (port 0: any free port), starts the engine thread with
    /// `model` and serves on the current tokio runtime (one model, no others loadable).
    pub async fn start(
        cfg: ServerConfig,
        model: Box<dyn LanguageModel>,
        tokenizer: Tokenizer,
    ) -> Result<Server, ServerError> {
        let mut spec = ModelSpec::new(&cfg.model_id);
        spec.aliases = cfg.model_aliases.clone();
        let loaded = LoadedModel {
            model,
            tokenizer,
            context_length: cfg.context_length,
            aliases: Vec::new(),
            config: None,
            draft: None,
        };
        Server::start_pool(cfg, PoolConfig::default(), Some((spec, loaded)), None).await
    }

    /// Binds `cfg.host:cfg.port` and serves a pool of models: `default` (loaded, the
    /// `--model` one, pinned), the configured ones of `pool_cfg` and, through `loader`,
    /// any other model a request names that `pool_cfg` allows.
    pub async fn start_pool(
        cfg: ServerConfig,
        pool_cfg: PoolConfig,
        default: Option<(ModelSpec, LoadedModel)>,
        loader: Option<Arc<dyn ModelLoader>>,
    ) -> Result<Server, ServerError> {
        cfg.validate().map_err(ServerError::Config)?;
        if let Some(limit) = cfg.memory_limit_bytes {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            mlx_array::memory::set_memory_limit(limit)?;
            tracing::info!("MLX memory limit: {:.3} GB", limit as f64 / 1e9);
        }
        let listener = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
            .await
            .map_err(|source| ServerError::Io {
                what: format!("binding {}:{}", cfg.host, cfg.port),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Io {
            what: "reading the bound address".into(),
            source,
        })?;
        let metrics = Arc::new(Metrics::default());
        let pool = Arc::new(Pool::new(
            cfg.clone(),
            pool_cfg,
            default,
            loader,
            Arc::clone(&metrics),
        )?);
        let state = Arc::new(ServerState {
            cfg,
            pool: Arc::clone(&pool),
            metrics,
        });
        if !state.cfg.warm_prompts.is_empty() {
            // Warm prompts belong to the `--model` one (the server's model id).
            let app = state
                .pool
                .acquire(&state.cfg.model_id, None)
                .await
                .map_err(|e| ServerError::Config(format!("--warm-prompt: {}", e.message)))?;
            warm::prefill(&app).await?;
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let st = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let signal = async move {
                let _ = stopped.await;
            };
            http::accept_loop(st, listener, signal, SHUTDOWN_GRACE).await
        });
        let weak = Arc::downgrade(&pool);
        tokio::spawn(async move {
            loop {
                let every = match weak.upgrade() {
                    Some(p) => p.idle_check_interval(),
                    None => return,
                };
                tokio::time::sleep(every.unwrap_or(Duration::from_secs(5))).await;
                match weak.upgrade() {
                    Some(p) if every.is_some() => {
                        p.unload_idle();
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        });
        tracing::info!("mlx-server listening on http://{addr}");
        Ok(Server {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.state.metrics
    }

    /// Whether the engine threads of the loaded models are running.
    pub fn is_healthy(&self) -> bool {
        self.state.pool.is_healthy()
    }

    /// The served models.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.state.pool
    }

    /// Stops accepting, lets open requests finish (up to [`SHUTDOWN_GRACE`]), then stops
    /// the engines.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = match self.task.take() {
            Some(t) => t
                .await
                .map_err(|e| ServerError::Engine(format!("server task failed: {e}")))?,
            None => Ok(()),
        };
        let state = Arc::clone(&self.state);
        let _ = tokio::task::spawn_blocking(move || state.pool.shutdown()).await;
        result
    }

    /// Serves until `signal` resolves (e.g. SIGINT/SIGTERM), then shuts down gracefully.
    pub async fn run_until(
        self,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServerError> {
        signal.await;
        tracing::info!("shutdown requested");
        self.shutdown().await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Serves on a runtime of its own until SIGINT/SIGTERM, then shuts down gracefully
/// (what the `mlx-server` binary runs). `on_ready` gets the bound address.
pub fn serve_blocking(
    cfg: ServerConfig,
    model: Box<dyn LanguageModel>,
    tokenizer: Tokenizer,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let mut spec = ModelSpec::new(&cfg.model_id);
    spec.aliases = cfg.model_aliases.clone();
    let loaded = LoadedModel {
        model,
        tokenizer,
        context_length: cfg.context_length,
        aliases: Vec::new(),
        config: None,
        draft: None,
    };
    serve_pool_blocking(
        cfg,
        PoolConfig::default(),
        Some((spec, loaded)),
        None,
        on_ready,
    )
}

/// [`serve_blocking`] with a pool of models (see [`Server::start_pool`]).
pub fn serve_pool_blocking(
    cfg: ServerConfig,
    pool_cfg: PoolConfig,
    default: Option<(ModelSpec, LoadedModel)>,
    loader: Option<Arc<dyn ModelLoader>>,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("mlx-server-http")
        .build()
        .map_err(|source| ServerError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    rt.block_on(async move {
        let server = Server::start_pool(cfg, pool_cfg, default, loader).await?;
        on_ready(server.local_addr());
        server.run_until(shutdown_signal()).await
    })
}

/// mlx-lm's `_parse_size`: a number with an optional `M`, `MB`, `G` or `GB` suffix
/// (powers of ten), e.g. `"1.5GB"`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let digits: f64 = text[..split]
        .parse()
        .map_err(|_| format!("invalid size {text:?}"))?;
    let scale = match text[split..].trim().to_ascii_uppercase().as_str() {
        "" => 1.0,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {text:?} (use M, MB, G or GB)"
            ))
        }
    };
    Ok((digits * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_parse_like_mlx_lm() {
        assert_eq!(super::parse_size("1024"), Ok(1024));
        assert_eq!(super::parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(super::parse_size("20 m"), Ok(20_000_000));
        assert!(super::parse_size("3TB").is_err());
        assert!(super::parse_size("GB").is_err());
    }
}

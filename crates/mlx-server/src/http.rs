//! HTTP plumbing on hyper 1: routing, body limits, API keys, CORS, JSON and SSE
//! responses, graceful shutdown.
use crate::config::ServerConfig;
use crate::engine::{CancelGuard, Engine};
use crate::error::{ApiError, Dialect, ErrorKind, ServerError};
use crate::metrics::Metrics;
use crate::tools::ToolFormat;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::{Body as HttpBody, Frame, Incoming};
use hyper::header::{
    HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN, VARY,
};
use hyper::{Method, Request, Response, StatusCode};
use mlx_tokenizer::Tokenizer;
use serde_json::{Map, Value as Json};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// The response body type.
pub type Body = BoxBody<Bytes, Infallible>;

/// Facts about the loaded model the handlers need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Tool-call format.
    pub tool_format: Option<ToolFormat>,
    /// Token ids XTC never removes (`"\n"` and EOS, as mlx-lm).
    pub xtc_special_tokens: Vec<i32>,
    /// Vocabulary size of the model.
    pub vocab_size: usize,
    /// Server start time (Unix seconds), the `created` of responses.
    pub created: u64,
    /// `system_fingerprint`.
    pub fingerprint: String,
}

/// The server: its settings, the model pool, metrics.
pub struct ServerState {
    /// Settings shared by all models.
    pub cfg: ServerConfig,
    /// The served models.
    pub pool: Arc<crate::pool::Pool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// One loaded model as its request handlers see it (the pool hands it out per request).
pub struct AppState {
    /// Settings, with the model's id and sampling defaults.
    pub cfg: ServerConfig,
    /// The engine.
    pub engine: Engine,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Model facts.
    pub info: ModelInfo,
    /// The token trie of structured output, built on the first constrained request.
    pub constraints: std::sync::OnceLock<Result<mlx_engine::ConstraintVocab, String>>,
}

/// `n` random lowercase hex digits (ids of responses and tool calls).
pub fn random_hex(n: usize) -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = String::with_capacity(n + 16);
    while out.len() < n {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(n);
    out
}

/// A generation's cancel flag and the flag saying its answer is complete, weakly.
type Watched = (
    std::sync::Weak<std::sync::atomic::AtomicBool>,
    std::sync::Weak<std::sync::atomic::AtomicBool>,
);

/// Cancel flags of the requests of one client connection, set when the client closes
/// it: a generation stops at its next step even while nothing is being written. An
/// answer already complete (the client closing after its end) is left alone.
#[derive(Default)]
pub struct ConnWatch {
    flags: std::sync::Mutex<Vec<Watched>>,
    closed: std::sync::atomic::AtomicBool,
}

impl ConnWatch {
    fn register(&self, watched: Watched) {
        use std::sync::atomic::Ordering;
        let mut flags = self.flags.lock().unwrap_or_else(|e| e.into_inner());
        flags.retain(|(f, _)| f.strong_count() > 0);
        if self.closed.load(Ordering::SeqCst) {
            cancel_unfinished(&watched);
        }
        flags.push(watched);
    }

    /// The client closed the connection: cancels its generations whose answers are not
    /// complete; returns how many.
    fn close(&self) -> usize {
        use std::sync::atomic::Ordering;
        self.closed.store(true, Ordering::SeqCst);
        let flags = self.flags.lock().unwrap_or_else(|e| e.into_inner());
        let n = flags.iter().filter(|w| cancel_unfinished(w)).count();
        if n > 0 {
            tracing::info!("client closed its connection; cancelling {n} generation(s)");
        }
        n
    }
}

/// Sets the cancel flag of a generation still running whose answer is not complete;
/// whether it did. Once its handler let go of it (the `done` flag is gone), the
/// handler's guard already cancelled what it left unfinished.
fn cancel_unfinished((cancel, done): &Watched) -> bool {
    use std::sync::atomic::Ordering;
    let (Some(cancel), Some(done)) = (cancel.upgrade(), done.upgrade()) else {
        return false;
    };
    if done.load(Ordering::Relaxed) {
        return false;
    }
    cancel.store(true, Ordering::Relaxed);
    true
}

tokio::task_local! {
    static CONN: Arc<ConnWatch>;
}

/// Submits to the engine and ties the request to its client connection.
pub fn submit(
    state: &AppState,
    req: mlx_engine::batch::GenerationRequest,
) -> Result<crate::engine::Submission, ApiError> {
    let sub = state.engine.submit(req)?;
    let _ = CONN.try_with(|w| w.register((sub.flag(), sub.done_flag())));
    Ok(sub)
}

/// Watches a duplicate of the client socket for end-of-file (the client went away)
/// until `done` is notified.
#[cfg(unix)]
async fn watch_eof(
    sock: tokio::net::TcpStream,
    watch: Arc<ConnWatch>,
    done: Arc<tokio::sync::Notify>,
) {
    let mut buf = [0u8; 1];
    loop {
        tokio::select! {
            r = sock.peek(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    watch.close();
                    return;
                }
                // A next request is waiting (pipelining): look again later.
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            },
            _ = done.notified() => return,
        }
    }
}

#[cfg(unix)]
fn duplicate(stream: &tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = stream.as_fd().try_clone_to_owned().ok()?;
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(std).ok()
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &Json) -> Response<Body> {
    let bytes = Bytes::from(body.to_string());
    let mut r = Response::new(Full::new(bytes).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// An error response in the route's dialect.
pub fn error_response(dialect: Dialect, e: &ApiError) -> Response<Body> {
    json_response(e.status, &dialect.error_body(e))
}

/// `data: <json>\n\n`.
pub fn sse_data(v: &Json) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n`.
pub fn sse_event(name: &str, v: &Json) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// An SSE comment line (keep-alive).
pub fn sse_comment(text: &str) -> Bytes {
    Bytes::from(format!(": {text}\n\n"))
}

/// A streamed body fed by a channel; dropping it (the client went away) cancels the
/// generation behind it.
pub struct SseBody {
    rx: mpsc::Receiver<Bytes>,
    _cancel: Option<CancelGuard>,
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// An SSE response and the sender that feeds it.
pub fn sse_response(cancel: Option<CancelGuard>) -> (Response<Body>, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel(256);
    let mut r = Response::new(
        SseBody {
            rx,
            _cancel: cancel,
        }
        .boxed(),
    );
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    (r, tx)
}

/// Reads the body as a JSON object: 413 over the limit, 400 for anything not an object.
pub async fn read_json(
    req: Request<Incoming>,
    limit: usize,
) -> Result<Map<String, Json>, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorKind::TooLarge,
            format!("the request body is larger than {limit} bytes"),
        )
    };
    if let Some(len) = req.headers().get(CONTENT_LENGTH) {
        let len: u64 = len
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| ApiError::bad_request("Invalid Content-Length header"))?;
        if len > limit as u64 {
            return Err(too_large());
        }
    }
    let bytes = match Limited::new(req.into_body(), limit).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Err(too_large())
        }
        Err(e) => {
            return Err(ApiError::bad_request(format!(
                "could not read the request body: {e}"
            )))
        }
    };
    let value: Json = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?;
    match value {
        Json::Object(m) => Ok(m),
        _ => Err(ApiError::bad_request("Request should be a JSON dictionary")),
    }
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    let n = a.len().max(b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

fn authorized(cfg: &ServerConfig, req: &Request<Incoming>) -> bool {
    let Some(key) = &cfg.api_key else { return true };
    let h = req.headers();
    let bearer = h
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let x_api_key = h
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let ok_bearer = bearer.is_some_and(|b| constant_time_eq(b.as_bytes(), key.as_bytes()));
    let ok_header = x_api_key.is_some_and(|b| constant_time_eq(b.as_bytes(), key.as_bytes()));
    ok_bearer | ok_header
}

fn cors(cfg: &ServerConfig, origin: Option<&HeaderValue>, r: &mut Response<Body>) {
    let h = r.headers_mut();
    if cfg.allowed_origins.iter().any(|o| o == "*") {
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    } else if let Some(o) = origin {
        let allowed = o
            .to_str()
            .ok()
            .is_some_and(|o| cfg.allowed_origins.iter().any(|a| a == o));
        if allowed {
            h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, o.clone());
            h.insert(VARY, HeaderValue::from_static("Origin"));
        }
    }
    h.insert(ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("*"));
    h.insert(ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("*"));
}

/// The routes, for dispatch and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Completions,
    Models,
    ModelAction,
    Health,
    Metrics,
    Messages,
    CountTokens,
    Responses,
    Unknown,
}

impl Route {
    fn of(path: &str) -> Route {
        match path.trim_end_matches('/') {
            "/v1/chat/completions" | "/chat/completions" => Route::Chat,
            "/v1/completions" | "/completions" => Route::Completions,
            "/health" => Route::Health,
            "/metrics" => Route::Metrics,
            "/v1/messages" => Route::Messages,
            "/v1/messages/count_tokens" => Route::CountTokens,
            "/v1/responses" => Route::Responses,
            p if p.starts_with("/v1/models/")
                && (p.ends_with("/load") || p.ends_with("/unload")) =>
            {
                Route::ModelAction
            }
            p if p == "/v1/models" || p.starts_with("/v1/models/") => Route::Models,
            _ => Route::Unknown,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Models => "/v1/models",
            Route::ModelAction => "/v1/models/{id}/load|unload",
            Route::Health => "/health",
            Route::Metrics => "/metrics",
            Route::Messages => "/v1/messages",
            Route::CountTokens => "/v1/messages/count_tokens",
            Route::Responses => "/v1/responses",
            Route::Unknown => "other",
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Route::Messages | Route::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    fn method(self) -> Option<Method> {
        match self {
            Route::Models | Route::Health | Route::Metrics => Some(Method::GET),
            Route::Unknown => None,
            _ => Some(Method::POST),
        }
    }
}

/// Serves one request.
pub async fn handle(
    state: Arc<ServerState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let route = Route::of(&path);
    let origin = req.headers().get(ORIGIN).cloned();
    let mut resp = if req.method() == Method::OPTIONS {
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = StatusCode::NO_CONTENT;
        r
    } else {
        dispatch(&state, route, &path, req).await
    };
    cors(&state.cfg, origin.as_ref(), &mut resp);
    state
        .metrics
        .record_request(route.label(), resp.status().as_u16());
    Ok(resp)
}

async fn dispatch(
    state: &Arc<ServerState>,
    route: Route,
    path: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let dialect = route.dialect();
    if route != Route::Health && !authorized(&state.cfg, &req) {
        let e = ApiError::new(
            ErrorKind::Authentication,
            "Invalid or missing API key (use `Authorization: Bearer <key>` or `x-api-key`)",
        );
        return error_response(dialect, &e);
    }
    match route.method() {
        None => return error_response(dialect, &ApiError::not_found(format!("Not found: {path}"))),
        Some(m) if m != req.method() => {
            let e = ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("{} is not allowed on {path}", req.method()),
            );
            return error_response(dialect, &e);
        }
        Some(_) => {}
    }
    match route {
        Route::Health => {
            let ok = state.pool.is_healthy();
            let status = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let mut memory = crate::memory::report(state.cfg.memory_limit_bytes);
            memory["models_bytes"] = serde_json::json!(state.pool.used_bytes());
            memory["models_budget_bytes"] = serde_json::json!(state.pool.config().budget_bytes);
            json_response(
                status,
                &serde_json::json!({"status": if ok { "ok" } else { "unavailable" }, "memory": memory}),
            )
        }
        Route::Metrics => {
            let mut r = Response::new(Full::new(Bytes::from(state.metrics.render())).boxed());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        Route::Models => crate::pool::models_response(&state.pool, path),
        Route::ModelAction => crate::pool::model_action(&state.pool, path).await,
        _ => {
            let body = match read_json(req, state.cfg.max_request_bytes).await {
                Ok(b) => b,
                Err(e) => return error_response(dialect, &e),
            };
            // The model the request names (a `model` that is not a string is the
            // handler's 400): loaded first, waiting while it loads.
            let name = body
                .get("model")
                .and_then(Json::as_str)
                .unwrap_or("default_model");
            let adapters = body.get("adapters").and_then(Json::as_str);
            let state = match state.pool.acquire(name, adapters).await {
                Ok(app) => app,
                Err(e) => return error_response(dialect, &e),
            };
            let state = &state;
            let result = match route {
                Route::Chat => crate::openai::chat(Arc::clone(state), body).await,
                Route::Completions => {
                    crate::completions::completions(Arc::clone(state), body).await
                }
                Route::Messages => crate::anthropic::messages(Arc::clone(state), body).await,
                Route::CountTokens => crate::anthropic::count_tokens(Arc::clone(state), body).await,
                Route::Responses => crate::responses::responses(Arc::clone(state), body).await,
                _ => Err(ApiError::not_found(format!("Not found: {path}"))),
            };
            result.unwrap_or_else(|e| error_response(dialect, &e))
        }
    }
}

/// Accepts connections until `shutdown` resolves, then lets open requests finish for
/// up to `grace` before returning.
pub async fn accept_loop(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    grace: std::time::Duration,
) -> Result<(), ServerError> {
    use hyper_util::rt::TokioIo;
    use hyper_util::server::graceful::GracefulShutdown;
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let watch = Arc::new(ConnWatch::default());
                let done = Arc::new(tokio::sync::Notify::new());
                #[cfg(unix)]
                if let Some(dup) = duplicate(&stream) {
                    tokio::spawn(watch_eof(dup, Arc::clone(&watch), Arc::clone(&done)));
                }
                let st = Arc::clone(&state);
                let service = hyper::service::service_fn(move |req| {
                    CONN.scope(Arc::clone(&watch), handle(Arc::clone(&st), req))
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!("connection from {peer}: {e}");
                    }
                    done.notify_one();
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: waiting for open requests");
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("open requests did not finish within {grace:?}; stopping them");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn flags() -> (Arc<AtomicBool>, Arc<AtomicBool>) {
        (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        )
    }

    #[test]
    fn a_closed_connection_cancels_only_answers_not_yet_complete() {
        let watch = ConnWatch::default();
        let (running, running_done) = flags();
        let (complete, complete_done) = flags();
        complete_done.store(true, Ordering::Relaxed);
        let (gone, gone_done) = flags();
        // Its handler let go (its answer streamed), the engine still holds it.
        let (released, released_done) = flags();
        for (c, d) in [
            (&running, &running_done),
            (&complete, &complete_done),
            (&gone, &gone_done),
            (&released, &released_done),
        ] {
            watch.register((Arc::downgrade(c), Arc::downgrade(d)));
        }
        drop(gone);
        drop(released_done);
        assert_eq!(watch.close(), 1);
        assert!(running.load(Ordering::Relaxed));
        assert!(!complete.load(Ordering::Relaxed));
        assert!(!released.load(Ordering::Relaxed));
        // Registered after the close: cancelled at once.
        let (late, late_done) = flags();
        watch.register((Arc::downgrade(&late), Arc::downgrade(&late_done)));
        assert!(late.load(Ordering::Relaxed));
    }
}

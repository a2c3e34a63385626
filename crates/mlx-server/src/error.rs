//! Errors: [`ServerError`] for starting and running the server, [`ApiError`] for one
//! request (rendered as an OpenAI- or Anthropic-shaped JSON body).
use hyper::StatusCode;
use serde_json::{json, Value as Json};

/// What can go wrong starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Binding or accepting failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// An MLX operation failed while preparing the engine.
    #[error(transparent)]
    Mlx(#[from] mlx_array::Error),
    /// The engine thread could not be started or died.
    #[error("engine: {0}")]
    Engine(String),
}

/// The error family, which picks the `type` field of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request is malformed or has bad values.
    InvalidRequest,
    /// 401: missing or wrong API key.
    Authentication,
    /// 404: unknown route or model.
    NotFound,
    /// 405: wrong method for the route.
    MethodNotAllowed,
    /// 409: the action conflicts with the resource's state (e.g. unloading a model
    /// that is answering requests).
    Conflict,
    /// 413: body over `--max-request-bytes`.
    TooLarge,
    /// 429: the queue is full.
    RateLimit,
    /// 500: a bug or unexpected failure.
    Internal,
    /// 503: the engine failed (e.g. out of memory) or is shutting down.
    Unavailable,
}

/// An error answered to one request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Family.
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
}

impl ApiError {
    /// An error of `kind` with its usual status.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        let status = match kind {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimit => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
        }
    }

    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidRequest, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotFound, message)
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Unavailable, message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, message)
    }

    fn openai_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest
            | ErrorKind::TooLarge
            | ErrorKind::MethodNotAllowed
            | ErrorKind::Conflict => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Internal => "server_error",
            ErrorKind::Unavailable => "service_unavailable",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::MethodNotAllowed | ErrorKind::Conflict => {
                "invalid_request_error"
            }
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Internal => "api_error",
            ErrorKind::Unavailable => "overloaded_error",
        }
    }

    /// OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
    pub fn openai_body(&self) -> Json {
        json!({
            "error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.status.as_u16().to_string(),
            }
        })
    }

    /// Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
    pub fn anthropic_body(&self) -> Json {
        json!({
            "type": "error",
            "error": { "type": self.anthropic_type(), "message": self.message }
        })
    }
}

/// An engine error as the answer to its request: the request's fault is 400, a full
/// queue 429, a bug 500, anything else (an MLX failure such as running out of memory, a
/// shutdown) 503, after which the server keeps serving.
impl From<mlx_engine::EngineError> for ApiError {
    fn from(e: mlx_engine::EngineError) -> ApiError {
        use mlx_engine::EngineError as E;
        let kind = match &e {
            e if e.is_invalid_request() => ErrorKind::InvalidRequest,
            E::Busy(_) => ErrorKind::RateLimit,
            E::Internal(_) => ErrorKind::Internal,
            _ => ErrorKind::Unavailable,
        };
        let message = match &e {
            E::Mlx(_) | E::Cache(_) => format!("generation failed: {e}"),
            _ => e.to_string(),
        };
        ApiError::new(kind, message)
    }
}

/// Which body shape errors of a route use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI (chat, completions, responses, models).
    OpenAi,
    /// Anthropic (`/v1/messages`).
    Anthropic,
}

impl Dialect {
    /// The error body in this dialect.
    pub fn error_body(self, e: &ApiError) -> Json {
        match self {
            Dialect::OpenAi => e.openai_body(),
            Dialect::Anthropic => e.anthropic_body(),
        }
    }
}

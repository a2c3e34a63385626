//! The Hub's HTTP client: endpoint, token and offline mode from the environment as
//! huggingface_hub reads them, and the Hub's error answers turned into errors that name
//! the cause.
use crate::HubError;
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::HeaderMap;
use std::path::PathBuf;
use std::time::Duration;

/// The public Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where to talk to and as whom.
#[derive(Clone)]
pub struct HubClient {
    /// `$HF_ENDPOINT` (no trailing `/`), else [`DEFAULT_ENDPOINT`].
    pub endpoint: String,
    /// `$HF_TOKEN`, else the token file (`$HF_TOKEN_PATH`, else `$HF_HOME/token`).
    pub token: Option<String>,
    /// `$HF_HUB_OFFLINE` is set to 1/ON/YES/TRUE.
    pub offline: bool,
    /// Follows redirects (file downloads).
    pub(crate) http: Client,
    /// Never follows redirects (metadata requests read the redirect's own headers).
    pub(crate) http_no_redirect: Client,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("offline", &self.offline)
            .finish()
    }
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home() -> Option<PathBuf> {
    env("HF_HOME")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("huggingface")))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface")))
}

/// Whether `$HF_HUB_OFFLINE` asks for no network.
pub fn offline_from_env() -> bool {
    env("HF_HUB_OFFLINE").is_some_and(|v| {
        ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_ascii_uppercase().as_str())
    })
}

fn token_from_env() -> Option<String> {
    if let Some(t) = env("HF_TOKEN") {
        return Some(t.trim().to_string());
    }
    let path = env("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .or_else(|| hf_home().map(|h| h.join("token")))?;
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

impl HubClient {
    /// The client the environment describes.
    pub fn from_env() -> Result<HubClient, HubError> {
        let endpoint = env("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
            .trim_end_matches('/')
            .to_string();
        HubClient::new(endpoint, token_from_env(), offline_from_env())
    }

    /// A client for `endpoint` with `token`.
    pub fn new(
        endpoint: String,
        token: Option<String>,
        offline: bool,
    ) -> Result<HubClient, HubError> {
        let agent = format!("mlx-rs-lm/{}; hf_hub/rust", env!("CARGO_PKG_VERSION"));
        let build = |redirects: reqwest::redirect::Policy| {
            Client::builder()
                .user_agent(agent.clone())
                .connect_timeout(Duration::from_secs(10))
                .timeout(None)
                .redirect(redirects)
                .build()
                .map_err(|e| HubError::Network {
                    url: endpoint.clone(),
                    detail: e.to_string(),
                })
        };
        Ok(HubClient {
            http: build(reqwest::redirect::Policy::limited(10))?,
            http_no_redirect: build(reqwest::redirect::Policy::none())?,
            endpoint,
            token,
            offline,
        })
    }

    /// Adds the token (for requests to the endpoint; redirects to other hosts drop it).
    pub(crate) fn auth(&self, rb: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Sends `rb`, mapping transport failures to [`HubError::Network`].
    pub(crate) fn send(&self, rb: RequestBuilder, url: &str) -> Result<Response, HubError> {
        self.auth(rb).send().map_err(|e| HubError::Network {
            url: url.to_string(),
            detail: error_chain(&e),
        })
    }

    /// Sends `rb` and turns an error status into the error that names its cause.
    pub(crate) fn send_ok(
        &self,
        rb: RequestBuilder,
        url: &str,
        repo: &str,
    ) -> Result<Response, HubError> {
        let resp = self.send(rb, url)?;
        check_status(resp, url, repo, self.token.is_some())
    }
}

/// The error's message with its causes.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Passes a success (or a redirect) through; names the cause of an error status.
pub(crate) fn check_status(
    resp: Response,
    url: &str,
    repo: &str,
    have_token: bool,
) -> Result<Response, HubError> {
    let status = resp.status();
    if status.is_success() || status.is_redirection() {
        return Ok(resp);
    }
    let code = header(resp.headers(), "X-Error-Code").unwrap_or_default();
    let message = header(resp.headers(), "X-Error-Message");
    let body = resp.text().unwrap_or_default();
    let detail = message.unwrap_or_else(|| {
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| body.chars().take(300).collect())
    });
    let token_hint = if have_token {
        "the token in use (HF_TOKEN or the token file) has no access to it".to_string()
    } else {
        "no token was sent: set HF_TOKEN, or write one to $HF_HOME/token (`hf auth login`)"
            .to_string()
    };
    Err(match (status.as_u16(), code.as_str()) {
        (_, "GatedRepo") => HubError::Gated {
            repo: repo.into(),
            hint: format!("{token_hint}; accept the repo's conditions on its Hub page first"),
        },
        (_, "RepoNotFound") | (401, _) => HubError::RepoNotFound {
            repo: repo.into(),
            hint: format!("it does not exist, or it is private and {token_hint}"),
        },
        (_, "RevisionNotFound") => HubError::RevisionNotFound {
            repo: repo.into(),
            detail,
        },
        (403, _) => HubError::Unauthorized {
            repo: repo.into(),
            hint: token_hint,
        },
        _ => HubError::Http {
            url: url.into(),
            status: status.as_u16(),
            detail: if code.is_empty() {
                detail
            } else {
                format!("{code}: {detail}")
            },
        },
    })
}

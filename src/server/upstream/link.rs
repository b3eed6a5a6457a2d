//! One upstream's connection: its config, HTTP client, auth and limits (the kinds' files
//! send through it), and what a request there is for and how it fails.

use super::auth::Auth;
use super::config::UpstreamConfig;
use super::limits::{Limits, Refusal};
use crate::server::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// Which OpenAI endpoint a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat/completions",
            Endpoint::Completions => "completions",
        }
    }
}

/// An upstream's failure as the client sees it: the status, a message that names the
/// upstream, and the label `/metrics` counts it under.
#[derive(Debug, Clone)]
pub struct UpstreamError {
    pub status: u16,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// `status`, `timeout`, `unreachable`, `bad_response`, `stream`, `auth`,
    /// `rate_limited` (its own 429), `limit` (ours), `breaker`.
    pub label: &'static str,
}

impl UpstreamError {
    pub(super) fn new(status: u16, label: &'static str, message: String) -> Self {
        UpstreamError {
            status,
            message,
            retry_after: None,
            label,
        }
    }

    pub(super) fn refused(r: Refusal) -> Self {
        let (status, label) = if r.breaker {
            (503, "breaker")
        } else {
            (429, "limit")
        };
        UpstreamError {
            status,
            message: r.message,
            retry_after: Some(r.retry_after),
            label,
        }
    }

    /// The OpenAI error `type` it answers with.
    pub fn kind(&self) -> &'static str {
        match self.label {
            "limit" => "rate_limit_error",
            _ => "upstream_error",
        }
    }
}

/// One upstream, ready to take requests.
pub struct Upstream {
    pub cfg: UpstreamConfig,
    pub(super) client: reqwest::Client,
    pub(super) auth: Auth,
    pub(super) limits: Limits,
    /// Where the gateways count together (None: this process counts alone).
    pub(super) shared: Option<Arc<Shared>>,
}

impl Upstream {
    /// How long a request there may take (the whole answer, or the whole stream).
    pub(super) fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.cfg.timeout_s)
    }

    /// Tokens an answer used: against the day's budget, here and in the shared store.
    pub(super) fn spend(&self, tokens: u64) {
        self.limits.spend(tokens);
        if let Some(sh) = &self.shared {
            self.limits.shared_spend(self.name(), sh, tokens);
        }
    }

    pub(super) fn new(cfg: UpstreamConfig, shared: Option<Arc<Shared>>) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10).min(Duration::from_secs_f64(cfg.timeout_s)))
            .user_agent(concat!("kerze-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("upstream {}: no HTTP client: {e}", cfg.name))?;
        let auth = Auth::new(&cfg).map_err(|e| format!("upstream {}: {e}", cfg.name))?;
        let limits = Limits::new(
            cfg.requests_per_minute,
            cfg.requests_per_day,
            cfg.tokens_per_day,
            cfg.breaker_failures,
            Duration::from_secs_f64(cfg.breaker_cooldown_s),
        );
        Ok(Upstream {
            cfg,
            client,
            auth,
            limits,
            shared,
        })
    }
}

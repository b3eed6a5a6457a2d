//! The gateway's upstreams: where a request goes that the local model should not or cannot
//! answer (the reasons: [`crate::server::route`]). Each is declared in an `[[upstream]]`
//! table of `kerze serve --config FILE` and answers chat completions and completions, whole
//! or streamed; a dropped reply (the client went away) drops its HTTP request.
//!
//! - `config.rs`: the table's keys, typed, and what is checked at start;
//! - `auth.rs`: the bearer key from the environment, or a token (a command's, a service
//!   account's) kept until it expires; SigV4 for the AWS kinds;
//! - `google.rs`: a Google service account's OAuth token (the JWT bearer grant);
//! - `limits.rs`: requests per minute and day, the token budget, `Retry-After`, the breaker;
//! - `link.rs`: one upstream's connection (config, client, auth, limits) and its errors;
//! - `http.rs`: the POST every kind makes, its errors, and a streamed answer's chunks;
//! - `openai.rs`: the `openai` kind: any OpenAI-compatible `…/v1`, its SSE read into chunks;
//! - `token.rs`: a token command's or token endpoint's output, with its lifetime;
//! - `aws.rs`: AWS credentials and SigV4 (the SDK's signer); `eventstream.rs`: their
//!   streams' framing;
//! - `sagemaker.rs`: a SageMaker endpoint that takes the OpenAI chat shape;
//! - `bedrock.rs`: Bedrock's Converse API, mapped to and from OpenAI chat.

mod auth;
mod aws;
mod bedrock;
pub mod config;
mod eventstream;
mod google;
mod http;
mod limits;
mod link;
mod openai;
mod sagemaker;
mod token;

pub use config::{Kind, UpstreamConfig};
pub use http::{Chunks, Reply};
pub use limits::Refusal;
pub use link::{Endpoint, Upstream, UpstreamError};

use crate::server::route::Reason;
use crate::server::shared::Shared;
use std::sync::Arc;

impl Upstream {
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    pub fn takes(&self, reason: Reason) -> bool {
        self.cfg.when.contains(&reason)
    }

    /// Whether it answers `endpoint` (the AWS kinds: chat completions only).
    pub fn answers(&self, endpoint: Endpoint) -> bool {
        self.cfg.kind == Kind::Openai || endpoint == Endpoint::Chat
    }

    /// Whether its circuit breaker is open now.
    pub fn breaker_open(&self) -> bool {
        self.limits.open()
    }

    /// The model name to send for a request that named `asked` (None: the request's own).
    fn model_for(&self, reason: Reason, asked: Option<&str>) -> Option<String> {
        if let Some(m) = &self.cfg.model {
            return Some(m.clone());
        }
        match reason {
            Reason::Model => asked.map(str::to_string),
            _ => self.cfg.serves.first().cloned(),
        }
    }

    /// Send `body` (the client's request) to `endpoint`: whole, or streamed when `stream`.
    pub async fn send(
        self: &Arc<Self>,
        endpoint: Endpoint,
        reason: Reason,
        body: &serde_json::Value,
        stream: bool,
    ) -> Result<Reply, UpstreamError> {
        if !self.answers(endpoint) {
            return Err(UpstreamError::new(
                400,
                "status",
                format!(
                    "upstream {} ({}) answers chat completions only",
                    self.name(),
                    self.cfg.kind.as_str()
                ),
            ));
        }
        self.limits
            .admit(self.name())
            .map_err(UpstreamError::refused)?;
        let counted = match &self.shared {
            Some(sh) => self.limits.shared_quota(self.name(), sh).await,
            None => None,
        };
        counted
            .unwrap_or_else(|| self.limits.quota(self.name()))
            .map_err(|r| {
                self.limits.settled();
                UpstreamError::refused(r)
            })?;
        let mut body = body.clone();
        if let Some(m) = body.as_object_mut() {
            let asked = m.get("model").and_then(|v| v.as_str()).map(str::to_string);
            if let Some(model) = self.model_for(reason, asked.as_deref()) {
                m.insert("model".into(), model.into());
            }
            // kerze's own request keys, which another server may refuse.
            m.remove("cache");
            m.insert("stream".into(), stream.into());
            if stream {
                // The usage chunk counts the budget; a client that did not ask for it does
                // not get it.
                m.insert(
                    "stream_options".into(),
                    serde_json::json!({ "include_usage": true }),
                );
            } else {
                m.remove("stream_options");
            }
        }
        match self.cfg.kind {
            Kind::Openai => openai::send(self, endpoint, &body, stream).await,
            Kind::Sagemaker => sagemaker::send(self, &body, stream).await,
            Kind::Bedrock => bedrock::send(self, &body, stream).await,
        }
    }
}

/// The upstreams of a server, in the config's order (the first that takes a reason and is
/// not refusing gets the request).
#[derive(Default)]
pub struct Upstreams {
    list: Vec<Arc<Upstream>>,
}

impl Upstreams {
    /// The upstreams of these tables; what is wrong with them stops the server at start.
    pub fn new(
        cfgs: &[UpstreamConfig],
        local_model: &str,
        shared: Option<Arc<Shared>>,
    ) -> Result<Self, String> {
        let mut list: Vec<Arc<Upstream>> = Vec::new();
        for c in cfgs {
            c.check()?;
            if list.iter().any(|u| u.cfg.name == c.name) {
                return Err(format!("two upstreams are named {}", c.name));
            }
            for s in &c.serves {
                if s == local_model {
                    return Err(format!(
                        "upstream {} serves {s}, the local model's own name",
                        c.name
                    ));
                }
                if let Some(u) = list.iter().find(|u| u.cfg.serves.contains(s)) {
                    return Err(format!(
                        "upstreams {} and {} both serve {s}",
                        u.cfg.name, c.name
                    ));
                }
            }
            list.push(Arc::new(Upstream::new(c.clone(), shared.clone())?));
        }
        Ok(Upstreams { list })
    }

    pub fn all(&self) -> &[Arc<Upstream>] {
        &self.list
    }

    /// The upstream that serves the model name `model` (reason `model`).
    pub fn serving(&self, model: &str) -> Option<&Arc<Upstream>> {
        self.list
            .iter()
            .find(|u| u.takes(Reason::Model) && u.cfg.serves.iter().any(|s| s == model))
    }

    /// The upstreams that take `reason` and answer `endpoint`, those with a closed breaker
    /// first.
    pub fn taking(&self, reason: Reason, endpoint: Endpoint) -> Vec<Arc<Upstream>> {
        let mut v: Vec<Arc<Upstream>> = self
            .list
            .iter()
            .filter(|u| u.takes(reason) && u.answers(endpoint))
            .cloned()
            .collect();
        v.sort_by_key(|u| u.breaker_open());
        v
    }

    /// Every model name an upstream serves, with the upstream's name.
    pub fn models(&self) -> impl Iterator<Item = (&str, &str)> {
        self.list.iter().flat_map(|u| {
            u.cfg
                .serves
                .iter()
                .map(move |s| (s.as_str(), u.cfg.name.as_str()))
        })
    }
}

//! `kerze serve`: the engine behind an OpenAI-compatible HTTP API (axum on tokio).
//!
//! Routes: `POST /v1/chat/completions` (the model's chat template), `POST /v1/completions`
//! (a raw prompt), both whole or as server-sent events; `POST /v1/embeddings` (an encoder
//! model); `GET /v1/models[/{id}]` (the local model and the upstreams' ones); `GET /metrics`;
//! `GET /health` (503 while the model loads, no key needed). Requests run on [`slots`]: at most
//! `slots + queue` are admitted, the next gets 429 with `retry-after`. Every error is an
//! OpenAI error body ([`crate::openai::ErrorBody`]). The server keeps no state between
//! requests but each slot's KV cache (a request that extends the slot's last prompt reuses
//! it), so replicas behind any load balancer scale it.
//!
//! Shutdown (SIGTERM, Ctrl-C): new requests get 503, streams in flight finish (up to the
//! request timeout), then the process exits.
//!
//! - `options.rs`: how to serve ([`ServeOptions`]) and the default number of slots;
//! - `run.rs`: the listener, the model's load on slot 0, shutdown;
//! - `routes.rs`: the router, the fallbacks, `/health` and `/v1/models`;
//! - `access.rs`: the API key and CORS;
//! - `handlers.rs`: the POST endpoints (chat completions, completions, embeddings);
//! - `state.rs`: what the handlers share: readiness, admission, queueing, the response cache;
//! - `stream.rs`: a generation's events as a whole answer or as server-sent events;
//! - `api_error.rs`: an HTTP error with an OpenAI error body;
//! - `slots.rs`, `prefixes.rs`, `responses.rs`: the slots that run requests, the kept KV of
//!   chats' shared prefixes, the kept answers of deterministic requests;
//! - the gateway: `route.rs` (why a request goes upstream, and every answer's route tag),
//!   `upstream/` (the upstreams of `--config`: kinds, auth, limits, breaker), `relay.rs`
//!   (an upstream's answer passed on, and the takeover of a local answer that failed),
//!   `metrics.rs` (`/metrics`, Prometheus text), `shared.rs` (Redis or Valkey: the response
//!   cache and upstream counters several gateways share).

mod access;
mod api_error;
mod handlers;
mod metrics;
mod options;
pub mod prefixes;
mod relay;
pub mod responses;
pub mod route;
mod routes;
mod run;
mod shared;
pub mod slots;
mod state;
mod stream;
pub mod upstream;

pub use api_error::ApiError;
pub use options::{default_slots, ServeOptions};
pub use run::run;

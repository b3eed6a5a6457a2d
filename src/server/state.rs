//! What the handlers share: the options, the loaded model's info, the slots and their
//! admission, the response cache; readiness, the model check, ids, and a request's way to
//! its slot (admitted, queued, answered from the response cache when it can be).

use super::api_error::{ApiError, ApiResult};
use super::metrics::Metrics;
use super::options::ServeOptions;
use super::responses::{self, Entry};
use super::route::Reason;
use super::shared::Shared;
use super::slots::{Admission, Event, Input, Job, Pool};
use super::upstream::Upstreams;
use crate::engine::EngineInfo;
use crate::generate::Usage;
use crate::openai::{self, Meta};
use axum::http::StatusCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub(super) struct Loaded {
    pub(super) info: EngineInfo,
}

pub(super) struct AppState {
    pub(super) opts: ServeOptions,
    pub(super) loaded: OnceLock<Loaded>,
    pub(super) pool: Arc<Pool>,
    pub(super) admission: Arc<Admission>,
    pub(super) draining: AtomicBool,
    pub(super) created: u64,
    pub(super) ids: AtomicU64,
    pub(super) responses: Option<Arc<responses::ResponseCache>>,
    pub(super) upstreams: Upstreams,
    pub(super) metrics: Metrics,
    /// Redis or Valkey, shared with the other gateways (None: this process alone).
    pub(super) shared: Option<Arc<Shared>>,
}

/// A response cache key in the shared store.
fn shared_key(key: &str) -> String {
    format!("kerze:response:{key}")
}

/// A request's answer as [`AppState::answer`] starts it: its events, whether the response
/// cache had it (None: not cacheable), and the seed a sampled one runs on.
pub(super) struct Answer {
    pub(super) rx: UnboundedReceiver<Event>,
    pub(super) hit: Option<bool>,
    pub(super) seed: Option<u64>,
}

impl AppState {
    pub(super) fn ready(&self) -> ApiResult<&Loaded> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Shutting down",
            ));
        }
        self.loaded
            .get()
            .ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Loading model"))
    }

    pub(super) fn check_model(&self, model: Option<&str>) -> ApiResult<()> {
        match model {
            Some(m) if m != self.opts.model_id => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model '{m}' does not exist (this server runs '{}')",
                    self.opts.model_id
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn meta(&self, prefix: &str) -> Meta {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Meta {
            id: format!("{prefix}-{nanos:x}{n:x}"),
            created: nanos / 1_000_000_000,
            model: self.opts.model_id.clone(),
        }
    }

    /// Admit and queue a generation; wait until its slot has checked it (the status is known
    /// then).
    /// The events of an answer, and whether the response cache had it (None: not cacheable).
    /// A hit needs no slot: its pieces and end come from the file. A miss runs in a slot, and
    /// its answer is kept when it ends.
    pub(super) async fn answer(
        &self,
        endpoint: &str,
        body: &serde_json::Value,
        input: Input,
        generate: &openai::GenerateRequest,
        arrived: Instant,
    ) -> ApiResult<Answer> {
        let loaded = self.ready()?;
        let cache = self.responses.clone();
        let scope = format!("{endpoint}|{}|{}", loaded.info.backend, loaded.info.n_ctx);
        let mut opts = generate.options().map_err(|e| ApiError::from_engine(&e))?;
        // A sampled request runs on its seed, or on a fresh one (the cache's key is the
        // request's: one without a seed is never kept); either is reported.
        let seed = (opts.sampler.temperature > 0.0)
            .then(|| generate.seed.unwrap_or_else(crate::rng::fresh_seed));
        if let Some(s) = seed {
            opts.sampler.seed = s;
        }
        let Some((cache, key)) = cache.and_then(|c| c.key(&scope, body, generate).map(|k| (c, k)))
        else {
            let rx = self.submit(input, opts, arrived).await?;
            return Ok(Answer {
                rx,
                hit: None,
                seed,
            });
        };
        if let Some(e) = self.kept(&key).await.filter(|e| e.raw.is_none()) {
            let (tx, rx) = unbounded_channel();
            for p in e.pieces {
                let _ = tx.send(Event::Chunk(p));
            }
            let usage = Usage {
                prefill_tokens: 0,
                prefill_ms: 0.0,
                decode_ms: 0.0,
                ..e.usage
            };
            let _ = tx.send(Event::Done {
                finish: e.finish,
                usage,
            });
            return Ok(Answer {
                rx,
                hit: Some(true),
                seed,
            });
        }
        let mut inner = self.submit(input, opts, arrived).await?;
        let shared = self.shared.clone();
        let (tx, rx) = unbounded_channel();
        tokio::spawn(async move {
            let mut pieces = Vec::new();
            while let Some(ev) = inner.recv().await {
                if let Event::Chunk(t) = &ev {
                    pieces.push(t.clone());
                }
                if let Event::Done { finish, usage } = &ev {
                    let e = Entry::local(std::mem::take(&mut pieces), *finish, usage.clone());
                    keep(&cache, shared.as_ref(), key.clone(), e).await;
                }
                // The client went away: dropping `inner` tells the slot.
                if tx.send(ev).is_err() {
                    return;
                }
            }
        });
        Ok(Answer {
            rx,
            hit: Some(false),
            seed,
        })
    }

    /// The live kept answer for `key`: from the shared store, else this process's cache.
    pub(super) async fn kept(&self, key: &str) -> Option<Entry> {
        let cache = Arc::clone(self.responses.as_ref()?);
        if let Some(sh) = &self.shared {
            if let Some(Some(b)) = sh.get(&shared_key(key)).await {
                if let Some(e) = cache.live(&b) {
                    return Some(e);
                }
            }
        }
        let k = key.to_string();
        tokio::task::spawn_blocking(move || cache.get(&k))
            .await
            .ok()
            .flatten()
    }

    async fn submit(
        &self,
        input: Input,
        opts: crate::generate::GenerateOptions,
        arrived: Instant,
    ) -> ApiResult<UnboundedReceiver<Event>> {
        let loaded = self.ready()?;
        let n_ctx = loaded.info.n_ctx;
        if opts.max_tokens > n_ctx {
            return Err(ApiError {
                reason: Some(Reason::Context),
                ..ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "max_tokens {} is more than the context window ({n_ctx} tokens)",
                        opts.max_tokens
                    ),
                )
            });
        }
        let (first, rx) = self.queue(input, opts, arrived).await?;
        match first {
            Event::Started => Ok(rx),
            _ => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the slot stopped before the request started",
            )),
        }
    }

    /// Admit and queue a job; its first event (a failure is the error).
    pub(super) async fn queue(
        &self,
        input: Input,
        opts: crate::generate::GenerateOptions,
        arrived: Instant,
    ) -> ApiResult<(Event, UnboundedReceiver<Event>)> {
        let Some(ticket) = self.admission.admit() else {
            return Err(ApiError {
                retry_after: Some(1),
                reason: Some(Reason::Busy),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "the server is busy: {} slots and {} queued requests in use; retry later",
                        self.opts.slots.max(1),
                        self.opts.queue
                    ),
                )
            });
        };
        let (tx, mut rx) = unbounded_channel();
        let job = Job {
            input,
            opts,
            events: tx,
            deadline: arrived + self.opts.timeout,
            ticket,
        };
        if !self.pool.submit(job) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Shutting down",
            ));
        }
        match rx.recv().await {
            Some(Event::Failed(e)) => Err(ApiError::from_engine(&e)),
            Some(Event::TimedOut) => Err(ApiError::timed_out(self.opts.timeout)),
            Some(first) => Ok((first, rx)),
            None => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the slot stopped before the request started",
            )),
        }
    }
}

/// Keep an answer in this process's cache, before the answer's end reaches its client (a
/// repeat it sends at once finds it), and, where there is one, in the shared store (in the
/// background: the answer does not wait for Redis).
pub(super) async fn keep(
    cache: &Arc<responses::ResponseCache>,
    shared: Option<&Arc<Shared>>,
    key: String,
    e: Entry,
) {
    if let (Some(sh), Some(bytes)) = (shared.map(Arc::clone), e.bytes()) {
        let (k, ttl) = (shared_key(&key), cache.ttl());
        tokio::spawn(async move { sh.set(&k, &bytes, ttl).await });
    }
    let cache = Arc::clone(cache);
    let _ = tokio::task::spawn_blocking(move || cache.store(&key, &e)).await;
}

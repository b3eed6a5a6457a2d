//! `kerze serve`: the engine behind an OpenAI-compatible HTTP API (axum on tokio).
//!
//! Routes: `POST /v1/chat/completions` (the model's chat template), `POST /v1/completions`
//! (a raw prompt), both whole or as server-sent events; `POST /v1/embeddings` (an encoder
//! model); `GET /v1/models[/{id}]`; `GET /health`
//! (503 while the model loads, no key needed). Requests run on [`slots`]: at most
//! `slots + queue` are admitted, the next gets 429 with `retry-after`. Every error is an
//! OpenAI error body ([`crate::openai::ErrorBody`]). The server keeps no state between
//! requests but each slot's KV cache (a request that extends the slot's last prompt reuses
//! it), so replicas behind any load balancer scale it.
//!
//! Shutdown (SIGTERM, Ctrl-C): new requests get 503, streams in flight finish (up to the
//! request timeout), then the process exits.

pub mod prefixes;
pub mod responses;
pub mod slots;

use crate::engine::{EngineInfo, LoadOptions};
use crate::error::Error;
use crate::generate::{FinishReason, Usage};
use crate::openai::{self, ChatStream, ErrorBody, Meta};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use slots::{Admission, Event, Input, Job, Pool};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model file.
    pub path: PathBuf,
    /// The name `/v1/models` lists and requests may give (the catalog id or the file name
    /// without `.gguf`).
    pub model_id: String,
    pub load: LoadOptions,
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Origins a browser page may call from (`*`: any); none: no CORS headers.
    pub cors_origins: Vec<String>,
    pub slots: usize,
    pub queue: usize,
    /// Per request, from its arrival to its last token (queueing counts).
    pub timeout: Duration,
    /// The largest request body.
    pub max_body: usize,
    /// Keep answers to deterministic requests here (None: no response cache).
    pub response_cache: Option<responses::ResponseCacheOptions>,
    /// Keep the KV of chats' shared prefixes (None: only in each slot's own cache).
    pub prefix_cache: Option<prefixes::PrefixOptions>,
    /// Build the constraint engine's token trie before the server is ready.
    pub prepare_constraints: bool,
}

/// Slots by default: 2 when the machine has 2 cores or more (a burst interleaves instead of
/// waiting), up to 4.
pub fn default_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(2, 4).min(cores.max(1))
}

struct Loaded {
    info: EngineInfo,
}

struct AppState {
    opts: ServeOptions,
    loaded: OnceLock<Loaded>,
    pool: Arc<Pool>,
    admission: Arc<Admission>,
    draining: AtomicBool,
    created: u64,
    ids: AtomicU64,
    responses: Option<Arc<responses::ResponseCache>>,
}

/// An HTTP error with an OpenAI error body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The status an engine error answers with: the request's fault is 400, the rest 500.
    fn from_engine(e: &Error) -> Self {
        let status = match e {
            Error::InvalidArgument(_) | Error::ContextFull { .. } | Error::Tokenizer(_) => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }

    fn timed_out(after: Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the request took longer than the server's timeout ({} s)",
                after.as_secs()
            ),
        )
    }

    fn body(&self) -> ErrorBody {
        ErrorBody::new(self.status.as_u16(), self.message.clone())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

/// Serve until SIGTERM or Ctrl-C. Prints `kerze serve: listening on http://HOST:PORT` once
/// the port is bound (the model may still be loading: `/health` says when it is ready).
pub fn run(opts: ServeOptions) -> crate::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(opts))
}

async fn serve(opts: ServeOptions) -> crate::Result<()> {
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| Error::InvalidArgument(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr()?;
    // The model file's sha256 names it in what is kept on disk (hashed once, when needed).
    let needs_sha = opts.response_cache.is_some()
        || opts.prefix_cache.as_ref().is_some_and(|p| p.dir.is_some());
    let sha = if needs_sha {
        crate::catalog::sha256_file(&opts.path)?
    } else {
        opts.path.display().to_string()
    };
    let prefixes = match &opts.prefix_cache {
        Some(pc) => Some(Arc::new(
            prefixes::PrefixStore::open(pc.clone(), sha.clone()).map_err(|e| {
                Error::InvalidArgument(format!(
                    "the prefix cache {} cannot be used: {e}",
                    pc.dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                ))
            })?,
        )),
        None => None,
    };
    let responses = match &opts.response_cache {
        Some(rc) => {
            let c = responses::ResponseCache::open(rc.clone(), sha.clone()).map_err(|e| {
                Error::InvalidArgument(format!(
                    "the response cache {} cannot be used: {e}",
                    rc.dir.display()
                ))
            })?;
            Some(Arc::new(c))
        }
        None => None,
    };
    let (pool, ready) = Pool::start(
        opts.path.clone(),
        opts.load.clone(),
        opts.slots.max(1),
        prefixes,
        opts.prepare_constraints,
    );
    let state = Arc::new(AppState {
        admission: Admission::new(opts.slots.max(1) + opts.queue),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        opts,
        loaded: OnceLock::new(),
        pool: Arc::clone(&pool),
        draining: AtomicBool::new(false),
        ids: AtomicU64::new(0),
        responses,
    });
    eprintln!(
        "kerze serve: listening on http://{local} (loading {})",
        state.opts.model_id
    );

    // The load runs on slot 0's thread; a failed load ends the server.
    let (fail_tx, mut fail_rx) = tokio::sync::mpsc::channel::<Error>(1);
    {
        let state = Arc::clone(&state);
        std::thread::spawn(move || match ready.recv() {
            Ok(Ok(info)) => {
                eprintln!(
                    "kerze serve: ready: {} ({}, {}; {} slots, queue {}, n_ctx {})",
                    state.opts.model_id,
                    info.backend,
                    info.reason,
                    state.opts.slots.max(1),
                    state.opts.queue,
                    info.n_ctx
                );
                let _ = state.loaded.set(Loaded { info });
            }
            Ok(Err(e)) => {
                let _ = fail_tx.blocking_send(e);
            }
            Err(_) => {
                let _ =
                    fail_tx.blocking_send(Error::Backend("the slots stopped while loading".into()));
            }
        });
    }

    let app = router(Arc::clone(&state));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let failed = Arc::new(OnceLock::<Error>::new());
    {
        let (state, failed) = (Arc::clone(&state), Arc::clone(&failed));
        tokio::spawn(async move {
            tokio::select! {
                _ = terminated() => eprintln!("kerze serve: shutting down: finishing the requests in flight"),
                Some(e) = fail_rx.recv() => {
                    eprintln!("kerze serve: the model did not load: {e}");
                    let _ = failed.set(e);
                }
            }
            state.draining.store(true, Ordering::SeqCst);
            let _ = stop_tx.send(true);
        });
    }
    let mut stop = stop_rx.clone();
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    // In-flight requests get their timeout to finish, then the process goes anyway.
    let grace = state.opts.timeout + Duration::from_secs(1);
    let mut stop = stop_rx;
    tokio::select! {
        r = server => r?,
        _ = async move {
            let _ = stop.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => eprintln!("kerze serve: requests still open after {} s: closing them", grace.as_secs()),
    }
    // Slots finish their job (their clients are gone now) and exit.
    tokio::task::spawn_blocking(move || pool.stop()).await.ok();
    if let Some(e) = Arc::try_unwrap(failed).ok().and_then(|f| f.into_inner()) {
        return Err(e);
    }
    eprintln!("kerze serve: stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn terminated() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth,
        ));
    let mut app = Router::new()
        .route("/health", get(health))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::clone(&state));
    if let Some(cors) = cors(&state.opts.cors_origins) {
        app = app.layer(cors);
    }
    app
}

/// CORS for the listed origins only; a preflight echoes the headers it asks for (the
/// official clients send `X-Stainless-*`).
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([header::RETRY_AFTER])
            .max_age(Duration::from_secs(600)),
    )
}

async fn auth(State(st): State<Arc<AppState>>, req: Request<Body>, next: Next) -> Response {
    if let Some(key) = &st.opts.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same(given.as_bytes(), key.as_bytes()) {
            return ApiError::new(StatusCode::UNAUTHORIZED, "Invalid API Key").into_response();
        }
    }
    next.run(req).await
}

/// Equal, in time that depends on the lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.loaded.get() {
        None => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Loading model").into_response(),
        Some(_) if st.draining.load(Ordering::SeqCst) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Shutting down").into_response()
        }
        Some(l) => Json(serde_json::json!({
            "status": "ok",
            "model": st.opts.model_id,
            "backend": l.info.backend,
            "slots": st.opts.slots.max(1),
            "queue": st.opts.queue,
            "requests": st.admission.in_house(),
        }))
        .into_response(),
    }
}

fn model_object(st: &AppState) -> serde_json::Value {
    serde_json::json!({
        "id": st.opts.model_id,
        "object": "model",
        "created": st.created,
        "owned_by": "kerze",
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "object": "list", "data": [model_object(&st)] }))
}

async fn model(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    st.check_model(Some(&id))?;
    Ok(Json(model_object(&st)))
}

impl AppState {
    fn ready(&self) -> ApiResult<&Loaded> {
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

    fn check_model(&self, model: Option<&str>) -> ApiResult<()> {
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

    fn meta(&self, prefix: &str) -> Meta {
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
    async fn answer(
        &self,
        endpoint: &str,
        body: &serde_json::Value,
        input: Input,
        generate: &openai::GenerateRequest,
        arrived: Instant,
    ) -> ApiResult<(UnboundedReceiver<Event>, Option<bool>)> {
        let loaded = self.ready()?;
        let cache = self.responses.clone();
        let scope = format!("{endpoint}|{}|{}", loaded.info.backend, loaded.info.n_ctx);
        let Some((cache, key)) = cache.and_then(|c| c.key(&scope, body, generate).map(|k| (c, k)))
        else {
            return Ok((self.submit(input, generate, arrived).await?, None));
        };
        let (c, k) = (Arc::clone(&cache), key.clone());
        if let Some(e) = tokio::task::spawn_blocking(move || c.get(&k))
            .await
            .ok()
            .flatten()
        {
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
            return Ok((rx, Some(true)));
        }
        let mut inner = self.submit(input, generate, arrived).await?;
        let (tx, rx) = unbounded_channel();
        tokio::spawn(async move {
            let mut pieces = Vec::new();
            while let Some(ev) = inner.recv().await {
                if let Event::Chunk(t) = &ev {
                    pieces.push(t.clone());
                }
                if let Event::Done { finish, usage } = &ev {
                    let (finish, usage) = (*finish, usage.clone());
                    let pieces = std::mem::take(&mut pieces);
                    let c = Arc::clone(&cache);
                    let k = key.clone();
                    let _ =
                        tokio::task::spawn_blocking(move || c.put(&k, pieces, finish, usage)).await;
                }
                // The client went away: dropping `inner` tells the slot.
                if tx.send(ev).is_err() {
                    return;
                }
            }
        });
        Ok((rx, Some(false)))
    }

    async fn submit(
        &self,
        input: Input,
        generate: &openai::GenerateRequest,
        arrived: Instant,
    ) -> ApiResult<UnboundedReceiver<Event>> {
        let loaded = self.ready()?;
        let opts = generate.options().map_err(|e| ApiError::from_engine(&e))?;
        let n_ctx = loaded.info.n_ctx;
        if opts.max_tokens > n_ctx {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "max_tokens {} is more than the context window ({n_ctx} tokens)",
                    opts.max_tokens
                ),
            ));
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
    async fn queue(
        &self,
        input: Input,
        opts: crate::generate::GenerateOptions,
        arrived: Instant,
    ) -> ApiResult<(Event, UnboundedReceiver<Event>)> {
        let Some(ticket) = self.admission.admit() else {
            return Err(ApiError {
                retry_after: Some(1),
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

/// The body as JSON: 413 past the size limit, 400 when it does not parse. A body past the
/// limit is read on (and dropped) up to [`DRAIN_FACTOR`] × the limit, so that the client,
/// still sending, gets the 413 rather than a reset connection.
async fn read_json(st: &AppState, body: Body) -> ApiResult<serde_json::Value> {
    use futures_util::StreamExt;
    let limit = st.opts.max_body;
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            )
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            bytes.extend_from_slice(&chunk);
        } else if seen > limit.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
    if seen > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
    })
}

/// How far past the limit a body is read (and dropped) before the 413.
const DRAIN_FACTOR: usize = 16;

async fn chat_completions(State(st): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let arrived = Instant::now();
    st.ready()?;
    let v = read_json(&st, body).await?;
    let req = openai::parse_chat(&v).map_err(|e| ApiError::from_engine(&e))?;
    st.check_model(req.model.as_deref())?;
    let input = Input::Chat {
        messages: req.messages,
        chat: req.chat,
    };
    let (rx, hit) = st.answer("chat", &v, input, &req.generate, arrived).await?;
    let meta = st.meta("chatcmpl");
    if !req.stream {
        let (text, finish, usage) = collect(rx, st.opts.timeout).await?;
        let r = Json(openai::chat_completion(
            &meta,
            &text,
            finish,
            &usage,
            req.tool_calls,
        ))
        .into_response();
        return Ok(tagged(r, hit));
    }
    let frames = ChatStream::new(meta, req.include_usage).with_tool_calls(req.tool_calls);
    let first = vec![sse_json(&frames.start())];
    let r = sse(first, rx, frames, st.opts.timeout, |f, ev| match ev {
        Piece::Text(t) => f.push(&t).iter().map(sse_json).collect(),
        Piece::End(finish, usage) => f.finish(finish, &usage).iter().map(sse_json).collect(),
    });
    Ok(tagged(r, hit))
}

/// `x-kerze-cache: hit | miss` on an answer the response cache may hold (none when it is off
/// or the request is not deterministic).
fn tagged(mut r: Response, hit: Option<bool>) -> Response {
    if let Some(h) = hit {
        let v = HeaderValue::from_static(if h { "hit" } else { "miss" });
        r.headers_mut().insert("x-kerze-cache", v);
    }
    r
}

async fn completions(State(st): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let arrived = Instant::now();
    st.ready()?;
    let v = read_json(&st, body).await?;
    let req = openai::parse_completion(&v).map_err(|e| ApiError::from_engine(&e))?;
    st.check_model(req.model.as_deref())?;
    let input = match req.prompt {
        openai::Prompt::Text(t) => Input::Text(t),
        openai::Prompt::Ids(ids) => Input::Ids(ids),
    };
    let (rx, hit) = st
        .answer("completions", &v, input, &req.generate, arrived)
        .await?;
    let meta = st.meta("cmpl");
    if !req.stream {
        let (text, finish, usage) = collect(rx, st.opts.timeout).await?;
        let r = Json(openai::text_completion(
            &meta,
            Some(&text),
            Some(finish),
            Some(&usage),
        ))
        .into_response();
        return Ok(tagged(r, hit));
    }
    let include_usage = req.include_usage;
    let r = sse(
        Vec::new(),
        rx,
        meta,
        st.opts.timeout,
        move |m, ev| match ev {
            Piece::Text(t) => vec![sse_json(&openai::text_completion(m, Some(&t), None, None))],
            Piece::End(finish, usage) => {
                let mut out = vec![sse_json(&openai::text_completion(
                    m,
                    Some(""),
                    Some(finish),
                    None,
                ))];
                if include_usage {
                    out.push(sse_json(&openai::text_completion(
                        m,
                        None,
                        None,
                        Some(&usage),
                    )));
                }
                out
            }
        },
    );
    Ok(tagged(r, hit))
}

async fn embeddings(State(st): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let arrived = Instant::now();
    let loaded = st.ready()?;
    let v = read_json(&st, body).await?;
    let req = openai::parse_embeddings(&v).map_err(|e| ApiError::from_engine(&e))?;
    st.check_model(req.model.as_deref())?;
    if !loaded.info.family.is_encoder() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "this server runs {}, a decoder: embeddings come from an encoder model (bert)",
                st.opts.model_id
            ),
        ));
    }
    if let Some(d) = req.dimensions.filter(|&d| d != loaded.info.n_embd as u64) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "dimensions {d}: this model gives {} (no other size)",
                loaded.info.n_embd
            ),
        ));
    }
    let input = Input::Embed {
        texts: req.input,
        opts: crate::embed::EmbedOptions::default(),
    };
    let (first, _rx) = st
        .queue(input, crate::generate::GenerateOptions::default(), arrived)
        .await?;
    match first {
        Event::Embedded(e) => Ok(Json(openai::embeddings_response(
            &st.opts.model_id,
            &e.data,
            e.usage.prompt_tokens,
            req.encoding_format,
        ))
        .into_response()),
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the slot answered an embedding request with something else",
        )),
    }
}

/// The whole generation of a non-streamed request.
async fn collect(
    mut rx: UnboundedReceiver<Event>,
    timeout: Duration,
) -> ApiResult<(String, FinishReason, Usage)> {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Chunk(t)) => text.push_str(&t),
            Some(Event::Done { finish, usage }) => return Ok((text, finish, usage)),
            Some(Event::Failed(e)) => return Err(ApiError::from_engine(&e)),
            Some(Event::TimedOut) => return Err(ApiError::timed_out(timeout)),
            Some(Event::Started | Event::Embedded(_)) => {}
            None => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the slot stopped mid-generation",
                ))
            }
        }
    }
}

/// What a stream's framing turns into SSE data.
enum Piece {
    Text(String),
    End(FinishReason, Usage),
}

fn sse_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

/// An SSE response: `first`, then the framed events, then `[DONE]`; an error mid-stream is a
/// data object holding `error` (the official clients throw on it), then the stream ends.
fn sse<F: Send + 'static>(
    first: Vec<String>,
    rx: UnboundedReceiver<Event>,
    framer: F,
    timeout: Duration,
    frame: impl Fn(&mut F, Piece) -> Vec<String> + Send + 'static,
) -> Response {
    struct S<F, G> {
        rx: UnboundedReceiver<Event>,
        framer: F,
        frame: G,
        pending: std::collections::VecDeque<String>,
        done: bool,
        timeout: Duration,
    }
    let state = S {
        rx,
        framer,
        frame,
        pending: first.into(),
        done: false,
        timeout,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(d) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(d)), s));
            }
            if s.done {
                return None;
            }
            let error = |e: ApiError| sse_json(&e.body());
            match s.rx.recv().await {
                Some(Event::Chunk(t)) => {
                    let v = (s.frame)(&mut s.framer, Piece::Text(t));
                    s.pending.extend(v);
                }
                Some(Event::Done { finish, usage }) => {
                    let v = (s.frame)(&mut s.framer, Piece::End(finish, usage));
                    s.pending.extend(v);
                    s.pending.push_back("[DONE]".into());
                    s.done = true;
                }
                Some(Event::Failed(e)) => {
                    s.pending.push_back(error(ApiError::from_engine(&e)));
                    s.done = true;
                }
                Some(Event::TimedOut) => {
                    s.pending.push_back(error(ApiError::timed_out(s.timeout)));
                    s.done = true;
                }
                Some(Event::Started | Event::Embedded(_)) => {}
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the slot stopped mid-generation",
                    );
                    s.pending.push_back(error(e));
                    s.done = true;
                }
            }
        }
    });
    Sse::new(stream).into_response()
}

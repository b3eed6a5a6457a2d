//! Answers from upstreams, as the client gets them: the request sent to the first upstream
//! that takes its reason (the next one where that one refuses or fails), the answer passed
//! on whole or chunk by chunk with its route tagged, kept in the response cache when the
//! request is deterministic, and counted in `/metrics`. Also the takeover of a local answer
//! that failed midway: the upstream continues the text so far, as the page's fallback does
//! (pkg/route.js): the partial answer goes along as the assistant's start with
//! `continue_final_message`, or after a completion's prompt.

use super::api_error::{ApiError, ApiResult};
use super::responses::Entry;
use super::route::{Reason, Tag};
use super::slots::Event;
use super::state::{self, AppState};
use super::stream::{sse_json, Takeover};
use super::upstream::{Chunks, Endpoint, Reply, Upstream};
use crate::error::Error;
use crate::generate::{FinishReason, Usage};
use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::unbounded_channel;

/// A request as it may go upstream (its body borrowed: only a takeover keeps a copy).
pub(super) struct Ask<'a> {
    pub(super) endpoint: Endpoint,
    pub(super) body: &'a serde_json::Value,
    pub(super) stream: bool,
    /// The client asked for the stream's usage chunk.
    pub(super) include_usage: bool,
    pub(super) arrived: Instant,
}

impl<'a> Ask<'a> {
    pub(super) fn new(endpoint: Endpoint, body: &'a serde_json::Value, arrived: Instant) -> Self {
        Ask {
            endpoint,
            body,
            stream: body.get("stream").and_then(|s| s.as_bool()) == Some(true),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(|s| s.as_bool())
                == Some(true),
            arrived,
        }
    }
}

/// `v` as a JSON response with `kerze: { route, reason }`.
pub(super) fn json_with(mut v: serde_json::Value, tag: &Tag) -> Response {
    tag.mark(&mut v);
    Json(v).into_response()
}

/// `x-kerze-route` (and `x-kerze-cache` where the answer may be kept) on a response.
pub(super) fn route_headers(r: &mut Response, tag: &Tag, hit: Option<bool>) {
    if let Ok(v) = HeaderValue::from_str(tag.route()) {
        r.headers_mut().insert("x-kerze-route", v);
    }
    if let Some(h) = hit {
        let v = HeaderValue::from_static(if h { "hit" } else { "miss" });
        r.headers_mut().insert("x-kerze-cache", v);
    }
}

/// The upstream that serves the model the request names, if one does.
pub(super) fn model_route(st: &AppState, body: &serde_json::Value) -> Option<Arc<Upstream>> {
    let m = body.get("model")?.as_str()?;
    st.upstreams.serving(m).cloned()
}

/// The local route failed with `err`: where an upstream takes its reason, that upstream's
/// answer, else `err`.
pub(super) async fn instead(
    st: &Arc<AppState>,
    err: ApiError,
    ask: &Ask<'_>,
) -> ApiResult<Response> {
    let Some(reason) = err.reason else {
        return Err(err);
    };
    let ups = st.upstreams.taking(reason, ask.endpoint);
    if ups.is_empty() {
        return Err(err);
    }
    answer(st, reason, ups, ask)
        .await
        .map_err(|u| u.after(&err))
}

/// The first of `ups` that answers (an upstream that refuses or fails passes the request to
/// the next; a request the upstream calls the client's fault goes back to the client).
pub(super) async fn answer(
    st: &Arc<AppState>,
    reason: Reason,
    ups: Vec<Arc<Upstream>>,
    ask: &Ask<'_>,
) -> ApiResult<Response> {
    let mut last = None;
    for up in ups {
        let tag = Tag::upstream(up.name(), reason);
        let key = cache_key(st, &up, ask);
        if let Some(key) = &key {
            if let Some(raw) = cached(st, key).await {
                return Ok(replay(st, tag, raw, ask));
            }
        }
        match up.send(ask.endpoint, reason, ask.body, ask.stream).await {
            Ok(Reply::Whole(v)) => return Ok(whole(st, tag, v, key, ask).await),
            Ok(Reply::Stream(c)) => return Ok(streamed(st, tag, c, key, ask)),
            Err(e) => {
                st.metrics.upstream_error(up.name(), e.label);
                if e.label == "status" && (400..500).contains(&e.status) {
                    return Err(ApiError::upstream(e));
                }
                last = Some(e);
            }
        }
    }
    Err(last.map_or_else(
        || ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "no upstream takes it"),
        ApiError::upstream,
    ))
}

/// The response cache's key for this request at `up` (None: not deterministic, or no cache).
/// The scope names the upstream, the model it is asked for and the answer's shape.
fn cache_key(st: &AppState, up: &Upstream, ask: &Ask<'_>) -> Option<String> {
    let cache = st.responses.as_ref()?;
    let asked = ask.body.get("model").and_then(|m| m.as_str()).unwrap_or("");
    let model = up.cfg.model.as_deref().unwrap_or(asked);
    let shape = if ask.stream { "stream" } else { "whole" };
    let scope = format!(
        "upstream|{}|{model}|{}|{shape}",
        up.name(),
        ask.endpoint.path()
    );
    cache.key_json(&scope, ask.body)
}

async fn cached(st: &AppState, key: &str) -> Option<Vec<serde_json::Value>> {
    st.kept(key).await.and_then(|e| e.raw)
}

async fn keep(st: &AppState, key: String, raw: Vec<serde_json::Value>) {
    if let Some(cache) = &st.responses {
        state::keep(cache, st.shared.as_ref(), key, Entry::upstream(raw)).await;
    }
}

/// Prompt and completion tokens of an answer's (or a chunk's) `usage`.
fn usage_of(v: &serde_json::Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0),
    )
}

/// A chunk that carries only the usage (no choices): dropped for a client that did not ask.
fn usage_only(v: &serde_json::Value) -> bool {
    v.get("usage").is_some_and(|u| u.is_object())
        && v.get("choices")
            .and_then(|c| c.as_array())
            .is_none_or(|c| c.is_empty())
}

async fn whole(
    st: &AppState,
    tag: Tag,
    v: serde_json::Value,
    key: Option<String>,
    ask: &Ask<'_>,
) -> Response {
    let (p, c) = usage_of(&v);
    st.metrics.answered(&tag, p, c, ask.arrived);
    let hit = key.as_ref().map(|_| false);
    if let Some(k) = key {
        keep(st, k, vec![v.clone()]).await;
    }
    let mut r = json_with(v, &tag);
    route_headers(&mut r, &tag, hit);
    r
}

/// A kept answer, whole or streamed as it was.
fn replay(st: &AppState, tag: Tag, raw: Vec<serde_json::Value>, ask: &Ask<'_>) -> Response {
    let usage = raw
        .iter()
        .map(usage_of)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    st.metrics.answered(&tag, usage.0, usage.1, ask.arrived);
    if !ask.stream {
        let mut r = json_with(raw.into_iter().next().unwrap_or_default(), &tag);
        route_headers(&mut r, &tag, Some(true));
        return r;
    }
    let mut frames: Vec<String> = raw
        .iter()
        .filter(|v| ask.include_usage || !usage_only(v))
        .map(sse_json)
        .collect();
    if let Some(f) = frames.first_mut() {
        *f = tag.stamp(f);
    }
    frames.push("[DONE]".into());
    let events = futures_util::stream::iter(
        frames
            .into_iter()
            .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d))),
    );
    let mut r = Sse::new(events).into_response();
    route_headers(&mut r, &tag, Some(true));
    r
}

/// An upstream's stream passed on: its first chunk tagged, the usage chunk only where asked,
/// an error midway as a data object holding `error`; kept when it ends with `[DONE]`.
fn streamed(
    st: &Arc<AppState>,
    tag: Tag,
    chunks: Chunks,
    key: Option<String>,
    ask: &Ask<'_>,
) -> Response {
    struct S {
        st: Arc<AppState>,
        chunks: Chunks,
        tag: Tag,
        first: bool,
        include_usage: bool,
        kept: Option<(String, Vec<serde_json::Value>)>,
        usage: (u64, u64),
        arrived: Instant,
        done: bool,
    }
    let hit = key.as_ref().map(|_| false);
    let s = S {
        st: Arc::clone(st),
        chunks,
        tag: tag.clone(),
        first: true,
        include_usage: ask.include_usage,
        kept: key.map(|k| (k, Vec::new())),
        usage: (0, 0),
        arrived: ask.arrived,
        done: false,
    };
    let events = futures_util::stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            let data = match s.chunks.next().await {
                Some(Ok(v)) => {
                    if let Some((_, kept)) = &mut s.kept {
                        kept.push(v.clone());
                    }
                    if v.get("usage").is_some_and(|u| u.is_object()) {
                        s.usage = usage_of(&v);
                    }
                    if !s.include_usage && usage_only(&v) {
                        continue;
                    }
                    let d = sse_json(&v);
                    if std::mem::take(&mut s.first) {
                        s.tag.stamp(&d)
                    } else {
                        d
                    }
                }
                None => {
                    s.done = true;
                    s.st.metrics
                        .answered(&s.tag, s.usage.0, s.usage.1, s.arrived);
                    if let Some((k, kept)) = s.kept.take() {
                        keep(&s.st, k, kept).await;
                    }
                    "[DONE]".to_string()
                }
                Some(Err(e)) => {
                    s.done = true;
                    s.st.metrics
                        .upstream_error(s.chunks.upstream().name(), e.label);
                    sse_json(&ApiError::upstream(e).body())
                }
            };
            return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), s));
        }
    });
    let mut r = Sse::new(events).into_response();
    route_headers(&mut r, &tag, hit);
    r
}

/// What continues this local answer at an upstream if it fails midway (None: no upstream
/// takes `error`).
pub(super) fn takeover(st: &Arc<AppState>, ask: &Ask<'_>) -> Option<Takeover> {
    let ups = st.upstreams.taking(Reason::Error, ask.endpoint);
    if ups.is_empty() {
        return None;
    }
    let (st, endpoint, body) = (Arc::clone(st), ask.endpoint, ask.body.clone());
    Some(Box::new(move |partial: String| {
        Box::pin(async move {
            let cont = continuation(endpoint, &body, &partial).ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "the local answer failed midway, and its upstream cannot continue it (a prompt of token ids, or a constrained answer already begun)",
                )
            })?;
            let mut last = None;
            for up in ups {
                match up.send(endpoint, Reason::Error, &cont, true).await {
                    Ok(Reply::Stream(c)) => {
                        return Ok((
                            events_of(&st, c, endpoint),
                            Tag::upstream(up.name(), Reason::Error),
                        ))
                    }
                    Ok(Reply::Whole(_)) => {}
                    Err(e) => {
                        st.metrics.upstream_error(up.name(), e.label);
                        last = Some(e);
                    }
                }
            }
            Err(last.map_or_else(
                || {
                    ApiError::new(
                        axum::http::StatusCode::BAD_GATEWAY,
                        "no upstream continued it",
                    )
                },
                ApiError::upstream,
            ))
        }) as futures_util::future::BoxFuture<'static, _>
    }))
}

/// The request that continues `partial`: a chat with the partial answer as the assistant's
/// start (`continue_final_message`), a text prompt with it appended. None where that cannot
/// be sent: token ids, or a constrained answer already begun.
fn continuation(
    endpoint: Endpoint,
    body: &serde_json::Value,
    partial: &str,
) -> Option<serde_json::Value> {
    let mut b = body.clone();
    if partial.is_empty() {
        return Some(b);
    }
    let constrained = [
        "response_format",
        "tools",
        "guided_json",
        "grammar",
        "choices",
    ]
    .iter()
    .any(|k| body.get(*k).is_some_and(|v| !v.is_null()));
    if constrained {
        return None;
    }
    let m = b.as_object_mut()?;
    match endpoint {
        Endpoint::Chat => {
            let msgs = m.get_mut("messages")?.as_array_mut()?;
            msgs.push(serde_json::json!({ "role": "assistant", "content": partial }));
            m.insert("continue_final_message".into(), true.into());
        }
        Endpoint::Completions => {
            let p = m.get("prompt")?.as_str()?;
            let p = format!("{p}{partial}");
            m.insert("prompt".into(), p.into());
        }
    }
    Some(b)
}

/// An upstream's continuation as a slot's events (its text pieces, then its end), read
/// until the client goes away (which drops the upstream's request).
fn events_of(
    st: &Arc<AppState>,
    mut chunks: Chunks,
    endpoint: Endpoint,
) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    let st = Arc::clone(st);
    tokio::spawn(async move {
        let mut finish = FinishReason::Stop;
        let mut usage = Usage::default();
        loop {
            let next = tokio::select! {
                _ = tx.closed() => return,
                n = chunks.next() => n,
            };
            match next {
                Some(Ok(v)) => {
                    let choice = &v["choices"][0];
                    let text = match endpoint {
                        Endpoint::Chat => choice["delta"]["content"].as_str(),
                        Endpoint::Completions => choice["text"].as_str(),
                    };
                    if choice["finish_reason"].as_str() == Some("length") {
                        finish = FinishReason::Length;
                    }
                    if v.get("usage").is_some_and(|u| u.is_object()) {
                        let (p, c) = usage_of(&v);
                        usage.prompt_tokens = p as usize;
                        usage.completion_tokens = c as usize;
                    }
                    if let Some(t) = text.filter(|t| !t.is_empty()) {
                        if tx.send(Event::Chunk(t.to_string())).is_err() {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    let name = chunks.upstream().name().to_string();
                    st.metrics.upstream_error(&name, e.label);
                    let _ = tx.send(Event::Failed(Error::Backend(e.message)));
                    return;
                }
                None => {
                    let _ = tx.send(Event::Done { finish, usage });
                    return;
                }
            }
        }
    });
    rx
}

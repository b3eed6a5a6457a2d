//! A generation's events as an answer: collected whole, or framed as server-sent events
//! that end with `[DONE]` (an error mid-stream is a data object holding `error`). Where an
//! upstream takes a local answer over that failed midway ([`Takeover`]), its continuation's
//! events follow the local ones in the same answer.

use super::api_error::{ApiError, ApiResult};
use super::route::Tag;
use super::slots::Event;
use crate::generate::{FinishReason, Usage};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// What continues a local answer that failed midway: given the text so far, the events of
/// the rest (from an upstream) and the tag of the route that gives them.
pub(super) type Takeover = Box<
    dyn FnOnce(String) -> BoxFuture<'static, ApiResult<(UnboundedReceiver<Event>, Tag)>> + Send,
>;

/// The whole generation of a non-streamed request, and the tag of the route that finished it
/// when an upstream took it over.
pub(super) async fn collect(
    mut rx: UnboundedReceiver<Event>,
    timeout: Duration,
    mut takeover: Option<Takeover>,
) -> ApiResult<(String, FinishReason, Usage, Option<Tag>)> {
    let mut text = String::new();
    let mut took = None;
    loop {
        match rx.recv().await {
            Some(Event::Chunk(t)) => text.push_str(&t),
            Some(Event::Done { finish, usage }) => return Ok((text, finish, usage, took)),
            Some(Event::Failed(e)) => match takeover.take() {
                Some(t) => {
                    let local = ApiError::from_engine(&e);
                    let (next, tag) = t(text.clone()).await.map_err(|u| u.after(&local))?;
                    rx = next;
                    took = Some(tag);
                }
                None => return Err(ApiError::from_engine(&e)),
            },
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
pub(super) enum Piece {
    Text(String),
    End(FinishReason, Usage),
}

pub(super) fn sse_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

/// What is told of a streamed answer once it is done: the tag of its last route, its usage.
pub(super) type OnDone = Box<dyn FnOnce(&Tag, &Usage) + Send>;

/// How a streamed answer is routed: the tag its first chunk carries, what takes it over if
/// it fails midway, and what is told of it once it is done (its last tag and usage).
pub(super) struct Routing {
    pub(super) tag: Tag,
    pub(super) takeover: Option<Takeover>,
    pub(super) done: OnDone,
}

/// An SSE response: `first`, then the framed events, then `[DONE]`; an error mid-stream is a
/// data object holding `error` (the official clients throw on it), then the stream ends. The
/// first data object carries `kerze: { route, reason }`, and so does the first after a
/// takeover.
pub(super) fn sse<F: Send + 'static>(
    first: Vec<String>,
    rx: UnboundedReceiver<Event>,
    framer: F,
    timeout: Duration,
    routing: Routing,
    frame: impl Fn(&mut F, Piece) -> Vec<String> + Send + 'static,
) -> Response {
    struct S<F, G> {
        rx: UnboundedReceiver<Event>,
        framer: F,
        frame: G,
        pending: std::collections::VecDeque<String>,
        done: bool,
        timeout: Duration,
        /// The tag, until a data object has carried it.
        stamp: Option<Tag>,
        tag: Tag,
        takeover: Option<Takeover>,
        text: String,
        on_done: Option<OnDone>,
    }
    let state = S {
        rx,
        framer,
        frame,
        pending: first.into(),
        done: false,
        timeout,
        stamp: Some(routing.tag.clone()),
        tag: routing.tag,
        takeover: routing.takeover,
        text: String::new(),
        on_done: Some(routing.done),
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(mut d) = s.pending.pop_front() {
                if d != "[DONE]" {
                    if let Some(t) = s.stamp.take() {
                        d = t.stamp(&d);
                    }
                }
                return Some((Ok::<_, Infallible>(SseEvent::default().data(d)), s));
            }
            if s.done {
                return None;
            }
            let error = |e: ApiError| sse_json(&e.body());
            match s.rx.recv().await {
                Some(Event::Chunk(t)) => {
                    if s.takeover.is_some() {
                        s.text.push_str(&t);
                    }
                    let v = (s.frame)(&mut s.framer, Piece::Text(t));
                    s.pending.extend(v);
                }
                Some(Event::Done { finish, usage }) => {
                    if let Some(f) = s.on_done.take() {
                        f(&s.tag, &usage);
                    }
                    let v = (s.frame)(&mut s.framer, Piece::End(finish, usage));
                    s.pending.extend(v);
                    s.pending.push_back("[DONE]".into());
                    s.done = true;
                }
                Some(Event::Failed(e)) => match s.takeover.take() {
                    Some(t) => {
                        let local = ApiError::from_engine(&e);
                        match t(std::mem::take(&mut s.text)).await {
                            Ok((next, tag)) => {
                                s.rx = next;
                                s.stamp = Some(tag.clone());
                                s.tag = tag;
                            }
                            Err(u) => {
                                s.pending.push_back(error(u.after(&local)));
                                s.done = true;
                            }
                        }
                    }
                    None => {
                        s.pending.push_back(error(ApiError::from_engine(&e)));
                        s.done = true;
                    }
                },
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

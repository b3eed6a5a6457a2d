//! A generation's events as an answer: collected whole, or framed as server-sent events
//! that end with `[DONE]` (an error mid-stream is a data object holding `error`).

use super::api_error::{ApiError, ApiResult};
use super::slots::Event;
use crate::generate::{FinishReason, Usage};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// The whole generation of a non-streamed request.
pub(super) async fn collect(
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
pub(super) enum Piece {
    Text(String),
    End(FinishReason, Usage),
}

pub(super) fn sse_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

/// An SSE response: `first`, then the framed events, then `[DONE]`; an error mid-stream is a
/// data object holding `error` (the official clients throw on it), then the stream ends.
pub(super) fn sse<F: Send + 'static>(
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

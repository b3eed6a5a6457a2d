//! The `sagemaker` kind: a SageMaker real-time endpoint whose container takes the OpenAI chat
//! shape (the LMI and TGI containers' Messages API). `POST {url or
//! https://runtime.sagemaker.{region}.amazonaws.com}/endpoints/{endpoint}/invocations`, signed
//! with SigV4 (service `sagemaker`); streamed through `invocations-response-stream`, whose
//! AWS event-stream `PayloadPart`s carry the container's own stream (server-sent events or
//! JSON lines) in pieces that may cut a line anywhere.

use super::aws;
use super::eventstream::Messages;
use super::http::{self, Chunks, Lines, Reply};
use super::link::{Upstream, UpstreamError};
use futures_util::StreamExt;
use std::sync::Arc;

fn url(up: &Upstream, stream: bool) -> String {
    let base = match &up.cfg.url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!(
            "https://runtime.sagemaker.{}.amazonaws.com",
            aws::region(up.cfg.region.as_deref()).unwrap_or_default()
        ),
    };
    let endpoint = up.cfg.endpoint.as_deref().unwrap_or("");
    let path = if stream {
        "invocations-response-stream"
    } else {
        "invocations"
    };
    format!("{base}/endpoints/{}/{path}", aws::path_segment(endpoint))
}

pub(super) async fn send(
    up: &Arc<Upstream>,
    body: &serde_json::Value,
    stream: bool,
) -> Result<Reply, UpstreamError> {
    let resp = http::post(up, &url(up, stream), body).await?;
    if !stream {
        let v = http::json(up, resp).await?;
        return http::completion(up, v).map(Reply::Whole);
    }
    struct S {
        messages: Messages,
        lines: Lines,
        name: String,
        done: bool,
    }
    let s = S {
        messages: Messages::new(http::bytes(up, resp), up.name()),
        lines: Lines::default(),
        name: up.name().to_string(),
        done: false,
    };
    let chunks = futures_util::stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            if let Some(d) = s.lines.next() {
                let c = http::event(&s.name, &d)?;
                s.done = c.is_err();
                return Some((c, s));
            }
            match s.messages.next().await {
                Some(Ok(m)) if m.kind == "event" => {
                    if m.event == "PayloadPart" {
                        s.lines.push(&m.payload);
                    }
                }
                Some(Ok(m)) => {
                    s.done = true;
                    return Some((Err(m.error(&s.name)), s));
                }
                Some(Err(e)) => {
                    s.done = true;
                    return Some((Err(e), s));
                }
                None => {
                    // The framing ended whole; the container's last line may lack its newline.
                    s.done = true;
                    let c = http::event(&s.name, &s.lines.finish()?)?;
                    return Some((c, s));
                }
            }
        }
    });
    Ok(Reply::Stream(Chunks::new(up, chunks.boxed())))
}

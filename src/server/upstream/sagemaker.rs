//! The `sagemaker` kind: a SageMaker real-time endpoint whose container takes the OpenAI chat
//! shape (the LMI and TGI containers' Messages API). `POST {url or
//! https://runtime.sagemaker.{region}.amazonaws.com}/endpoints/{endpoint}/invocations`, signed
//! with SigV4 (service `sagemaker`); streamed through `invocations-response-stream`, whose
//! AWS event-stream `PayloadPart`s carry the container's own stream (server-sent events or
//! JSON lines) in pieces that may cut a line anywhere.

use super::aws::{self, Frames};
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
        bytes: futures_util::stream::BoxStream<'static, Result<Vec<u8>, UpstreamError>>,
        frames: Frames,
        lines: Lines,
        name: String,
        done: bool,
    }
    let s = S {
        bytes: http::bytes(up, resp),
        frames: Frames::default(),
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
                if d.trim() == "[DONE]" {
                    return None;
                }
                let c = http::chunk_of(&s.name, &d);
                s.done = c.is_err();
                return Some((c, s));
            }
            match s.frames.next() {
                Ok(Some(m)) if m.kind == "event" && m.event == "PayloadPart" => {
                    s.lines.push(&m.payload);
                    continue;
                }
                Ok(Some(m)) if m.kind == "event" => continue,
                Ok(Some(m)) => {
                    s.done = true;
                    let said = serde_json::from_slice::<serde_json::Value>(&m.payload)
                        .ok()
                        .and_then(|v| {
                            v["Message"]
                                .as_str()
                                .or(v["message"].as_str())
                                .map(str::to_string)
                        })
                        .unwrap_or_else(|| http::quote(&String::from_utf8_lossy(&m.payload)));
                    let e =
                        http::stream_error(&s.name, format!("failed midway: {}: {said}", m.event));
                    return Some((Err(e), s));
                }
                Ok(None) => {}
                Err(e) => {
                    s.done = true;
                    return Some((Err(http::stream_error(&s.name, e)), s));
                }
            }
            match s.bytes.next().await {
                Some(Ok(b)) => s.frames.push(&b),
                Some(Err(e)) => {
                    s.done = true;
                    return Some((Err(e), s));
                }
                None => {
                    s.done = true;
                    if s.frames.rest() > 0 {
                        let e = http::stream_error(
                            &s.name,
                            "its event stream broke off inside a message".into(),
                        );
                        return Some((Err(e), s));
                    }
                    // The framing ended whole; the container's last line may lack its newline.
                    return match s.lines.finish() {
                        Some(d) if d.trim() != "[DONE]" => Some((http::chunk_of(&s.name, &d), s)),
                        _ => None,
                    };
                }
            }
        }
    });
    Ok(Reply::Stream(Chunks::new(up, chunks.boxed())))
}

//! The `openai` kind: `POST {url}/chat/completions` or `{url}/completions` with a bearer
//! token; a streamed answer's server-sent events read into chunks up to `[DONE]` (a stream
//! that ends before it broke off).

use super::http::{self, Chunks, Lines, Reply};
use super::link::{Endpoint, Upstream, UpstreamError};
use futures_util::StreamExt;
use std::sync::Arc;

pub(super) async fn send(
    up: &Arc<Upstream>,
    endpoint: Endpoint,
    body: &serde_json::Value,
    stream: bool,
) -> Result<Reply, UpstreamError> {
    let base = up.cfg.url.as_deref().unwrap_or("").trim_end_matches('/');
    let url = format!("{base}/{}", endpoint.path());
    let resp = http::post(up, &url, body).await?;
    if !stream {
        let v = http::json(up, resp).await?;
        return http::completion(up, v).map(Reply::Whole);
    }
    struct S {
        bytes: futures_util::stream::BoxStream<'static, Result<Vec<u8>, UpstreamError>>,
        lines: Lines,
        name: String,
        done: bool,
    }
    let s = S {
        bytes: http::bytes(up, resp),
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
            match s.bytes.next().await {
                Some(Ok(b)) => s.lines.push(&b),
                Some(Err(e)) => {
                    s.done = true;
                    return Some((Err(e), s));
                }
                None => {
                    s.done = true;
                    let e =
                        http::stream_error(&s.name, "its event stream ended before [DONE]".into());
                    return Some((Err(e), s));
                }
            }
        }
    });
    Ok(Reply::Stream(Chunks::new(up, chunks.boxed())))
}

//! What every kind's HTTP shares: the POST (authorized, with the upstream's headers and
//! timeout; a token command's refused token fetched again once), a non-2xx answer as the
//! client's error, a whole answer's JSON, a streamed answer's bytes, server-sent events or
//! JSON lines read into objects, and the chunks a kind makes of them. Every outcome is told to
//! the upstream's limits: a 5xx, a timeout, no connection, a body or stream that does not
//! parse count for its breaker; its 429 holds it for its `Retry-After`; its usage counts
//! against the token budget.

use super::link::{Upstream, UpstreamError};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// How much of an upstream's error body a message quotes.
const QUOTE: usize = 300;

/// A reply: the whole answer's JSON (OpenAI's chat or text completion), or its chunks as
/// they come.
pub enum Reply {
    Whole(serde_json::Value),
    Stream(Chunks),
}

pub(super) fn quote(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= QUOTE {
        return s.to_string();
    }
    format!("{}…", s.chars().take(QUOTE).collect::<String>())
}

/// Prompt and completion tokens in all, from OpenAI's `usage`.
pub(super) fn usage_tokens(v: &serde_json::Value) -> u64 {
    let u = &v["usage"];
    u["total_tokens"].as_u64().unwrap_or_else(|| {
        u["prompt_tokens"].as_u64().unwrap_or(0) + u["completion_tokens"].as_u64().unwrap_or(0)
    })
}

pub(super) fn transport_error(name: &str, e: &reqwest::Error, timeout: Duration) -> UpstreamError {
    if e.is_timeout() {
        UpstreamError::new(
            504,
            "timeout",
            format!(
                "upstream {name} did not answer within its timeout ({} s)",
                timeout.as_secs_f64()
            ),
        )
    } else {
        // The error's chain says why (refused connection, TLS, DNS).
        let mut why = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            why = format!("{why}: {s}");
            src = s.source();
        }
        UpstreamError::new(
            502,
            "unreachable",
            format!("upstream {name} cannot be reached: {why}"),
        )
    }
}

/// POST `body` to `url`, authorized; a 2xx response, or the client's error.
pub(super) async fn post(
    up: &Upstream,
    url: &str,
    body: &serde_json::Value,
) -> Result<reqwest::Response, UpstreamError> {
    let name = up.name();
    let timeout = up.timeout();
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut retried = false;
    let resp = loop {
        let mut req = up
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes.clone())
            .timeout(timeout);
        for (k, v) in &up.cfg.headers {
            req = req.header(k, v);
        }
        let mut req = match req.build() {
            Ok(r) => r,
            Err(e) => {
                return Err(UpstreamError::new(
                    502,
                    "unreachable",
                    format!("upstream {name}: the request cannot be made ({url}): {e}"),
                ))
            }
        };
        if let Err(e) = up.auth.authorize(&mut req, &up.client).await {
            up.limits.failed();
            return Err(UpstreamError::new(
                502,
                "auth",
                format!("upstream {name}: cannot authorize: {e}"),
            ));
        }
        let resp = match up.client.execute(req).await {
            Ok(r) => r,
            Err(e) => {
                up.limits.failed();
                return Err(transport_error(name, &e, timeout));
            }
        };
        // A refused token from a command: run it again once (it may have been revoked).
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED && !retried && up.auth.refused().await
        {
            retried = true;
            continue;
        }
        break resp;
    };
    if !resp.status().is_success() {
        return Err(refused(up, resp).await);
    }
    Ok(resp)
}

/// A whole answer's JSON (a 2xx body that does not parse counts against the upstream).
pub(super) async fn json(
    up: &Upstream,
    resp: reqwest::Response,
) -> Result<serde_json::Value, UpstreamError> {
    let name = up.name();
    let text = match resp.text().await {
        Ok(t) => t,
        Err(e) => {
            up.limits.failed();
            return Err(transport_error(name, &e, up.timeout()));
        }
    };
    serde_json::from_str::<serde_json::Value>(&text).map_err(|_| bad_response(up, &text))
}

pub(super) fn bad_response(up: &Upstream, text: &str) -> UpstreamError {
    up.limits.failed();
    UpstreamError::new(
        502,
        "bad_response",
        format!(
            "upstream {} answered with something that is not a completion: {}",
            up.name(),
            quote(text)
        ),
    )
}

/// A whole chat or text completion, told to the limits (a success, its tokens spent).
pub(super) fn completion(
    up: &Upstream,
    v: serde_json::Value,
) -> Result<serde_json::Value, UpstreamError> {
    if !v.get("choices").is_some_and(|c| c.is_array()) {
        return Err(bad_response(up, &v.to_string()));
    }
    up.limits.succeeded();
    up.spend(usage_tokens(&v));
    Ok(v)
}

/// A non-2xx answer as the client's error.
async fn refused(up: &Upstream, resp: reqwest::Response) -> UpstreamError {
    let name = up.name();
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    // AWS names the error in a header.
    let aws_kind = resp
        .headers()
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(':').next().unwrap_or(v).to_string());
    let text = resp.text().await.unwrap_or_default();
    // The upstream's own message: OpenAI's error object, or AWS's `message`.
    let v = serde_json::from_str::<serde_json::Value>(&text).ok();
    let said = v
        .as_ref()
        .and_then(|v| {
            v["error"]["message"]
                .as_str()
                .or(v["message"].as_str())
                .or(v["Message"].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| quote(&text));
    let said = match aws_kind {
        Some(k) => format!("{k}: {said}"),
        None => said,
    };
    let code = status.as_u16();
    match code {
        429 => {
            let wait = retry_after.unwrap_or(Duration::from_secs(1));
            up.limits.hold(wait);
            UpstreamError {
                retry_after: Some(wait),
                ..UpstreamError::new(
                    429,
                    "rate_limited",
                    format!("upstream {name} is rate limiting (429): {said}"),
                )
            }
        }
        401 | 403 => {
            up.limits.failed();
            UpstreamError::new(
                502,
                "auth",
                format!("upstream {name} refused the gateway's credentials ({code}): {said}"),
            )
        }
        // SageMaker's ModelError: the container failed, not the request.
        424 => {
            up.limits.failed();
            UpstreamError::new(
                502,
                "status",
                format!("upstream {name}'s model failed ({code}): {said}"),
            )
        }
        400..=499 => {
            // The request's own fault: the client gets the status, the upstream is healthy.
            up.limits.settled();
            UpstreamError::new(code, "status", format!("upstream {name} ({code}): {said}"))
        }
        _ => {
            up.limits.failed();
            UpstreamError::new(
                502,
                "status",
                format!("upstream {name} failed ({code}): {said}"),
            )
        }
    }
}

/// A response's body as it arrives; a transport error midway names the upstream.
pub(super) fn bytes(
    up: &Upstream,
    resp: reqwest::Response,
) -> BoxStream<'static, Result<Vec<u8>, UpstreamError>> {
    let (name, timeout) = (up.name().to_string(), up.timeout());
    resp.bytes_stream()
        .map(move |r| {
            r.map(|b| b.to_vec()).map_err(|e| {
                let mut err = transport_error(&name, &e, timeout);
                if err.label != "timeout" {
                    err.label = "stream";
                }
                err.message = format!("{} (midway through the stream)", err.message);
                err
            })
        })
        .boxed()
}

pub(super) fn stream_error(name: &str, what: String) -> UpstreamError {
    UpstreamError::new(502, "stream", format!("upstream {name}: {what}"))
}

/// Server-sent events' data, or JSON lines, as they arrive: each event's `data:` lines
/// joined, or a bare line that starts with `{`.
#[derive(Default)]
pub(super) struct Lines {
    buf: Vec<u8>,
    data: String,
}

impl Lines {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next event's data (`[DONE]` included), if a whole one has arrived.
    pub(super) fn next(&mut self) -> Option<String> {
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    return Some(std::mem::take(&mut self.data));
                }
                continue;
            }
            if let Some(d) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(d.strip_prefix(' ').unwrap_or(d));
            } else if line.starts_with('{') && self.data.is_empty() {
                return Some(line.to_string());
            }
            // Comments, `event:`, `id:`, `retry:` say nothing to a chunk reader.
        }
        None
    }

    /// At the end of the body: an event or line left without its blank line or newline.
    pub(super) fn finish(&mut self) -> Option<String> {
        if !self.buf.is_empty() {
            self.buf.push(b'\n');
        }
        self.buf.push(b'\n');
        self.next()
    }
}

/// One event's data: None at `[DONE]`, else its chunk.
pub(super) fn event(name: &str, data: &str) -> Option<Result<serde_json::Value, UpstreamError>> {
    (data.trim() != "[DONE]").then(|| chunk_of(name, data))
}

/// One event's data as a chunk: its JSON object, or the error it carries or is.
pub(super) fn chunk_of(name: &str, data: &str) -> Result<serde_json::Value, UpstreamError> {
    match serde_json::from_str::<serde_json::Value>(data) {
        Ok(v) if v.get("error").is_some() => {
            let said = v["error"]["message"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap_or("(no message)");
            Err(stream_error(name, format!("failed midway: {said}")))
        }
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) | Err(_) => Err(stream_error(
            name,
            format!("sent an event that is not a chunk: {}", quote(data)),
        )),
    }
}

/// A streamed answer's chunks (OpenAI's chunk objects, whatever the kind). Dropping it (the
/// client went away) closes the upstream's connection.
pub struct Chunks {
    up: Arc<Upstream>,
    inner: BoxStream<'static, Result<serde_json::Value, UpstreamError>>,
    ended: bool,
}

impl Chunks {
    pub(super) fn new(
        up: &Arc<Upstream>,
        inner: BoxStream<'static, Result<serde_json::Value, UpstreamError>>,
    ) -> Self {
        Chunks {
            up: Arc::clone(up),
            inner,
            ended: false,
        }
    }

    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.up
    }

    /// The next chunk; None at the answer's end. A stream that breaks off, does not parse or
    /// carries an error ends with that error.
    pub async fn next(&mut self) -> Option<Result<serde_json::Value, UpstreamError>> {
        if self.ended {
            return None;
        }
        match self.inner.next().await {
            Some(Ok(v)) => {
                if v.get("usage").is_some_and(|u| u.is_object()) {
                    self.up.spend(usage_tokens(&v));
                }
                Some(Ok(v))
            }
            Some(Err(e)) => {
                self.ended = true;
                self.up.limits.failed();
                Some(Err(e))
            }
            None => {
                self.ended = true;
                self.up.limits.succeeded();
                None
            }
        }
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        if !self.ended {
            // Cancelled by the client: nothing learnt about the upstream's health.
            self.up.limits.settled();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_lines() {
        let mut l = Lines::default();
        l.push(b"data: {\"a\":1}\n\n: comment\nevent: x\ndata: {\"b\"");
        assert_eq!(l.next().as_deref(), Some("{\"a\":1}"));
        assert_eq!(l.next(), None);
        l.push(b":2}\r\n\r\n{\"c\":3}\ndata: [DONE]\n\n");
        assert_eq!(l.next().as_deref(), Some("{\"b\":2}"));
        assert_eq!(l.next().as_deref(), Some("{\"c\":3}"));
        assert_eq!(l.next().as_deref(), Some("[DONE]"));
        l.push(b"{\"d\":4}");
        assert_eq!(l.next(), None);
        assert_eq!(l.finish().as_deref(), Some("{\"d\":4}"));
        assert!(chunk_of("u", "{\"error\":{\"message\":\"x\"}}").is_err());
        assert!(chunk_of("u", "[1]").is_err());
    }
}

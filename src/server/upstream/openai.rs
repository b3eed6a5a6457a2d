//! The `openai` kind: `POST {url}/chat/completions` or `{url}/completions` with a bearer
//! token; a streamed answer's server-sent events read into chunk objects up to `[DONE]`.
//! Every outcome is told to the upstream's limits: a 5xx, a timeout, no connection, a body or
//! an event stream that does not parse count for its breaker; its 429 holds it for its
//! `Retry-After`; its usage counts against the token budget.

use super::link::{Endpoint, Upstream, UpstreamError};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// A reply: the whole answer's JSON, or its chunks as they come.
pub enum Reply {
    Whole(serde_json::Value),
    Stream(Chunks),
}

/// How much of an upstream's error body a message quotes.
const QUOTE: usize = 300;

pub(super) async fn send(
    up: &Arc<Upstream>,
    endpoint: Endpoint,
    body: &serde_json::Value,
    stream: bool,
) -> Result<Reply, UpstreamError> {
    let name = up.name();
    let base = up.cfg.url.as_deref().unwrap_or("").trim_end_matches('/');
    let url = format!("{base}/{}", endpoint.path());
    let timeout = Duration::from_secs_f64(up.cfg.timeout_s);
    let mut retried = false;
    let resp = loop {
        let token = match up.auth.token().await {
            Ok(t) => t,
            Err(e) => {
                up.limits.failed();
                return Err(UpstreamError::new(
                    502,
                    "auth",
                    format!("upstream {name}: no token: {e}"),
                ));
            }
        };
        let mut req = up.client.post(&url).json(body).timeout(timeout);
        for (k, v) in &up.cfg.headers {
            req = req.header(k, v);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = match req.send().await {
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
    let status = resp.status();
    if !status.is_success() {
        return Err(refused(up, resp).await);
    }
    if stream {
        return Ok(Reply::Stream(Chunks {
            up: Arc::clone(up),
            bytes: resp.bytes_stream().map(|r| r.map(|b| b.to_vec())).boxed(),
            buf: Vec::new(),
            data: String::new(),
            ended: false,
            timeout,
        }));
    }
    let text = match resp.text().await {
        Ok(t) => t,
        Err(e) => {
            up.limits.failed();
            return Err(transport_error(name, &e, timeout));
        }
    };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.get("choices").is_some_and(|c| c.is_array()) => {
            up.limits.succeeded();
            up.limits.spend(usage_tokens(&v));
            Ok(Reply::Whole(v))
        }
        _ => {
            up.limits.failed();
            Err(UpstreamError::new(
                502,
                "bad_response",
                format!(
                    "upstream {name} answered with something that is not a completion: {}",
                    quote(&text)
                ),
            ))
        }
    }
}

fn quote(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= QUOTE {
        return s.to_string();
    }
    format!("{}…", s.chars().take(QUOTE).collect::<String>())
}

fn usage_tokens(v: &serde_json::Value) -> u64 {
    let u = &v["usage"];
    u["total_tokens"].as_u64().unwrap_or_else(|| {
        u["prompt_tokens"].as_u64().unwrap_or(0) + u["completion_tokens"].as_u64().unwrap_or(0)
    })
}

fn transport_error(name: &str, e: &reqwest::Error, timeout: Duration) -> UpstreamError {
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
    let text = resp.text().await.unwrap_or_default();
    // The upstream's own message where it sent an OpenAI error.
    let said = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| quote(&text));
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

/// A streamed answer's chunks, read from its server-sent events. Dropping it (the client
/// went away) closes the upstream's connection.
pub struct Chunks {
    up: Arc<Upstream>,
    bytes: BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
    /// The data lines of the event being read.
    data: String,
    ended: bool,
    timeout: Duration,
}

impl Chunks {
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.up
    }

    /// The next chunk object; None after `[DONE]`. A stream that breaks off, does not parse
    /// or carries an error object ends with that error.
    pub async fn next(&mut self) -> Option<Result<serde_json::Value, UpstreamError>> {
        if self.ended {
            return None;
        }
        let name = self.up.cfg.name.clone();
        loop {
            // One line at a time from what has arrived.
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if !line.is_empty() {
                    if let Some(d) = line.strip_prefix("data:") {
                        if !self.data.is_empty() {
                            self.data.push('\n');
                        }
                        self.data.push_str(d.strip_prefix(' ').unwrap_or(d));
                    }
                    // Comments, `event:`, `id:`, `retry:` say nothing to a chunk reader.
                    continue;
                }
                if self.data.is_empty() {
                    continue;
                }
                let data = std::mem::take(&mut self.data);
                if data.trim() == "[DONE]" {
                    self.ended = true;
                    self.up.limits.succeeded();
                    return None;
                }
                return Some(match serde_json::from_str::<serde_json::Value>(&data) {
                    Ok(v) if v.get("error").is_some() => {
                        self.ended = true;
                        self.up.limits.failed();
                        let said = v["error"]["message"].as_str().unwrap_or("(no message)");
                        Err(UpstreamError::new(
                            502,
                            "stream",
                            format!("upstream {name} failed midway: {said}"),
                        ))
                    }
                    Ok(v) => {
                        if v.get("usage").is_some_and(|u| u.is_object()) {
                            self.up.limits.spend(usage_tokens(&v));
                        }
                        Ok(v)
                    }
                    Err(e) => {
                        self.ended = true;
                        self.up.limits.failed();
                        Err(UpstreamError::new(
                            502,
                            "stream",
                            format!(
                                "upstream {name} sent an event that does not parse ({e}): {}",
                                quote(&data)
                            ),
                        ))
                    }
                });
            }
            match self.bytes.next().await {
                Some(Ok(b)) => self.buf.extend_from_slice(&b),
                Some(Err(e)) => {
                    self.ended = true;
                    self.up.limits.failed();
                    let mut err = transport_error(&name, &e, self.timeout);
                    err.label = if err.label == "timeout" {
                        "timeout"
                    } else {
                        "stream"
                    };
                    err.message = format!("{} (midway through the stream)", err.message);
                    return Some(Err(err));
                }
                None => {
                    self.ended = true;
                    self.up.limits.failed();
                    return Some(Err(UpstreamError::new(
                        502,
                        "stream",
                        format!("upstream {name}'s event stream ended before [DONE]"),
                    )));
                }
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

//! An HTTP error with an OpenAI error body, and the status each kind of failure answers with.

use super::route::Reason;
use super::upstream::UpstreamError;
use crate::error::Error;
use crate::openai::ErrorBody;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Duration;

/// An HTTP error with an OpenAI error body.
#[derive(Debug)]
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) message: String,
    pub(super) retry_after: Option<u64>,
    /// The error `type` where the status does not say it (`upstream_error`).
    pub(super) kind: Option<&'static str>,
    /// The reason an upstream may take the request instead (the local slots are busy, the
    /// prompt is past the context, the engine failed).
    pub(super) reason: Option<Reason>,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
            kind: None,
            reason: None,
        }
    }

    /// The status an engine error answers with: the request's fault is 400, the rest 500;
    /// a prompt past the context, and the engine's own failures, are reasons for an upstream.
    pub(super) fn from_engine(e: &Error) -> Self {
        let (status, reason) = match e {
            Error::ContextFull { .. } => (StatusCode::BAD_REQUEST, Some(Reason::Context)),
            Error::InvalidArgument(_) | Error::Tokenizer(_) => (StatusCode::BAD_REQUEST, None),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, Some(Reason::Error)),
        };
        Self {
            reason,
            ..Self::new(status, e.to_string())
        }
    }

    /// An upstream's failure, typed `upstream_error` (our own limits: `rate_limit_error`).
    pub(super) fn upstream(e: UpstreamError) -> Self {
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_GATEWAY);
        Self {
            retry_after: e
                .retry_after
                .map(|d| d.as_secs_f64().ceil().max(1.0) as u64),
            kind: Some(e.kind()),
            ..Self::new(status, e.message)
        }
    }

    /// This (an upstream's) error where it was to answer instead of the local route, which
    /// gave `local`.
    pub(super) fn after(self, local: &ApiError) -> Self {
        Self {
            message: format!("{} (locally: {})", self.message, local.message),
            ..self
        }
    }

    pub(super) fn timed_out(after: Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the request took longer than the server's timeout ({} s)",
                after.as_secs()
            ),
        )
    }

    pub(super) fn body(&self) -> ErrorBody {
        let mut b = ErrorBody::new(self.status.as_u16(), self.message.clone());
        if let Some(k) = self.kind {
            b.error.kind = k.into();
        }
        b
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

pub(super) type ApiResult<T> = std::result::Result<T, ApiError>;

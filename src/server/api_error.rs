//! An HTTP error with an OpenAI error body, and the status each kind of failure answers with.

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
}

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The status an engine error answers with: the request's fault is 400, the rest 500.
    pub(super) fn from_engine(e: &Error) -> Self {
        let status = match e {
            Error::InvalidArgument(_) | Error::ContextFull { .. } | Error::Tokenizer(_) => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
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

pub(super) type ApiResult<T> = std::result::Result<T, ApiError>;

//! Every error the gateway itself produces, as RFC 9457 problem details.
//!
//! One enum, one function mapping each kind to its status, `type` URI and
//! headers. Upstream errors are passed through untouched; these are only
//! the gateway's own answers. No problem ever echoes the request body, the
//! raw key or anything about another tenant's records.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use super::body::{ResponseBody, full};
use crate::idempotency::KeyError;

/// Prefix of every problem `type`; the suffix is [`Problem::slug`].
pub const TYPE_PREFIX: &str = "urn:idemgate:problem:";

/// A failure the gateway reports to its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The route requires a key and the request has none.
    MissingKey,
    /// The key header is malformed.
    InvalidKey(KeyError),
    /// The key was used for a different request.
    KeyMismatch,
    /// Another attempt with this key is running.
    RequestInFlight {
        /// Time left on the other attempt's lease.
        retry_after: Duration,
    },
    /// The store could not be reached (fail-closed).
    StoreUnavailable,
    /// The request body is over the limit.
    BodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The request body could not be read.
    BadRequestBody,
    /// The upstream could not be reached or did not answer in time.
    UpstreamUnavailable {
        /// `true` when the upstream timed out rather than failed.
        timed_out: bool,
    },
    /// The key completed, but its response was too large to keep.
    ResponseNotReplayable,
    /// No route matches the request path.
    NoRoute,
    /// Admin API: no or wrong bearer token.
    Unauthorized,
    /// Admin API: no token is configured, so the API is off.
    AdminDisabled,
    /// Admin API: no such record, row or route.
    NotFound,
    /// Admin API: the path exists, the method does not (`Allow` lists the methods).
    MethodNotAllowed(&'static str),
    /// Admin API: a malformed parameter; the text says which.
    BadAdminRequest(String),
    /// Admin API: the outbox database could not be reached.
    OutboxUnavailable,
    /// An internal failure (a bug): the request was not forwarded, or its
    /// outcome is unknown.
    Internal,
}

impl Problem {
    /// The stable last segment of the `type` URI.
    pub fn slug(&self) -> &'static str {
        match self {
            Self::MissingKey => "missing-key",
            Self::InvalidKey(_) => "invalid-key",
            Self::KeyMismatch => "key-mismatch",
            Self::RequestInFlight { .. } => "request-in-flight",
            Self::StoreUnavailable => "store-unavailable",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::BadRequestBody => "bad-request-body",
            Self::UpstreamUnavailable { .. } => "upstream-unavailable",
            Self::ResponseNotReplayable => "response-not-replayable",
            Self::NoRoute => "no-route",
            Self::Unauthorized => "unauthorized",
            Self::AdminDisabled => "admin-disabled",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed(_) => "method-not-allowed",
            Self::BadAdminRequest(_) => "bad-request",
            Self::OutboxUnavailable => "outbox-unavailable",
            Self::Internal => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey(_) | Self::BadRequestBody => StatusCode::BAD_REQUEST,
            Self::KeyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RequestInFlight { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UpstreamUnavailable { timed_out: false } => StatusCode::BAD_GATEWAY,
            Self::UpstreamUnavailable { timed_out: true } => StatusCode::GATEWAY_TIMEOUT,
            // Not 409 or 5xx: clients must not retry it automatically, since
            // the upstream did act and a retry can never get the response.
            Self::ResponseNotReplayable => StatusCode::GONE,
            Self::NoRoute | Self::NotFound => StatusCode::NOT_FOUND,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::AdminDisabled => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::BadAdminRequest(_) => StatusCode::BAD_REQUEST,
            Self::OutboxUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency-Key required",
            Self::InvalidKey(_) => "Invalid Idempotency-Key",
            Self::KeyMismatch => "Idempotency-Key reused for a different request",
            Self::RequestInFlight { .. } => "A request with this Idempotency-Key is in progress",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::BadRequestBody => "Request body could not be read",
            Self::UpstreamUnavailable { .. } => "Upstream unavailable",
            Self::ResponseNotReplayable => "Response not replayable",
            Self::NoRoute => "No route",
            Self::Unauthorized => "Unauthorized",
            Self::AdminDisabled => "Admin API disabled",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed(_) => "Method not allowed",
            Self::BadAdminRequest(_) => "Bad request",
            Self::OutboxUnavailable => "Outbox database unavailable",
            Self::Internal => "Internal gateway error",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::MissingKey => "This endpoint requires an Idempotency-Key header on this method.".into(),
            Self::InvalidKey(e) => format!("{e}. A key is 1 to 255 printable ASCII characters, sent once as a bare token or a quoted string."),
            Self::KeyMismatch => "This Idempotency-Key was already used with a different method, path, query, body or fingerprinted header. Use a new key for a new request.".into(),
            Self::RequestInFlight { .. } => "The first request with this key has not finished. Retry after the time in Retry-After to get its result.".into(),
            Self::StoreUnavailable => "The request was not forwarded because its key could not be recorded. It is safe to retry.".into(),
            Self::BodyTooLarge { limit } => format!("The request body exceeds the limit of {limit} bytes. It was not forwarded."),
            Self::BadRequestBody => "The request body ended early or was malformed. It was not forwarded.".into(),
            Self::UpstreamUnavailable { timed_out: true } => "The upstream did not answer in time. The key was released; retrying with the same key runs the request again.".into(),
            Self::UpstreamUnavailable { timed_out: false } => "The upstream could not be reached or closed the connection. The key was released; retrying with the same key runs the request again.".into(),
            Self::ResponseNotReplayable => "The request with this key was executed, but its response was larger than the stored-response limit and cannot be replayed. It will not be executed again.".into(),
            Self::NoRoute => "No route is configured for this path.".into(),
            Self::Unauthorized => "A valid bearer token is required.".into(),
            Self::AdminDisabled => "The admin API is disabled because no token is configured. Set IDEMGATE__ADMIN__TOKEN or admin.token_file.".into(),
            Self::NotFound => "Nothing exists here.".into(),
            Self::MethodNotAllowed(allow) => format!("This path accepts {allow}."),
            Self::BadAdminRequest(why) => why.clone(),
            Self::OutboxUnavailable => "The outbox database did not answer. Nothing was changed; try again.".into(),
            Self::Internal => "The gateway failed internally. Retrying with the same key is safe.".into(),
        }
    }

    /// The problem as a response.
    pub fn to_response(&self) -> Response<ResponseBody> {
        let status = self.status();
        let body = serde_json::json!({
            "type": format!("{TYPE_PREFIX}{}", self.slug()),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": self.detail(),
        });
        let bytes = serde_json::to_vec(&body).map(Bytes::from).unwrap_or_default();
        let mut response = Response::new(full(bytes));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        let retry_after = match self {
            Self::RequestInFlight { retry_after } => Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            Self::StoreUnavailable => Some(1),
            _ => None,
        };
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, Self::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Self::MethodNotAllowed(allow) = self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_problem_json_with_a_stable_type() {
        let response = Problem::KeyMismatch.to_response();
        assert_eq!(response.status(), 422);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        assert_eq!(Problem::KeyMismatch.slug(), "key-mismatch");
    }

    #[test]
    fn in_flight_and_store_down_say_when_to_retry() {
        let response = Problem::RequestInFlight { retry_after: Duration::from_millis(1500) }.to_response();
        assert_eq!(response.status(), 409);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let response = Problem::RequestInFlight { retry_after: Duration::ZERO }.to_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(Problem::StoreUnavailable.to_response().headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn not_replayable_is_neither_a_conflict_nor_a_server_error() {
        let status = Problem::ResponseNotReplayable.status();
        assert!(status != StatusCode::CONFLICT && !status.is_server_error());
    }
}

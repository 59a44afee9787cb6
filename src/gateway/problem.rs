//! Every error the gateway itself produces, as RFC 9457 problem details.
//!
//! One enum, one function mapping each kind to its status, `type` URI and
//! headers. Upstream errors are passed through untouched; these are only
//! the gateway's own answers. No problem ever echoes the request body, the
//! raw key or anything about another tenant's records.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use super::key::KeySource;
use super::spelling::Ambiguity;
use crate::http::body::{BoxedBody, full};
use crate::http::client::UpstreamError;
use crate::idempotency::{KeyError, TenantError};
use crate::store::QuotaLimit;
use crate::webhook::{Failure, FailureKind};

/// Prefix of every problem `type`; the suffix is [`Problem::slug`]. The
/// HTTP parser's refusals ([`crate::http::refusal`]) share it.
pub use crate::http::refusal::TYPE_PREFIX;

/// A failure the gateway reports to its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The route requires a key and the request has none.
    MissingKey,
    /// The route takes its key from another source (named in the text:
    /// "the webhook-id header", "the JSON body at /id") and the request has none.
    MissingKeyIn(String),
    /// The key header is malformed.
    InvalidKey(KeyError),
    /// The header the tenant comes from appears more than once.
    AmbiguousTenant(TenantError),
    /// The tenant source names a principal (`basic_user`, `jwt_claim`) and
    /// the request carries no valid credential.
    Unauthenticated {
        /// The `WWW-Authenticate` challenge.
        challenge: &'static str,
        /// Which check failed.
        why: String,
    },
    /// The key was used for a different request.
    KeyMismatch,
    /// Another attempt with this key is running.
    RequestInFlight {
        /// Time left on the other attempt's lease.
        retry_after: Duration,
    },
    /// The store could not be reached (fail-closed).
    StoreUnavailable,
    /// The connection has `max_streams_per_connection` guarded attempts
    /// still running (streams it reset run on until they settle).
    ConnectionBusy,
    /// The connection holds `connection_response_budget` of settled
    /// answers its client has not read; this one is recorded and replays.
    UnreadAnswers,
    /// The key is new and its tenant holds what `tenant_quota` allows.
    TenantQuota(QuotaLimit),
    /// The request body is over the limit.
    BodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The request target is longer than `max_uri_bytes`.
    UriTooLong {
        /// The limit in bytes.
        limit: u64,
    },
    /// The request headers are over `max_header_bytes`.
    HeadersTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The request body broke off or was malformed.
    BadRequestBody,
    /// The path or method has more than one reading among upstreams.
    AmbiguousRequest(Ambiguity),
    /// The request body did not arrive within `request_body_timeout`.
    BodyTimeout,
    /// The upstream failed and nothing was stored (a guarded request).
    UpstreamUnavailable {
        /// `false` when the request provably never reached the upstream.
        sent: bool,
    },
    /// The upstream failed for a request without a key (passthrough,
    /// fail-open): same type and status, a detail that speaks of no key.
    UnguardedUpstreamFailed {
        /// `false` when the request provably never reached the upstream.
        sent: bool,
    },
    /// The upstream did not answer within `upstream_timeout`.
    UpstreamTimeout {
        /// `true` for a guarded attempt, which goes on in the background.
        still_running: bool,
    },
    /// The request was sent and its outcome was lost.
    OutcomeUnknown {
        /// `true` when the key is held (`on_unknown = "hold"`).
        held: bool,
    },
    /// The upstream acted (its status says so), then its response broke off.
    ResponseIncomplete,
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
    /// Admin listener without a token: a request that may come from a web
    /// page (a foreign `Host`, or a state change from another site); the
    /// text says which.
    ForeignRequest(&'static str),
    /// Admin API: a malformed parameter; the text says which.
    BadAdminRequest(String),
    /// Admin API: the outbox database could not be reached.
    OutboxUnavailable,
    /// A webhook delivery without a valid signature by any configured secret.
    WebhookSignature(&'static str),
    /// A validly signed webhook delivery whose timestamp is outside `tolerance`.
    WebhookTimestamp(&'static str),
    /// An internal failure (a bug): the request was not forwarded, or its
    /// outcome is unknown.
    Internal,
}

impl From<Failure> for Problem {
    fn from(failure: Failure) -> Self {
        match failure.kind {
            FailureKind::Signature => Self::WebhookSignature(failure.why),
            FailureKind::Timestamp => Self::WebhookTimestamp(failure.why),
        }
    }
}

impl Problem {
    /// A guarded request without a key where its route requires one.
    pub fn missing_key(source: &KeySource) -> Self {
        match source {
            KeySource::IdempotencyKey => Self::MissingKey,
            source => Self::MissingKeyIn(source.describe()),
        }
    }

    /// A request forwarded without a record whose upstream call failed.
    pub fn unguarded(error: &UpstreamError) -> Self {
        match error {
            UpstreamError::TimedOut(_) => Self::UpstreamTimeout { still_running: false },
            error => Self::UnguardedUpstreamFailed { sent: error.may_have_been_sent() },
        }
    }

    /// The stable last segment of the `type` URI.
    pub fn slug(&self) -> &'static str {
        match self {
            Self::MissingKey | Self::MissingKeyIn(_) => "missing-key",
            Self::InvalidKey(_) => "invalid-key",
            Self::AmbiguousTenant(_) => "ambiguous-tenant",
            Self::Unauthenticated { .. } => "unauthenticated",
            Self::KeyMismatch => "key-mismatch",
            Self::RequestInFlight { .. } => "request-in-flight",
            Self::StoreUnavailable => "store-unavailable",
            Self::ConnectionBusy | Self::UnreadAnswers => "connection-busy",
            Self::TenantQuota(_) => "tenant-quota",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::UriTooLong { .. } => "uri-too-long",
            Self::HeadersTooLarge { .. } => "headers-too-large",
            Self::BadRequestBody => "bad-request-body",
            Self::AmbiguousRequest(Ambiguity::MethodCase(_) | Ambiguity::MethodOverride) => "ambiguous-method",
            Self::AmbiguousRequest(_) => "ambiguous-path",
            Self::BodyTimeout => "request-body-timeout",
            Self::UpstreamUnavailable { .. } | Self::UnguardedUpstreamFailed { .. } => "upstream-unavailable",
            Self::UpstreamTimeout { .. } => "upstream-timeout",
            Self::OutcomeUnknown { .. } => "outcome-unknown",
            Self::ResponseIncomplete => "response-incomplete",
            Self::ResponseNotReplayable => "response-not-replayable",
            Self::NoRoute => "no-route",
            Self::Unauthorized => "unauthorized",
            Self::AdminDisabled => "admin-disabled",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed(_) => "method-not-allowed",
            Self::ForeignRequest(_) => "foreign-request",
            Self::BadAdminRequest(_) => "bad-request",
            Self::OutboxUnavailable => "outbox-unavailable",
            Self::WebhookSignature(_) => "webhook-signature",
            Self::WebhookTimestamp(_) => "webhook-timestamp",
            Self::Internal => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingKey
            | Self::MissingKeyIn(_)
            | Self::InvalidKey(_)
            | Self::AmbiguousTenant(_)
            | Self::BadRequestBody
            | Self::AmbiguousRequest(_) => StatusCode::BAD_REQUEST,
            Self::KeyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RequestInFlight { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable | Self::ConnectionBusy | Self::UnreadAnswers => StatusCode::SERVICE_UNAVAILABLE,
            Self::TenantQuota(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            Self::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UpstreamUnavailable { .. }
            | Self::UnguardedUpstreamFailed { .. }
            | Self::OutcomeUnknown { .. }
            | Self::ResponseIncomplete => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            // Not 409 or 5xx: clients must not retry it automatically, since
            // the upstream did act and a retry can never get the response.
            Self::ResponseNotReplayable => StatusCode::GONE,
            Self::NoRoute | Self::NotFound => StatusCode::NOT_FOUND,
            Self::Unauthorized
            | Self::Unauthenticated { .. }
            | Self::WebhookSignature(_)
            | Self::WebhookTimestamp(_) => StatusCode::UNAUTHORIZED,
            Self::AdminDisabled | Self::ForeignRequest(_) => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::BadAdminRequest(_) => StatusCode::BAD_REQUEST,
            Self::OutboxUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency-Key required",
            Self::MissingKeyIn(_) => "Key required",
            // A key from the route's own source (a webhook's event id, say).
            Self::InvalidKey(KeyError::Source(_)) => "Invalid key",
            Self::InvalidKey(_) => "Invalid Idempotency-Key",
            Self::AmbiguousTenant(_) => "Ambiguous tenant",
            Self::Unauthenticated { .. } => "Credential required",
            Self::KeyMismatch => "Idempotency-Key reused for a different request",
            Self::RequestInFlight { .. } => "A request with this Idempotency-Key is in progress",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::ConnectionBusy => "Too many requests running on this connection",
            Self::UnreadAnswers => "This connection holds too many unread answers",
            Self::TenantQuota(_) => "Tenant quota reached",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::UriTooLong { .. } => "URI too long",
            Self::HeadersTooLarge { .. } => "Request headers too large",
            Self::BadRequestBody => "Request body could not be read",
            Self::AmbiguousRequest(Ambiguity::MethodCase(_) | Ambiguity::MethodOverride) => "Ambiguous method",
            Self::AmbiguousRequest(_) => "Ambiguous path",
            Self::BodyTimeout => "Request body too slow",
            Self::UpstreamUnavailable { .. } | Self::UnguardedUpstreamFailed { .. } => "Upstream unavailable",
            Self::UpstreamTimeout { .. } => "Upstream timeout",
            Self::OutcomeUnknown { .. } => "Outcome unknown",
            Self::ResponseIncomplete => "Upstream response incomplete",
            Self::ResponseNotReplayable => "Response not replayable",
            Self::NoRoute => "No route",
            Self::Unauthorized => "Unauthorized",
            Self::AdminDisabled => "Admin API disabled",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed(_) => "Method not allowed",
            Self::ForeignRequest(_) => "Request from a web page refused",
            Self::BadAdminRequest(_) => "Bad request",
            Self::OutboxUnavailable => "Outbox database unavailable",
            Self::WebhookSignature(_) => "Webhook signature invalid",
            Self::WebhookTimestamp(_) => "Webhook timestamp outside tolerance",
            Self::Internal => "Internal gateway error",
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::MissingKey => "This endpoint requires an Idempotency-Key header on this method.".into(),
            Self::MissingKeyIn(source) => format!("This route takes each request's key from {source}, and this request has none. It was not forwarded; nothing was recorded."),
            Self::InvalidKey(e @ KeyError::Source(_)) => format!("{e}. It was not forwarded; nothing was recorded."),
            Self::InvalidKey(e) => format!("{e}. A key is 1 to 255 printable ASCII characters, sent once as a bare token or a quoted string."),
            Self::AmbiguousTenant(e) => format!("{e}. Send it once; the request was not forwarded."),
            Self::Unauthenticated { why, .. } => format!("{why}. This gateway files each request's Idempotency-Key under the principal its credential names, so a request without a valid credential has no key space; it was not forwarded and nothing was recorded."),
            Self::KeyMismatch => "This Idempotency-Key was already used with a different method, path, query, body or fingerprinted header. Use a new key for a new request.".into(),
            Self::RequestInFlight { .. } => "The first request with this key has not finished. Retry after the time in Retry-After to get its result.".into(),
            Self::StoreUnavailable => "The request was not forwarded because its key could not be recorded. It is safe to retry.".into(),
            Self::UnreadAnswers => "This connection already holds as many bytes of answers its client has not read as it may (gateway.connection_response_budget). The request was answered and its record holds the answer: retry after Retry-After to get it.".into(),
            Self::ConnectionBusy => "This connection already has as many guarded requests running upstream as it may have streams (requests whose streams were reset run on until they settle). The request was not forwarded and nothing was recorded; retry after Retry-After.".into(),
            Self::TenantQuota(limit) => format!("This credential's tenant already holds as many {} as its quota allows (tenant_quota.max_{}), so a new Idempotency-Key was not recorded and the request was not forwarded. Retries of keys already used are still answered; new keys are accepted again as stored keys expire.", match limit { QuotaLimit::Keys => "live keys", QuotaLimit::Bytes => "bytes of stored responses" }, limit.as_str()),
            Self::BodyTooLarge { limit } => format!("The request body exceeds the limit of {limit} bytes. It was not forwarded."),
            Self::AmbiguousRequest(e) => format!("The request was not forwarded: {e}. Upstreams disagree about what such a request means; send the plain path, and the method in upper case."),
            Self::BadRequestBody => "The request body broke off or was malformed before it was complete. It was not forwarded; nothing was recorded for its key.".into(),
            Self::UriTooLong { limit } => format!("The request target (path and query) is longer than {limit} bytes. It was not forwarded."),
            Self::HeadersTooLarge { limit } => format!("The request headers exceed {limit} bytes. It was not forwarded."),
            Self::BodyTimeout => "The request body did not arrive in time. It was not forwarded; nothing was recorded for its key.".into(),
            Self::UpstreamUnavailable { sent: false } => "The upstream could not be reached; the request was not sent to it. Retrying with the same Idempotency-Key runs it.".into(),
            Self::UnguardedUpstreamFailed { sent: false } => "The upstream could not be reached; the request was not sent to it, so retrying it is safe.".into(),
            Self::UnguardedUpstreamFailed { sent: true } => "The upstream failed after the request was sent to it: it may have acted. This request carried no Idempotency-Key, so a retry runs it again; retry only if that is safe.".into(),
            Self::UpstreamUnavailable { sent: true } => "The upstream failed after the request was sent to it, with an answer that does not count as executed, and no response was stored. Retrying with the same Idempotency-Key runs the request again.".into(),
            Self::UpstreamTimeout { still_running: true } => "The upstream did not answer in time, but the request was sent and is still running. Retry with the same Idempotency-Key: you get 409 until it finishes, then its result.".into(),
            Self::UpstreamTimeout { still_running: false } => "The upstream did not answer in time. The request may have reached it.".into(),
            Self::OutcomeUnknown { held: true } => "The request was sent to the upstream and the connection was lost before its answer arrived (or it ran past the gateway's deadline): it may have been executed. Nothing will be forwarded again under this Idempotency-Key until the record expires or an operator purges it; check with the upstream whether it was executed.".into(),
            Self::OutcomeUnknown { held: false } => "The request was sent to the upstream and the connection was lost before its answer arrived: it may have been executed. This route releases such keys, so retrying with the same Idempotency-Key runs the request again.".into(),
            Self::ResponseIncomplete => "The upstream executed the request, then its response broke off. This Idempotency-Key will not run again, and its response cannot be replayed.".into(),
            Self::ResponseNotReplayable => "The request with this key was executed, but its response was larger than the stored-response limit and cannot be replayed. It will not be executed again.".into(),
            Self::NoRoute => "No route is configured for this path.".into(),
            Self::Unauthorized => "A valid bearer token is required.".into(),
            Self::AdminDisabled => "The admin API is disabled because no token is configured. Set IDEMGATE__ADMIN__TOKEN or admin.token_file.".into(),
            Self::NotFound => "Nothing exists here.".into(),
            Self::MethodNotAllowed(allow) => format!("This path accepts {allow}."),
            Self::ForeignRequest(why) => format!("This admin listener has no token (admin.auth = \"disabled\"), so it answers only requests addressed to its own address or localhost, and changes state only for requests no other web site sent. This one was refused: {why}. Use curl or the console on this address, or configure an admin token."),
            Self::BadAdminRequest(why) => why.clone(),
            Self::OutboxUnavailable => "The outbox database did not answer. Nothing was changed; try again.".into(),
            Self::WebhookSignature(why) => format!("The delivery was not verified: {why}. It was not forwarded and nothing was recorded; check the route's webhook secrets and that the body reaches the gateway unchanged."),
            Self::WebhookTimestamp(why) => format!("The delivery's signature is valid but {why}, so it may be a replay. It was not forwarded and nothing was recorded; check the sender's and this gateway's clocks."),
            Self::Internal => "The gateway failed internally. Retrying with the same key is safe.".into(),
        }
    }

    /// The problem as a response.
    pub fn to_response(&self) -> Response<BoxedBody> {
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
            Self::StoreUnavailable | Self::ConnectionBusy | Self::UnreadAnswers => Some(1),
            _ => None,
        };
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        match self {
            Self::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::Unauthenticated { challenge, .. } => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
            }
            _ => {}
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
    fn an_unguarded_failure_speaks_of_no_key_it_did_not_have() {
        let unsent = Problem::UnguardedUpstreamFailed { sent: false };
        assert_eq!((unsent.status(), unsent.slug()), (StatusCode::BAD_GATEWAY, "upstream-unavailable"));
        assert!(!unsent.detail().contains("Idempotency-Key") && unsent.detail().contains("safe"));
        let sent = Problem::UnguardedUpstreamFailed { sent: true }.detail();
        assert!(sent.contains("may have acted") && sent.contains("carried no Idempotency-Key"), "{sent}");
        assert!(!Problem::UpstreamUnavailable { sent: false }.detail().contains("if any"));
    }

    #[test]
    fn a_lost_outcome_is_titled_as_such() {
        for held in [true, false] {
            let problem = Problem::OutcomeUnknown { held };
            assert_eq!((problem.slug(), problem.title()), ("outcome-unknown", "Outcome unknown"));
        }
    }

    #[test]
    fn not_replayable_is_neither_a_conflict_nor_a_server_error() {
        let status = Problem::ResponseNotReplayable.status();
        assert!(status != StatusCode::CONFLICT && !status.is_server_error());
    }
}

//! The settings the request path reads, converted once from
//! `[gateway]`: durations and sizes into their plain types, header names
//! already parsed by the config ([`crate::config::ConfigHeaderName`]).
//! Every stage of the gateway (the head checks, passthrough, the guard)
//! reads this one value; none goes back to the config.

use std::time::Duration;

use http::header::HeaderName;

use crate::config::{ConcurrentMode, FailMode, ForwardKey, GatewayConfig};
use crate::idempotency::FingerprintPolicy;

/// Settings the request path reads, resolved once from [`GatewayConfig`].
#[derive(Debug, Clone)]
pub struct Policy {
    /// Retention of completed records.
    pub key_ttl: Duration,
    /// Lease of an in-flight attempt.
    pub lease: Duration,
    /// How long a client waits for its upstream answer.
    pub upstream_timeout: Duration,
    /// How long a guarded attempt may run before its outcome counts as unknown.
    pub upstream_deadline: Duration,
    /// Limit on receiving a request body (whole when guarded, per chunk when streamed).
    pub request_body_timeout: Duration,
    /// Largest accepted request body.
    pub max_request_body: u64,
    /// Largest response kept for replay.
    pub max_stored_response: usize,
    /// Store-down behaviour.
    pub fail_mode: FailMode,
    /// Duplicate-in-flight behaviour.
    pub concurrent: ConcurrentMode,
    /// Longest wait with `concurrent = "wait"`.
    pub wait_timeout: Duration,
    /// Key forwarded upstream.
    pub forward_key: ForwardKey,
    /// Response headers never stored.
    pub response_header_deny: Vec<HeaderName>,
    /// Longest request target accepted.
    pub max_uri_bytes: u64,
    /// Most request header bytes accepted.
    pub max_header_bytes: u64,
}

impl From<&GatewayConfig> for Policy {
    fn from(g: &GatewayConfig) -> Self {
        Self {
            key_ttl: g.key_ttl.0,
            lease: g.lease.0,
            upstream_timeout: g.upstream_timeout.0,
            upstream_deadline: g.upstream_deadline.0,
            request_body_timeout: g.request_body_timeout.0,
            max_request_body: g.max_request_body.0,
            max_stored_response: g.max_stored_response.bytes(),
            fail_mode: g.fail_mode,
            concurrent: g.concurrent,
            wait_timeout: g.wait_timeout.0,
            forward_key: g.forward_key,
            response_header_deny: g.response_header_deny.iter().map(|name| name.0.clone()).collect(),
            max_uri_bytes: g.max_uri_bytes.0,
            max_header_bytes: g.max_header_bytes.0,
        }
    }
}

impl From<&GatewayConfig> for FingerprintPolicy {
    fn from(g: &GatewayConfig) -> Self {
        Self {
            headers: g.fingerprint_headers.iter().map(|name| name.0.clone()).collect(),
            canonical_json: g.canonical_json,
        }
    }
}

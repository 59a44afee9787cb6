//! The `[gateway]` section and the `[[routes]]` tables: the idempotency
//! policy and where requests go.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    ByteSize, ConfigDuration, ConfigHeaderName, ConfigMethod, KeySource, TenantConfig, TenantQuota, WebhookConfig,
};

/// What happens when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// `503` with `Retry-After`; nothing is forwarded.
    Closed,
    /// Forward unguarded, count it and log it.
    Open,
}

/// What a duplicate of an in-flight request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConcurrentMode {
    /// `409` with `Retry-After` at once.
    Reject,
    /// Wait up to `wait_timeout` for the first attempt, then replay it (or `409`).
    Wait,
}

/// Which key the upstream receives in its `Idempotency-Key` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardKey {
    /// The client's key as sent.
    Original,
    /// `hex(sha256(tenant ‖ key))`: unique across tenants.
    Derived,
}

/// What a route does when a request was written upstream and its outcome
/// was lost (the connection died before a response head, or
/// `upstream_deadline` passed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    /// Keep the key: every retry gets `502 outcome-unknown` and nothing is
    /// forwarded again until the record expires or an operator purges it.
    Hold,
    /// Release the key so a retry runs again: only for upstreams that
    /// deduplicate on the forwarded key themselves.
    Release,
}

/// Connections per upstream unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// How long an idle upstream keep-alive connection is kept by default:
/// below the 5 s keep-alive of Node's HTTP server, the shortest common
/// upstream default, so the gateway closes an idle connection before the
/// upstream does instead of writing a request into one being closed.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// The idempotency policy.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// How long a completed record is kept.
    pub key_ttl: ConfigDuration,
    /// How long an in-flight attempt holds its key without renewal.
    pub lease: ConfigDuration,
    /// How long a client waits for the upstream's answer (connect, head and
    /// the stored part of the body); past it the client gets `504` while the
    /// attempt goes on in the background until `upstream_deadline`.
    pub upstream_timeout: ConfigDuration,
    /// How long a guarded attempt may run at all; past it its outcome is unknown.
    pub upstream_deadline: ConfigDuration,
    /// What a request whose outcome was lost does to its key (routes may override).
    pub on_unknown: OnUnknown,
    /// Larger request bodies get `413` before any store operation.
    pub max_request_body: ByteSize,
    /// Larger responses are streamed but not kept for replay.
    pub max_stored_response: ByteSize,
    /// Behaviour when the store is unreachable.
    pub fail_mode: FailMode,
    /// Behaviour for a duplicate of an in-flight request.
    pub concurrent: ConcurrentMode,
    /// With `concurrent = "wait"`: the longest a duplicate waits.
    pub wait_timeout: ConfigDuration,
    /// Where the tenant comes from.
    pub tenant: TenantConfig,
    /// Per-tenant limits on live keys and stored bytes; none when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_quota: Option<TenantQuota>,
    /// Which key is forwarded upstream.
    pub forward_key: ForwardKey,
    /// Request headers that are part of the fingerprint.
    pub fingerprint_headers: Vec<ConfigHeaderName>,
    /// Canonicalise JSON bodies before fingerprinting.
    pub canonical_json: bool,
    /// Response headers never stored (hop-by-hop headers never are).
    pub response_header_deny: Vec<ConfigHeaderName>,
    /// Statuses below 500 that release the key instead of being stored.
    pub release_statuses: Vec<u16>,
    /// Limit on one store operation.
    pub store_timeout: ConfigDuration,
    /// Limit on a new connection's first request head, and on each request's headers.
    pub header_read_timeout: ConfigDuration,
    /// Limit on receiving a guarded request body whole, and on any pause
    /// between two chunks of a streamed (passthrough) one.
    pub request_body_timeout: ConfigDuration,
    /// A client connection with no request in flight for this long is closed.
    pub idle_timeout: ConfigDuration,
    /// A client connection with a response larger than 64 KiB that its
    /// client has not read from for this long is dropped (its record is
    /// settled already; a retry replays it).
    pub send_timeout: ConfigDuration,
    /// Concurrent HTTP/2 streams per client connection.
    pub max_streams_per_connection: u32,
    /// Longest request target (path and query) accepted; longer gets `414`.
    pub max_uri_bytes: ByteSize,
    /// Most request header bytes (names and values) accepted; more gets `431`.
    pub max_header_bytes: ByteSize,
    /// Request body bytes buffered at once for one client connection (all
    /// its HTTP/2 streams together); at least `max_request_body`.
    pub connection_body_budget: ByteSize,
    /// Bytes of settled, replayable answers held for one client connection
    /// until its client takes them (all its HTTP/2 streams together); an
    /// answer past it gets `503 connection-busy`, and its retry replays.
    pub connection_response_budget: ByteSize,
    /// Open client connections at most; more wait in the accept queue.
    pub max_connections: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: ConfigDuration,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        let secs = |s| ConfigDuration(Duration::from_secs(s));
        Self {
            key_ttl: secs(24 * 3600),
            lease: secs(30),
            upstream_timeout: secs(20),
            upstream_deadline: secs(300),
            on_unknown: OnUnknown::Hold,
            max_request_body: ByteSize(1 << 20),
            max_stored_response: ByteSize(1 << 20),
            fail_mode: FailMode::Closed,
            concurrent: ConcurrentMode::Reject,
            wait_timeout: secs(10),
            tenant: TenantConfig::Authorization,
            tenant_quota: None,
            forward_key: ForwardKey::Original,
            fingerprint_headers: vec![http::header::CONTENT_TYPE.into()],
            canonical_json: true,
            response_header_deny: vec![http::header::DATE.into(), http::header::SET_COOKIE.into()],
            release_statuses: crate::idempotency::StatusPolicy::default().release,
            store_timeout: secs(2),
            header_read_timeout: secs(10),
            request_body_timeout: secs(30),
            idle_timeout: secs(60),
            send_timeout: secs(30),
            max_streams_per_connection: 100,
            connection_body_budget: ByteSize(4 << 20),
            connection_response_budget: ByteSize(16 << 20),
            max_uri_bytes: ByteSize(8 << 10),
            max_header_bytes: ByteSize(32 << 10),
            max_connections: 10_000,
            shutdown_grace: secs(25),
        }
    }
}

/// One route: a path prefix, its upstream and its policy.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// A short name used in metrics and logs.
    pub name: String,
    /// Path prefix; the first route whose prefix matches wins.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// `http://host:port` or `https://host:port`, optionally with a base
    /// path; never credentials (printed redacted if it has some).
    #[serde(serialize_with = "super::relay::redacted_url")]
    pub upstream: String,
    /// Guarded methods.
    #[serde(default = "default_methods")]
    pub methods: Vec<ConfigMethod>,
    /// A guarded request without a key gets `400`.
    #[serde(default)]
    pub require_key: bool,
    /// Forward the client's `Host` header instead of the upstream's authority.
    #[serde(default)]
    pub keep_host: bool,
    /// Extra CA certificates (PEM) trusted for this `https://` upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Connections to the upstream at most; requests beyond wait for one
    /// within `upstream_timeout`.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Overrides `gateway.release_statuses` for this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_statuses: Option<Vec<u16>>,
    /// Overrides `gateway.on_unknown` for this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unknown: Option<OnUnknown>,
    /// How long an idle keep-alive connection to the upstream is kept;
    /// keep it below the upstream's own keep-alive timeout.
    #[serde(default = "default_pool_idle_timeout")]
    pub pool_idle_timeout: ConfigDuration,
    /// Where the key comes from; unset: the webhook scheme's event id, or
    /// the `Idempotency-Key` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeySource>,
    /// Verify deliveries of a webhook provider before anything is stored
    /// or forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookConfig>,
    /// Overrides `gateway.key_ttl` for this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_ttl: Option<ConfigDuration>,
}

impl RouteConfig {
    /// The key source in effect: `key`, else the webhook scheme's, else
    /// the `Idempotency-Key` header.
    pub fn key_source(&self) -> KeySource {
        match (&self.key, &self.webhook) {
            (Some(key), _) => key.clone(),
            (None, Some(webhook)) => webhook.scheme.default_key(),
            (None, None) => KeySource::default(),
        }
    }
}

pub(super) fn default_prefix() -> String {
    "/".into()
}

pub(super) fn default_methods() -> Vec<ConfigMethod> {
    vec![http::Method::POST.into(), http::Method::PATCH.into()]
}

pub(super) fn default_pool_idle_timeout() -> ConfigDuration {
    ConfigDuration(DEFAULT_POOL_IDLE_TIMEOUT)
}

pub(super) fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}

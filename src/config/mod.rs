//! Typed configuration, read in layers: defaults, then the TOML file, then
//! `IDEMGATE__SECTION__FIELD` environment variables, then command-line flags.
//!
//! Every field has a default, so `idemgate serve --upstream URL` runs with no
//! file at all. Unknown fields are errors (a typo must not silently fall back
//! to a default on a payment path). Secrets are wrapped in [`Secret`] and
//! never printed; `check-config` prints the effective config with them
//! redacted.

mod relay;
mod units;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

pub use relay::{DestinationConfig, RelayConfig, is_schema_name};
pub use units::{ByteSize, ConfigDuration};

/// Prefix of environment overrides: `IDEMGATE__GATEWAY__LEASE=10s`.
pub const ENV_PREFIX: &str = "IDEMGATE__";

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file or an override is not valid TOML or does not fit the schema.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// The values parse but do not make sense together.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// A value that must never appear in logs or printed configs.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("[redacted]")
    }
}

/// A store or database URL; its password is redacted when printed.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct ServiceUrl(String);

impl ServiceUrl {
    /// Wraps a URL.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The URL with its password; call only where a connection is made.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The scheme, lower-cased (`memory`, `redis`, …).
    pub fn scheme(&self) -> String {
        self.0.split("://").next().unwrap_or("").to_ascii_lowercase()
    }
    /// The URL with any `user:password@` password replaced, and any
    /// `password=` in its query (libpq lets a database URL carry it there).
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return self.0.clone();
        };
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let tail = redact_query(tail);
        match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let user = userinfo.split(':').next().unwrap_or("");
                format!("{scheme}://{user}:[redacted]@{hosts}{tail}")
            }
            None => format!("{scheme}://{authority}{tail}"),
        }
    }
}

/// `path?query` with the value of every `password=` parameter replaced.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let pairs: Vec<&str> =
        query.split('&').map(|pair| if pair.starts_with("password=") { "password=[redacted]" } else { pair }).collect();
    format!("{path}?{}", pairs.join("&"))
}

impl std::fmt::Debug for ServiceUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for ServiceUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the gateway listens.
    pub listen: SocketAddr,
    /// Where the admin API, metrics and health checks listen.
    pub admin_listen: SocketAddr,
    /// The key store: `memory://`, `redis://…`, `rediss://…`, `redis+cluster://…`.
    pub store: ServiceUrl,
    /// TLS for the gateway listener (clients then speak h2 or HTTP/1.1 over TLS).
    pub tls: TlsConfig,
    /// Logging.
    pub log: LogConfig,
    /// Idempotency policy shared by all routes.
    pub gateway: GatewayConfig,
    /// Path prefixes and their upstreams; first match wins.
    pub routes: Vec<RouteConfig>,
    /// The admin API.
    pub admin: AdminConfig,
    /// Encryption at rest of stored responses in Redis (and Postgres).
    pub store_encryption: StoreEncryptionConfig,
    /// The outbox relay.
    pub relay: RelayConfig,
    /// Outbox destinations by name.
    pub destinations: BTreeMap<String, DestinationConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            store: ServiceUrl::new("memory://"),
            tls: TlsConfig::default(),
            log: LogConfig::default(),
            gateway: GatewayConfig::default(),
            routes: Vec::new(),
            admin: AdminConfig::default(),
            store_encryption: StoreEncryptionConfig::default(),
            relay: RelayConfig::default(),
            destinations: BTreeMap::new(),
        }
    }
}

/// Listener TLS: both files or neither.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// Log output.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A `tracing` filter, e.g. `info` or `idemgate=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, level: "info".into() }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

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

/// How long an idle upstream keep-alive connection is kept by default:
/// below the 5 s keep-alive of Node's HTTP server, the shortest common
/// upstream default, so the gateway closes an idle connection before the
/// upstream does instead of writing a request into one being closed.
/// Connections per upstream unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// How long an idle pooled upstream connection is kept unless configured otherwise.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Where the tenant comes from: exactly one of the three fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// `"authorization"`: a hash of the `Authorization` header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The value of this request header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// One fixed tenant for every request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed: Option<String>,
}

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
    /// Which key is forwarded upstream.
    pub forward_key: ForwardKey,
    /// Request headers that are part of the fingerprint.
    pub fingerprint_headers: Vec<String>,
    /// Canonicalise JSON bodies before fingerprinting.
    pub canonical_json: bool,
    /// Response headers never stored (hop-by-hop headers never are).
    pub response_header_deny: Vec<String>,
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
    /// Concurrent HTTP/2 streams per client connection.
    pub max_streams_per_connection: u32,
    /// Longest request target (path and query) accepted; longer gets `414`.
    pub max_uri_bytes: ByteSize,
    /// Most request header bytes (names and values) accepted; more gets `431`.
    pub max_header_bytes: ByteSize,
    /// Request body bytes buffered at once for one client connection (all
    /// its HTTP/2 streams together); at least `max_request_body`.
    pub connection_body_budget: ByteSize,
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
            tenant: TenantConfig { from: Some("authorization".into()), header: None, fixed: None },
            forward_key: ForwardKey::Original,
            fingerprint_headers: vec!["content-type".into()],
            canonical_json: true,
            response_header_deny: vec!["date".into(), "set-cookie".into()],
            release_statuses: crate::idempotency::StatusPolicy::default().release,
            store_timeout: secs(2),
            header_read_timeout: secs(10),
            request_body_timeout: secs(30),
            idle_timeout: secs(60),
            max_streams_per_connection: 100,
            connection_body_budget: ByteSize(4 << 20),
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
    /// `http://host:port` or `https://host:port`, optionally with a base path.
    pub upstream: String,
    /// Guarded methods.
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
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
}

fn default_prefix() -> String {
    "/".into()
}

fn default_methods() -> Vec<String> {
    vec!["POST".into(), "PATCH".into()]
}

fn default_pool_idle_timeout() -> ConfigDuration {
    ConfigDuration(DEFAULT_POOL_IDLE_TIMEOUT)
}

fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}

/// The admin API.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token (prefer `IDEMGATE__ADMIN__TOKEN` or `token_file`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A file holding the bearer token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// `"token"` (default) or `"disabled"`: no authentication, allowed only
    /// when `admin_listen` is a loopback address.
    pub auth: AdminAuth,
}

/// Whether the admin API checks a bearer token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminAuth {
    /// A bearer token is required; without one configured, `/admin/` is off.
    #[default]
    Token,
    /// No authentication (loopback only).
    Disabled,
}

/// Keys that seal stored responses at rest (see `store::sealing`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreEncryptionConfig {
    /// `id:hex64,id:hex64,…`, the first one sealing (prefer the env variable
    /// `IDEMGATE__STORE_ENCRYPTION__KEYS` or `key_file`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<Secret>,
    /// A file holding the same list, one key per line or comma-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// Values from command-line flags, applied last.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--admin-listen`.
    pub admin_listen: Option<SocketAddr>,
    /// `--store`.
    pub store: Option<String>,
    /// `--upstream`: one route `/` to this URL.
    pub upstream: Option<String>,
    /// `--database-url`.
    pub database_url: Option<String>,
}

impl Config {
    /// Loads file (if any), then `IDEMGATE__…` variables from `env`, then flags.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
                text.parse::<toml::Table>().map_err(|e| ConfigError::Parse(format!("{}: {e}", path.display())))?
            }
            None => toml::Table::new(),
        };
        for (name, value) in env {
            if let Some(path) = name.strip_prefix(ENV_PREFIX) {
                apply_env(&mut table, path, &value)?;
            }
        }
        let mut config =
            Config::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.apply(flags)?;
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        if let Some(listen) = flags.listen {
            self.listen = listen;
        }
        if let Some(admin_listen) = flags.admin_listen {
            self.admin_listen = admin_listen;
        }
        if let Some(store) = &flags.store {
            self.store = ServiceUrl::new(store.clone());
        }
        if let Some(url) = &flags.database_url {
            self.relay.database_url = Some(ServiceUrl::new(url.clone()));
        }
        if let Some(upstream) = &flags.upstream {
            if !self.routes.is_empty() {
                return Err(ConfigError::Invalid("--upstream cannot be combined with [[routes]] in the config file; add the upstream as a route instead".into()));
            }
            self.routes.push(RouteConfig {
                name: "default".into(),
                prefix: default_prefix(),
                upstream: upstream.clone(),
                methods: default_methods(),
                require_key: false,
                keep_host: false,
                ca_file: None,
                max_connections: default_max_connections(),
                release_statuses: None,
                on_unknown: None,
                pool_idle_timeout: default_pool_idle_timeout(),
            });
        }
        Ok(())
    }

    /// Checks what parsing alone cannot; returns warnings for choices that
    /// are allowed but risky.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        let g = &self.gateway;
        let mut warnings = Vec::new();
        if !["memory", "redis", "rediss", "redis+cluster", "rediss+cluster", "postgres", "postgresql"]
            .contains(&self.store.scheme().as_str())
        {
            return invalid(format!(
                "store {:?}: the scheme must be memory://, redis://, rediss://, redis+cluster:// or postgres://",
                self.store.redacted()
            ));
        }
        if g.lease.0 < Duration::from_millis(100) {
            return invalid(format!("gateway.lease = {}: must be at least 100ms", g.lease));
        }
        if g.key_ttl.0 < g.lease.0 {
            return invalid(format!(
                "gateway.key_ttl = {} must not be shorter than gateway.lease = {}",
                g.key_ttl, g.lease
            ));
        }
        if g.upstream_deadline.0 < g.upstream_timeout.0 {
            return invalid(format!(
                "gateway.upstream_deadline = {} must not be shorter than gateway.upstream_timeout = {}",
                g.upstream_deadline, g.upstream_timeout
            ));
        }
        let releasing = std::iter::once(("gateway", g.on_unknown))
            .chain(self.routes.iter().filter_map(|r| Some((r.name.as_str(), r.on_unknown?))))
            .filter(|(_, on_unknown)| *on_unknown == OnUnknown::Release);
        for (name, _) in releasing {
            warnings.push(format!(
                "{name}: on_unknown = \"release\" lets a retry run again a request whose outcome was lost (sent, then no answer): safe only if the upstream deduplicates on the forwarded Idempotency-Key"
            ));
        }
        if g.connection_body_budget.0 < g.max_request_body.0 {
            return invalid(format!(
                "gateway.connection_body_budget = {} must be at least gateway.max_request_body = {}",
                g.connection_body_budget, g.max_request_body
            ));
        }
        // Above these hyper refuses on its own, with a bare status and no problem body.
        if g.max_uri_bytes.0 > 60 << 10 || g.max_header_bytes.0 > 256 << 10 {
            return invalid(
                "gateway.max_uri_bytes is at most 60KiB and gateway.max_header_bytes at most 256KiB".into(),
            );
        }
        if g.max_streams_per_connection == 0 {
            return invalid("gateway.max_streams_per_connection must be at least 1".into());
        }
        for (name, value) in [
            ("header_read_timeout", g.header_read_timeout),
            ("request_body_timeout", g.request_body_timeout),
            ("idle_timeout", g.idle_timeout),
        ] {
            if value.0.is_zero() {
                return invalid(format!("gateway.{name} must be more than 0s"));
            }
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return invalid("tls needs both cert_file and key_file, or neither".into());
        }
        if self.admin.auth == AdminAuth::Disabled && !self.admin_listen.ip().is_loopback() {
            return invalid(format!(
                "admin.auth = \"disabled\" is only allowed on a loopback admin_listen, not {}",
                self.admin_listen
            ));
        }
        if g.max_connections == 0 {
            return invalid("gateway.max_connections must be at least 1".into());
        }
        let sources = [&g.tenant.from, &g.tenant.header, &g.tenant.fixed].iter().filter(|s| s.is_some()).count();
        if sources != 1 {
            return invalid("gateway.tenant must set exactly one of from = \"authorization\", header = \"<name>\" or fixed = \"<tenant>\"".into());
        }
        if let Some(from) = &g.tenant.from
            && from != "authorization"
        {
            return invalid(format!("gateway.tenant.from = {from:?}: the only source is \"authorization\""));
        }
        if let Some(header) = &g.tenant.header
            && http::HeaderName::from_bytes(header.as_bytes()).is_err()
        {
            return invalid(format!("gateway.tenant.header = {header:?} is not a valid header name"));
        }
        for name in g.fingerprint_headers.iter().chain(&g.response_header_deny) {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return invalid(format!("{name:?} is not a valid header name"));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for route in &self.routes {
            if !names.insert(route.name.as_str()) {
                return invalid(format!("two routes are named {:?}", route.name));
            }
            if !route.prefix.starts_with('/') {
                return invalid(format!("route {:?}: prefix {:?} must start with '/'", route.name, route.prefix));
            }
            check_upstream_url(&route.upstream)
                .map_err(|e| ConfigError::Invalid(format!("route {:?}: {e}", route.name)))?;
            if !(1..=65_536).contains(&route.max_connections) {
                return invalid(format!("route {:?}: max_connections must be between 1 and 65536", route.name));
            }
            for method in &route.methods {
                if http::Method::from_bytes(method.as_bytes()).is_err() {
                    return invalid(format!("route {:?}: {method:?} is not an HTTP method", route.name));
                }
            }
        }
        let release_lists =
            std::iter::once(&g.release_statuses).chain(self.routes.iter().filter_map(|r| r.release_statuses.as_ref()));
        for status in release_lists.flatten() {
            if !(100..500).contains(status) {
                return invalid(format!(
                    "release_statuses: {status} must be a status below 500 (every 5xx always releases)"
                ));
            }
        }
        relay::validate(&self.relay, &self.destinations, &mut warnings)?;
        Ok(warnings)
    }
}

/// Checks that an upstream is an absolute `http`/`https` URL with a host.
pub fn check_upstream_url(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("upstream {url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("upstream {url:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("upstream {url:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("upstream {url:?} must not have a query"));
    }
    Ok(uri)
}

/// Sets `a.b.c = value` for `IDEMGATE__A__B__C=value`; the value is read as
/// a TOML value when it parses as one (`10`, `true`, `["a"]`), else as a string.
fn apply_env(table: &mut toml::Table, path: &str, raw: &str) -> Result<(), ConfigError> {
    let segments: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
    if segments.iter().any(String::is_empty) {
        return Err(ConfigError::Parse(format!("environment variable {ENV_PREFIX}{path}: empty path segment")));
    }
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let (last, parents) = segments.split_last().ok_or_else(|| ConfigError::Parse("empty environment path".into()))?;
    let mut current = table;
    for segment in parents {
        let entry = current.entry(segment.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry.as_table_mut().ok_or_else(|| {
            ConfigError::Parse(format!("environment variable {ENV_PREFIX}{path}: {segment} is not a section"))
        })?;
    }
    current.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests;

//! Typed configuration, read in layers: defaults, then the TOML file, then
//! `IDEMGATE__SECTION__FIELD` environment variables, then command-line flags.
//!
//! Every field has a default, so `idemgate serve --upstream URL` runs with no
//! file at all. Unknown fields are errors (a typo must not silently fall back
//! to a default on a payment path). Secrets are wrapped in [`Secret`] and
//! never printed; `check-config` prints the effective config with them
//! redacted.
//!
//! The files: [`load`](Config::load) (the layers), the sections
//! (`gateway.rs`, `tenant.rs`, `relay.rs`, here the rest), `secret.rs` ([`Secret`],
//! [`ServiceUrl`]), `scrub.rs` ([`Scrubber`]: the config's secrets taken
//! out of texts from outside before they are stored or printed), `units.rs` (durations and sizes as people write them), `http_names.rs` (header
//! names and methods, parsed into `http`'s types as the file is read)
//! and `validate.rs`. Config is plain data: it calls nothing above the pure
//! core, and what only a room's own code can check is that room's (see
//! `crate::app::check`).

mod gateway;
mod http_names;
mod load;
mod quota;
mod relay;
mod scrub;
mod secret;
mod tenant;
mod units;
mod validate;
mod webhook;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use gateway::{
    ConcurrentMode, DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_IDLE_TIMEOUT, FailMode, ForwardKey, GatewayConfig, OnUnknown,
    RouteConfig,
};
pub use http_names::{ConfigHeaderName, ConfigMethod, NotAHeaderName, NotAMethod};
pub use load::Overrides;
pub use quota::{QuotaError, TenantQuota};
pub use relay::{DestinationConfig, DestinationKind, RelayConfig, is_schema_name};
pub use scrub::{MIN_SECRET, REDACTED, Scrubber};
pub use secret::{STORE_SCHEMES, Secret, ServiceUrl, StoreKind};
pub use tenant::{JwtClaimConfig, JwtKeys, TenantConfig, TenantConfigError};
pub use units::{ByteSize, ConfigDuration, UnitError};
pub use validate::{UpstreamUrlError, check_upstream_url};
pub use webhook::{
    DEFAULT_KEY_HEADER, DEFAULT_TOLERANCE, KeySource, KeySourceError, MAX_SECRETS, Scheme, WebhookConfig, WebhookError,
    check_pointer,
};

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
    /// A route's upstream is not a URL the gateway can forward to.
    #[error("invalid configuration: route {route:?}: {source}")]
    Upstream {
        /// The route.
        route: String,
        /// Why.
        #[source]
        source: UpstreamUrlError,
    },
    /// A route's `webhook` table does not make sense.
    #[error("invalid configuration: route {route:?}: {source}")]
    Webhook {
        /// The route.
        route: String,
        /// Why.
        #[source]
        source: WebhookError,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the gateway listens.
    pub listen: SocketAddr,
    /// Where the admin API, metrics and health checks listen.
    pub admin_listen: SocketAddr,
    /// How the gateway spreads its work over the CPUs (see [`Runtime`]).
    pub runtime: Runtime,
    /// The key store: `memory://`, `redis://…`, `rediss://…`, `redis+cluster://…`,
    /// `redis+sentinel://…`.
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
            runtime: Runtime::default(),
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

/// How the gateway spreads its work over the CPUs. The number of threads
/// is one per CPU the process may use, or `TOKIO_WORKER_THREADS`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// One single-threaded runtime per thread, each with its own listener
    /// (`SO_REUSEPORT`: the kernel spreads connections), upstream pools
    /// and store connection; a connection stays on the thread that took it.
    /// The default: measured, 1.3-1.4 × work-stealing's passthrough and
    /// 1.2 × its replays at full load, and half its added p99 at 2,000
    /// requests/s (load-tests/results/runtimes.md).
    #[default]
    PerCore,
    /// One pool of worker threads that take work from each other: for a
    /// process with one or two busy client connections (a sidecar's), which
    /// per-core may put on one core.
    WorkStealing,
}

impl Runtime {
    /// The name a config file uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PerCore => "per-core",
            Self::WorkStealing => "work-stealing",
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

#[cfg(test)]
mod tests;

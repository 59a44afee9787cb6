//! The `[relay]` section and the `[destinations.<name>]` tables.
//!
//! Plain values, checked here for what each means on its own (a positive
//! timeout, a batch between 1 and 1000). What needs the relay's own code —
//! a destination's URL, method and headers as its requests are built, and
//! whether the worst-case retry window fits `key_retention` — is checked by
//! `crate::outbox::check`, which `check-config`, `serve` and `relay` all
//! run. A destination URL may carry credentials
//! (`https://user:password@host/…`, sent as `Authorization: Basic`); it is
//! printed with the password redacted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigDuration, ConfigError, ServiceUrl};

fn secs(s: u64) -> ConfigDuration {
    ConfigDuration(Duration::from_secs(s))
}

/// The outbox relay.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// The service's database.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<ServiceUrl>,
    /// Pooled connections (claims, renewals, completions); LISTEN has its own.
    pub pool_size: usize,
    /// Rows claimed (and published concurrently) per step, at most. Each
    /// step costs two statements (the claim and the completion) whatever
    /// its size, so bigger steps cost the database less per row; the price
    /// is up to this many concurrent requests (and connections) to a
    /// destination.
    pub batch_size: u32,
    /// Does nothing any more (each destination's lane is a claim loop of
    /// its own; `max_in_flight` bounds its publishes). Still accepted, so
    /// existing config files load, with a warning that says so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<u32>,
    /// How long a claim holds a row without renewal. Renewed every third of it.
    pub lease: ConfigDuration,
    /// How often the relay looks for work without a notification.
    pub poll_interval: ConfigDuration,
    /// How often expired leases are returned to the queue.
    pub reap_interval: ConfigDuration,
    /// How long delivered rows stay in the history (and block re-enqueueing).
    pub history_retention: ConfigDuration,
    /// Wake up on `LISTEN/NOTIFY` (polling runs either way).
    pub listen: bool,
    /// The schema holding the outbox (`idemgate`; another name for tests
    /// or several independent outboxes in one database).
    pub schema: String,
    /// The largest payload `idemgate.enqueue` accepts, in bytes of the JSON
    /// text the relay sends. Enforced by the database: `idemgate migrate`
    /// writes it into `idemgate.settings`, so run it with this config.
    pub max_payload: super::ByteSize,
    /// Publishes in flight at once to *each* destination (at least 1): a
    /// slow destination holds at most this many of its own slots, and
    /// never another destination's claims or publishes.
    pub max_in_flight: std::num::NonZeroU32,
    /// Payload bytes one claim takes at most (as well as `batch_size`
    /// rows); a single row larger than this is claimed alone.
    pub max_batch_bytes: super::ByteSize,
    /// Payload bytes held by claimed, unpublished rows across all
    /// destinations, shared out equally between them.
    pub max_in_flight_bytes: super::ByteSize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            database_url: None,
            pool_size: 4,
            batch_size: 128,
            workers: None,
            lease: secs(30),
            poll_interval: secs(1),
            reap_interval: secs(5),
            history_retention: secs(7 * 86_400),
            listen: true,
            schema: "idemgate".into(),
            max_payload: super::ByteSize(1 << 20),
            max_in_flight: std::num::NonZeroU32::new(128).unwrap_or(std::num::NonZeroU32::MIN),
            max_batch_bytes: super::ByteSize(8 << 20),
            max_in_flight_bytes: super::ByteSize(32 << 20),
        }
    }
}

/// What a destination is: the publisher that serves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DestinationKind {
    /// An HTTP endpoint: the row's payload as a request body, the derived
    /// key as `Idempotency-Key`.
    #[default]
    Http,
    /// NATS JetStream: the payload as a message on `subject`, the derived
    /// key as `Nats-Msg-Id`, delivered on the stream's acknowledgement.
    Nats,
    /// RabbitMQ (AMQP 0-9-1): the payload as a persistent message to
    /// `exchange` with `routing_key`, the derived key as `message_id`,
    /// delivered on the broker's confirmation.
    Amqp,
}

impl DestinationKind {
    /// Its name in a config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Nats => "nats",
            Self::Amqp => "amqp",
        }
    }
}

/// One outbox destination. Printed (`Debug`, `check-config`) with the
/// URL's password and every header value redacted.
///
/// One table for every kind: the fields of another kind are refused where
/// the destination is built (`crate::outbox::publisher`), naming the field.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    /// The publisher that serves it: `http` (the default), `nats`, `amqp`.
    #[serde(default)]
    pub kind: DestinationKind,
    /// Where to send: `http://` or `https://` for `http`; `nats://` (or
    /// `tls://`, TLS required) for `nats`; `amqp://` or `amqps://` for
    /// `amqp`. Credentials in it
    /// (`user:password@`) are used (HTTP: `Authorization: Basic`) and
    /// redacted when the config is printed.
    #[serde(serialize_with = "redacted_url")]
    pub url: String,
    /// HTTP method (`http` only; default `POST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The subject each message is published on (`nats` only): a template
    /// over `{destination}`, `{operation}`, `{business_key}` and
    /// `{ordering_key}`, e.g. `"orders.{operation}"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The exchange each message is published to (`amqp` only; `""` is
    /// the default exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    /// The routing key (`amqp` only): a template over the same names as
    /// `subject`, e.g. `"orders.{operation}"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    /// Extra request (or message) headers. Their values are redacted when
    /// the config is printed: they often carry credentials.
    #[serde(default, serialize_with = "redacted_values")]
    pub headers: BTreeMap<String, String>,
    /// Limit on one delivery attempt (until the whole response is read).
    /// Keep it below `relay.lease`.
    #[serde(default = "default_destination_timeout")]
    pub timeout: ConfigDuration,
    /// Attempts before a row is dead.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// The first backoff's upper bound; it doubles per attempt.
    #[serde(default = "default_backoff_base")]
    pub backoff_base: ConfigDuration,
    /// The cap on one backoff, and on an honoured `Retry-After`.
    #[serde(default = "default_backoff_max")]
    pub backoff_max: ConfigDuration,
    /// How long the destination remembers an `Idempotency-Key`.
    #[serde(default = "default_key_retention")]
    pub key_retention: ConfigDuration,
    /// Extra CA certificates (PEM) trusted for an `https://` destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl DestinationConfig {
    /// A destination with every default but its URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            kind: DestinationKind::Http,
            url: url.into(),
            method: None,
            subject: None,
            exchange: None,
            routing_key: None,
            headers: BTreeMap::new(),
            timeout: default_destination_timeout(),
            max_attempts: default_max_attempts(),
            backoff_base: default_backoff_base(),
            backoff_max: default_backoff_max(),
            key_retention: default_key_retention(),
            ca_file: None,
        }
    }
}

impl std::fmt::Debug for DestinationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestinationConfig")
            .field("kind", &self.kind)
            .field("url", &ServiceUrl::new(self.url.as_str()))
            .field("method", &self.method)
            .field("subject", &self.subject)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("key_retention", &self.key_retention)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

pub(super) fn redacted_url<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&ServiceUrl::new(url).redacted())
}

fn redacted_values<S: serde::Serializer>(headers: &BTreeMap<String, String>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(headers.keys().map(|name| (name, "[redacted]")))
}

fn default_destination_timeout() -> ConfigDuration {
    secs(5)
}
fn default_max_attempts() -> u32 {
    12
}
fn default_backoff_base() -> ConfigDuration {
    secs(1)
}
fn default_backoff_max() -> ConfigDuration {
    secs(600)
}
fn default_key_retention() -> ConfigDuration {
    secs(86_400)
}

/// Whether `name` can name the outbox's schema: lower-case letters, digits
/// and `_`, not starting with a digit, at most 63 bytes (Postgres's limit),
/// so it needs no quoting anywhere it is written into SQL.
pub fn is_schema_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// The warning for a config that still sets `relay.workers`.
const WORKERS_INERT: &str = "relay.workers does nothing any more: each destination is a claim loop of its own and \
     its max_in_flight bounds its publishes; remove it";

/// Checks the relay section and every destination; pushes warnings.
pub(super) fn validate(
    relay: &RelayConfig,
    destinations: &BTreeMap<String, DestinationConfig>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if let Some(url) = &relay.database_url
        && !["postgres", "postgresql"].contains(&url.scheme().as_str())
    {
        return invalid(format!("relay.database_url {:?} must be a postgres:// URL", url.redacted()));
    }
    if !is_schema_name(&relay.schema) {
        return invalid(format!("relay.schema = {:?}: lower-case letters, digits and _ only", relay.schema));
    }
    if relay.pool_size < 2 {
        return invalid("relay.pool_size must be at least 2 (claims and lease renewals run side by side)".into());
    }
    if let Some(workers) = relay.workers {
        warnings.push(format!("{WORKERS_INERT} (relay.workers = {workers})"));
    }
    for (name, bytes) in [
        ("max_payload", relay.max_payload),
        ("max_batch_bytes", relay.max_batch_bytes),
        ("max_in_flight_bytes", relay.max_in_flight_bytes),
    ] {
        if bytes.0 == 0 {
            return invalid(format!("relay.{name} must be more than 0 bytes"));
        }
    }
    if !(1..=1000).contains(&relay.batch_size) {
        return invalid(format!("relay.batch_size = {}: must be between 1 and 1000", relay.batch_size));
    }
    if relay.lease.0 < Duration::from_millis(100) {
        return invalid(format!("relay.lease = {}: must be at least 100ms", relay.lease));
    }
    if relay.poll_interval.0 < Duration::from_millis(10) || relay.reap_interval.0 < Duration::from_millis(10) {
        return invalid("relay.poll_interval and relay.reap_interval must be at least 10ms".into());
    }
    if relay.history_retention.0 < Duration::from_secs(3600) {
        return invalid(format!("relay.history_retention = {}: must be at least 1h", relay.history_retention));
    }
    for (name, d) in destinations {
        let at = |m: String| ConfigError::Invalid(format!("destinations.{name}: {m}"));
        if d.timeout.0.is_zero() || d.max_attempts == 0 {
            return Err(at("timeout and max_attempts must be positive".into()));
        }
        if d.backoff_base.0.is_zero() || d.backoff_base.0 > d.backoff_max.0 {
            return Err(at("backoff_base must be positive and not above backoff_max".into()));
        }
        if d.timeout.0 > relay.lease.0 {
            warnings.push(format!(
                "destinations.{name}: timeout = {} exceeds relay.lease = {}: a publish then outlives its lease whenever a renewal fails (a database blip) or the relay shuts down (the running step gets one lease), and the row is published again; raise relay.lease or lower the timeout",
                d.timeout, relay.lease
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_timeout_above_the_lease_is_warned_about() {
        let mut destination = DestinationConfig::new("http://127.0.0.1:9100/send");
        destination.timeout = ConfigDuration(Duration::from_secs(31));
        let mut warnings = Vec::new();
        validate(&RelayConfig::default(), &BTreeMap::from([("slow".to_string(), destination)]), &mut warnings).unwrap();
        assert!(warnings.iter().any(|w| w.contains("timeout = 31s exceeds relay.lease = 30s")), "{warnings:?}");
    }

    #[test]
    fn a_destination_url_is_printed_without_its_password() {
        let destination = DestinationConfig::new("https://alice:s3cret@api.example.com/send");
        let printed = format!("{} {destination:?}", toml::to_string(&destination).unwrap());
        assert!(printed.contains("https://alice:[redacted]@api.example.com/send"), "{printed}");
        assert!(!printed.contains("s3cret"), "{printed}");
    }

    #[test]
    fn destination_header_values_are_not_printed() {
        let mut destination = DestinationConfig::new("http://127.0.0.1:9100/send");
        destination.headers.insert("authorization".into(), "Bearer s3cret".into());
        let printed = format!("{} {destination:?}", toml::to_string(&destination).unwrap());
        assert!(printed.contains("authorization") && !printed.contains("s3cret"), "{printed}");
    }

    /// The relay example in docs/outbox.md must stay loadable.
    #[test]
    fn the_outbox_page_relay_example_loads() {
        let page = include_str!("../../docs/outbox.md");
        let section = &page[page.find("## Run the relay").expect("a Run the relay section")..];
        let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let block = &section[start..start + section[start..].find("```").expect("closed block")];
        let config: crate::config::Config = toml::from_str(block).unwrap();
        let warnings = config.validate().unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.destinations["email"].backoff_max.0, Duration::from_secs(600));
    }

    #[test]
    fn workers_is_accepted_with_a_warning_that_it_does_nothing() {
        let mut warnings = Vec::new();
        validate(&RelayConfig::default(), &BTreeMap::new(), &mut warnings).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let config: crate::config::Config = toml::from_str("[relay]\nworkers = 8\n").unwrap();
        let warnings = config.validate().unwrap();
        assert_eq!(warnings, [format!("{WORKERS_INERT} (relay.workers = 8)")]);
        assert!(!toml::to_string(&crate::config::Config::default()).unwrap().contains("workers"));
    }

    #[test]
    fn byte_limits_must_be_positive() {
        for name in ["max_payload", "max_batch_bytes", "max_in_flight_bytes"] {
            let mut relay = RelayConfig::default();
            match name {
                "max_payload" => relay.max_payload.0 = 0,
                "max_batch_bytes" => relay.max_batch_bytes.0 = 0,
                _ => relay.max_in_flight_bytes.0 = 0,
            }
            let error = validate(&relay, &BTreeMap::new(), &mut Vec::new()).unwrap_err().to_string();
            assert!(error.contains(name), "{error}");
        }
        assert!(validate(&RelayConfig::default(), &BTreeMap::new(), &mut Vec::new()).is_ok());
    }

    #[test]
    fn a_relay_database_must_be_postgres() {
        let relay = RelayConfig { database_url: Some(ServiceUrl::new("redis://x")), ..Default::default() };
        assert!(validate(&relay, &BTreeMap::new(), &mut Vec::new()).is_err());
    }
}

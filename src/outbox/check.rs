//! What the relay checks in a config beyond plain values, before it
//! touches a database: the database URL's TLS settings (`sslmode`, a
//! readable `sslrootcert`), every destination built as the relay builds it
//! (URL, method, headers, a readable `ca_file`), and whether each
//! destination's worst-case retry window fits its `key_retention`.
//!
//! The window must fit because `key_retention` is how long the destination
//! remembers an `Idempotency-Key`: a retry that arrives after it forgot the
//! key would be applied a second time. The count is what can really
//! happen — every attempt's `timeout`, every wait at `backoff_max` (a
//! `Retry-After` is honoured up to it), and a `poll_interval` per wait for
//! the relay to notice the row is due ([`RetryPolicy::worst_case_window`]).
//!
//! `check-config`, `serve` and `relay` run [`check`] alike, so what one
//! accepts the others accept.

use crate::config::{Config, ConfigDuration, DestinationConfig, RelayConfig};
use crate::outbox::publisher::Destinations;
use crate::outbox::retry::RetryPolicy;
use crate::postgres::Endpoint;

/// What the relay could not build from a config.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The database URL or its TLS settings.
    #[error(transparent)]
    Database(#[from] crate::postgres::PostgresError),
    /// A destination.
    #[error(transparent)]
    Destination(#[from] crate::outbox::publisher::PublisherError),
}

/// Checks `config` as the relay would build it; returns warnings for what
/// is allowed but risky, or what is wrong, naming the field.
pub fn check(config: &Config) -> Result<Vec<String>, CheckError> {
    let mut warnings = Vec::new();
    match &config.relay.database_url {
        Some(url) => drop(Endpoint::parse(url.expose())?),
        None if !config.destinations.is_empty() => warnings.push(
            "destinations are configured but relay.database_url is not: relay and serve --relay need it (or --database-url)"
                .to_string(),
        ),
        None => {}
    }
    if !config.destinations.is_empty() {
        Destinations::new(&config.destinations)?;
    }
    for (name, destination) in &config.destinations {
        warnings.extend(window_warning(name, destination, &config.relay));
    }
    Ok(warnings)
}

/// The warning for a destination whose worst-case retry window exceeds its `key_retention`.
fn window_warning(name: &str, d: &DestinationConfig, relay: &RelayConfig) -> Option<String> {
    let window = RetryPolicy::from(d).worst_case_window(d.timeout.0, relay.poll_interval.0);
    (window > d.key_retention.0).then(|| {
        format!(
            "destinations.{name}: the worst-case retry window, {} ({} attempts of up to timeout = {}; between them, waits of up to backoff_max = {}, which also caps Retry-After, plus poll_interval = {}), exceeds key_retention = {}: a retry after the destination forgot the key could be applied twice; lower max_attempts, timeout or backoff_max",
            ConfigDuration(window),
            d.max_attempts,
            d.timeout,
            d.backoff_max,
            relay.poll_interval,
            d.key_retention
        )
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    fn config(name: &str, destination: DestinationConfig, relay: RelayConfig) -> Config {
        Config { destinations: BTreeMap::from([(name.to_string(), destination)]), relay, ..Config::default() }
    }

    #[test]
    fn a_retry_window_beyond_the_key_retention_is_warned_about() {
        let mut destination = DestinationConfig::new("http://127.0.0.1:9100/send");
        let warnings = check(&config("email", destination.clone(), RelayConfig::default())).unwrap();
        assert!(warnings.iter().all(|w| !w.contains("key_retention")), "the defaults fit: {warnings:?}");
        destination.max_attempts = 500;
        let warnings = check(&config("email", destination, RelayConfig::default())).unwrap();
        assert!(warnings.iter().any(|w| w.contains("key_retention")), "{warnings:?}");
    }

    /// The case of issue 11: 3.1 s of real retrying passed a 1 s retention
    /// when only the backoff caps (30 ms) were counted.
    #[test]
    fn a_window_made_of_timeouts_and_capped_waits_beyond_the_key_retention_is_warned_about() {
        let mut d = DestinationConfig::new("http://127.0.0.1:9100/send");
        d.timeout = ConfigDuration(Duration::from_secs(1));
        d.max_attempts = 3;
        d.backoff_base = ConfigDuration(Duration::from_millis(10));
        d.backoff_max = ConfigDuration(Duration::from_millis(50));
        d.key_retention = ConfigDuration(Duration::from_secs(1));
        let relay = RelayConfig { poll_interval: ConfigDuration(Duration::from_millis(10)), ..Default::default() };
        let warning = window_warning("billing", &d, &relay).expect("a warning");
        assert!(warning.contains("3120ms") && warning.contains("key_retention = 1s"), "{warning}");
        d.key_retention = ConfigDuration(Duration::from_millis(3120));
        assert_eq!(window_warning("billing", &d, &relay), None, "a window that fits exactly is fine");
    }

    #[test]
    fn a_broken_destination_is_named_and_its_password_never_printed() {
        let mut broken = DestinationConfig::new("https://alice:s3cret@api.example.com/send");
        broken.headers.insert("authorization".into(), "Bearer x".into());
        let error = check(&config("x", broken, RelayConfig::default())).unwrap_err().to_string();
        assert!(error.contains("destinations.x") && !error.contains("s3cret"), "{error}");
    }

    #[test]
    fn a_destination_may_not_set_its_own_idempotency_key() {
        let mut destination = DestinationConfig::new("http://127.0.0.1:9100/send");
        destination.headers.insert("Idempotency-Key".into(), "x".into());
        let error = check(&config("email", destination, RelayConfig::default())).unwrap_err().to_string();
        assert!(error.contains("destinations.email") && error.contains("Idempotency-Key"), "{error}");
    }
}

//! The knobs of one relay, as `[relay]` sets them.

use std::time::Duration;

use crate::config::RelayConfig;

/// The knobs of one relay, from `[relay]`.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Lease per claim.
    pub lease: Duration,
    /// Rows per claim, at most.
    pub batch_size: u32,
    /// Rows of one destination in flight at once in [`Relay::run`](super::Relay::run) (at least 1).
    pub max_in_flight: u32,
    /// Payload bytes per claim, at most (a larger row goes alone).
    pub max_batch_bytes: u64,
    /// Payload bytes in flight across all destinations in [`Relay::run`](super::Relay::run),
    /// an equal share for each.
    pub max_in_flight_bytes: u64,
    /// Wait between claims when idle and not notified.
    pub poll_interval: Duration,
    /// Wait between reaper runs.
    pub reap_interval: Duration,
    /// History retention.
    pub history_retention: Duration,
}

impl From<&RelayConfig> for Settings {
    fn from(c: &RelayConfig) -> Self {
        Self {
            lease: c.lease.0,
            batch_size: c.batch_size,
            max_in_flight: c.max_in_flight.get(),
            max_batch_bytes: c.max_batch_bytes.0,
            max_in_flight_bytes: c.max_in_flight_bytes.0,
            poll_interval: c.poll_interval.0,
            reap_interval: c.reap_interval.0,
            history_retention: c.history_retention.0,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self::from(&RelayConfig::default())
    }
}

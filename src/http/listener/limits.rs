//! A listener's limits ([`ServerLimits`]): the gateway's from `[gateway]`,
//! converted once, and the internal listeners' fixed ones.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::config::GatewayConfig;

/// Limits of a listener.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Time allowed for a TLS handshake, a new connection's first request
    /// head, and each HTTP/1.1 request's headers.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams_per_connection: u32,
    /// Request-body bytes one connection may hold buffered at once.
    pub connection_body_budget: u64,
    /// Bytes of settled answers one connection may hold for its client
    /// ([`crate::http::sending`]).
    pub connection_response_budget: u64,
    /// Time allowed for in-flight work after shutdown starts.
    pub shutdown_grace: Duration,
    /// A connection with a large response that its client has not taken a
    /// slice of for this long is dropped ([`crate::http::sending`]).
    pub send_timeout: Duration,
}

impl ServerLimits {
    /// Limits for an internal listener (admin, relay admin, demo): small
    /// requests from few clients, no drain worth waiting for.
    pub fn internal() -> Self {
        Self {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_streams_per_connection: 16,
            connection_body_budget: 1 << 20,
            connection_response_budget: 16 << 20,
            shutdown_grace: Duration::ZERO,
            send_timeout: Duration::from_secs(30),
        }
    }

    /// The `max_connections` slots open connections hold: one set for all
    /// the listeners that share the limit.
    pub fn connection_slots(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.max_connections))
    }
}

impl From<&GatewayConfig> for ServerLimits {
    /// The gateway listener's limits.
    fn from(g: &GatewayConfig) -> Self {
        Self {
            max_connections: g.max_connections,
            header_read_timeout: g.header_read_timeout.0,
            idle_timeout: g.idle_timeout.0,
            max_streams_per_connection: g.max_streams_per_connection,
            connection_body_budget: g.connection_body_budget.0,
            connection_response_budget: g.connection_response_budget.0,
            shutdown_grace: g.shutdown_grace.0,
            send_timeout: g.send_timeout.0,
        }
    }
}

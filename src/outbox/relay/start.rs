//! Starting a relay whether or not its database is there.
//!
//! `crate::app::relay::build` turns the config into a relay without
//! connecting: only what the config itself gets wrong (a URL, a TLS file, a
//! destination) stops the start. [`Relay::start`] then waits for the database in the
//! background — retrying with a backoff from 100 ms to 10 s, logging why
//! (once, then every 30 s) — checks the schema version, and runs. So
//! `idemgate relay` and `idemgate serve --relay` come up while the
//! database is down (the gateway serves; `/readyz` says not ready) and
//! relay once it is back, without a restart.
//!
//! What retrying cannot fix stops the start instead, with the reason: a
//! schema that is missing, older or newer than this binary (run `idemgate
//! migrate`), and a server that refuses the login, knows no such database,
//! or denies the relay's role the schema (SQLSTATE classes `28`, `3D`,
//! `42`) — see [`is_outage`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Relay;
use crate::outbox::OutboxError;
use crate::outbox::publisher::Publisher;
use crate::postgres::{Endpoint, PostgresError, migrate};

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(10);
const LOG_EVERY: Duration = Duration::from_secs(30);
/// Bound on one connect-and-check: a server that accepts but never answers is an outage too.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether a relay has reached its database and found the schema current.
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    /// `true` once [`Relay::start`] has checked the schema.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl<P: Publisher> Relay<P> {
    /// Waits until the database answers and holds the schema this binary
    /// expects (`Ok(true)`), or `stop` (`Ok(false)`). Fails only on what
    /// no retry can fix ([`is_outage`]); everything else is retried.
    pub async fn wait_for_schema(&self, stop: &CancellationToken) -> Result<bool, OutboxError> {
        let db = &self.inner.db;
        let mut delay = RETRY_MIN;
        let mut failures = 0u64;
        let mut logged: Option<Instant> = None;
        loop {
            let check = async {
                let client = db.pool.get().await?;
                migrate::require_current(&client, &db.schema).await.map_err(OutboxError::from)
            };
            let checked = tokio::select! {
                checked = tokio::time::timeout(ATTEMPT_TIMEOUT, check) => checked,
                () = stop.cancelled() => return Ok(false),
            };
            let error = match checked {
                Ok(Ok(())) => {
                    self.inner.readiness.set();
                    tracing::info!(schema = db.schema.name(), failures, "outbox database reached; schema is current");
                    return Ok(true);
                }
                Ok(Err(e)) if !is_outage(&e) => return Err(e),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
            };
            failures += 1;
            if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                tracing::warn!(error = %error, failures, retry_in = ?delay, "outbox database unavailable; the relay waits for it (not ready)");
                logged = Some(Instant::now());
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => return Ok(false),
            }
            delay = (delay * 2).min(RETRY_MAX);
        }
    }

    /// [`Self::wait_for_schema`], then [`Self::run`], until `stop`.
    pub async fn start(self, listen: Option<Endpoint>, stop: CancellationToken) -> Result<(), OutboxError> {
        if self.wait_for_schema(&stop).await? {
            self.run(listen, stop).await;
        }
        Ok(())
    }
}

/// Whether `error` may pass by itself (the server is down, starting,
/// restarting, out of connections, unreachable), rather than needing a
/// person: a wrong schema, or the server refusing the login (`28…`), not
/// knowing the database (`3D…`) or denying access (`42…`, e.g. permission
/// denied on the schema).
pub fn is_outage(error: &OutboxError) -> bool {
    let refused = |e: &tokio_postgres::Error| {
        e.code().is_some_and(|code| ["28", "3D", "42"].iter().any(|class| code.code().starts_with(class)))
    };
    match error {
        OutboxError::Postgres(PostgresError::Schema(_) | PostgresError::InvalidUrl(_) | PostgresError::Tls { .. }) => {
            false
        }
        OutboxError::Postgres(
            PostgresError::Database(e) | PostgresError::Pool(deadpool_postgres::PoolError::Backend(e)),
        ) => !refused(e),
        _ => true,
    }
}

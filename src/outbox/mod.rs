//! The transactional outbox relay on Postgres.
//!
//! A service writes a side effect into `idemgate.outbox` with
//! `idemgate.enqueue(...)` in the *same transaction* as its own state
//! change; the relay publishes it later, at least once, always under the
//! same derived key `hex(sha256(outbox ‖ destination ‖ operation ‖
//! business_key))`, so a destination that honours `Idempotency-Key` applies
//! it exactly once. `outbox` is the schema's name, so two outboxes in one
//! database never share a key at a destination they both use.
//!
//! The rooms:
//!
//! - [`roles`] — what a service role (enqueue, nothing more) and a relay
//!   role (not the owner, not a superuser) are granted.
//! - [`enqueue`] — [`enqueue::derived_key`] (pure) and the Rust helper that
//!   enqueues inside a caller's `tokio_postgres::Transaction`.
//! - [`enqueue_many`] — the same for many messages in one call (one
//!   `INSERT … SELECT` in the database instead of a call per row).
//! - [`claim`] — every statement the relay runs: claim, renew, complete,
//!   retry, bury, reap, redrive. Each is one short autocommit statement;
//!   completion and failure are fenced on `attempts`.
//! - [`retry`] — pure: what an attempt came to ([`retry::Delivery`]) and
//!   what its row does next ([`retry::Next`]), backoff with full jitter,
//!   `Retry-After`.
//! - [`publisher`] — the [`publisher::Publisher`] trait and one
//!   destination per kind (HTTP, NATS JetStream, RabbitMQ).
//! - [`check`] — what the relay checks in a config before it connects:
//!   TLS settings, every destination as built, retry windows.
//! - [`census`] — the backlog per destination, and rows of destinations the
//!   relay does not have (*unroutable*): for gauges, logs and the admin API.
//! - [`relay`] — the worker: the service ([`relay::Relay::run`]): a lane per
//!   destination, each with its own bounded concurrency and byte budget, and
//!   housekeeping (reaper, census, retention) in a task of its own; and one
//!   step of those same lanes for tests ([`relay::Relay::try_execute_step`]).
//! - [`listen`] — `LISTEN/NOTIFY` wake-ups on a connection outside the pool.
//!
//! The database itself (pool, schema name, migrations, TLS) is reached
//! through [`crate::postgres`]; [`Schema`] lets the whole outbox live in a
//! schema other than `idemgate` (tests use one per test). The admin
//! listener's outbox routes (dead rows, redrive) live in `crate::admin`.
//!
//! Guarantees and their limits:
//!
//! - **Once per derived key**: enqueueing a key that is waiting, dead, or
//!   was delivered within `relay.history_retention` is a no-op.
//! - **At least once** delivery: a row leaves the outbox only in the
//!   statement that records its delivery. A relay that dies between publish
//!   and that statement leaves the row leased; after the lease the reaper
//!   returns it and it is published again *with the same key*.
//! - **Per-ordering-key FIFO in commit order**; a failing (or dead) head
//!   blocks only its own key. Rows without an ordering key go in parallel.
//! - **No deadlock between enqueuers**: `enqueue` and `enqueue_many` lock
//!   a call's ordering keys, then its derived keys, each in byte order,
//!   whatever the order of its arguments; retention skips ordering keys
//!   in use rather than wait for them.
//! - **No configured secret is stored or printed**: a failure reason is
//!   scrubbed of the config's secrets ([`crate::config::Scrubber`]) where
//!   the publisher forms it, before `last_error`, the admin API or a log.
//! - **Time** is only ever the database's `now()`: leases, backoffs and
//!   retention are computed in SQL; the relay passes durations, never
//!   instants (its own poll and renewal cadence uses local monotonic timers).
//! - **One trace per row**: a row keeps the W3C trace context it was
//!   enqueued under (`trace_context`, or `SET LOCAL idemgate.traceparent`),
//!   and every attempt is sent as a new span of that trace
//!   ([`crate::http::trace_context`]); an invalid context is ignored.
//! - **Known cost**: rows waiting behind a failing head are skipped by every
//!   claim (its scan walks past them), so keep ordering keys fine-grained
//!   (per customer, per order) rather than one key for a whole stream.

pub mod census;
pub mod check;
pub mod claim;
pub mod dead;
pub mod enqueue;
pub mod enqueue_many;
pub mod listen;
pub mod publisher;
pub mod relay;
pub mod retry;
pub mod roles;

use crate::postgres::{Database, Endpoint, PostgresError, Schema};

/// The channel `enqueue` and `redrive` notify.
pub const CHANNEL: &str = "idemgate_outbox";

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// Reaching the database failed: its URL, TLS, pool, a statement, or
    /// the schema ([`PostgresError`] says which).
    #[error(transparent)]
    Postgres(#[from] PostgresError),
    /// `enqueue` refused the message (it says which argument and why);
    /// sending it again cannot succeed.
    #[error(transparent)]
    Refused(#[from] enqueue::Refusal),
    /// The database computed another derived key than this binary did.
    #[error("derived key mismatch: the database computed {database}, this binary {rust}")]
    KeyMismatch {
        /// What `idemgate.enqueue` returned.
        database: String,
        /// What [`enqueue::derived_key`] computed.
        rust: String,
    },
}

impl From<tokio_postgres::Error> for OutboxError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Postgres(PostgresError::Database(e))
    }
}

impl From<deadpool_postgres::PoolError> for OutboxError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Postgres(PostgresError::Pool(e))
    }
}

/// [`Database::connect`] for a relay: see [`relay_sessions`].
pub fn connect_relay(url: &str, size: usize, schema: Schema) -> Result<Database, OutboxError> {
    Ok(Database::open(relay_sessions(Endpoint::parse(url)?), size, schema)?)
}

/// `endpoint` for a relay's pool: its sessions run with `enable_sort = off`
/// and `jit = off`.
///
/// Why no sorts: the claim wants the first `batch_size` due rows, which the
/// `outbox_ready` index yields in order, so it reads only those. But
/// right after a burst of enqueues, before autovacuum has analyzed the
/// table, the planner still believes only a handful of rows are ready,
/// and picks a bitmap scan of *every* ready row plus a sort: measured
/// 37 ms per claim with 100k rows, ~300 ms with 1M, on every claim
/// until the next ANALYZE. Without sorts it always walks the index
/// (0.9 ms either way). The sorts that remain cannot be avoided and are
/// small (the claim's running byte total over its own candidates, the
/// census's few rows per destination).
///
/// Why no JIT: `enable_sort = off` does not forbid a sort, it adds a huge
/// constant to the cost of any plan with one, and a plan that costly is
/// JIT-compiled (`jit_above_cost`): measured 300–400 ms of compilation on
/// every claim. The relay runs only short statements; JIT never pays.
pub fn relay_sessions(mut endpoint: Endpoint) -> Endpoint {
    const RELAY_OPTIONS: &str = "-c enable_sort=off -c jit=off";
    let options = match endpoint.config.get_options() {
        Some(given) => format!("{given} {RELAY_OPTIONS}"),
        None => RELAY_OPTIONS.to_string(),
    };
    endpoint.config.options(&options);
    endpoint
}

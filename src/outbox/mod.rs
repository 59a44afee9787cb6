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
//! - [`migrate`] — versioned, idempotent schema migrations (SQL files under
//!   `migrations/`), run under an advisory lock, and the settings row
//!   (`max_payload`) the database enforces.
//! - [`roles`] — what a service role (enqueue, nothing more) and a relay
//!   role (not the owner, not a superuser) are granted.
//! - [`enqueue`] — [`enqueue::derived_key`] (pure) and the Rust helper that
//!   enqueues inside a caller's `tokio_postgres::Transaction`.
//! - [`claim`] — every statement the relay runs: claim, renew, complete,
//!   retry, bury, reap, redrive. Each is one short autocommit statement;
//!   completion and failure are fenced on `attempts`.
//! - [`retry`] — pure: outcome classes, backoff with full jitter, `Retry-After`.
//! - [`publisher`] — the [`publisher::Publisher`] trait and the HTTP one.
//! - [`census`] — the backlog per destination, and rows of destinations the
//!   relay does not have (*unroutable*): for gauges, logs and the admin API.
//! - [`relay`] — the worker: one step ([`relay::Relay::try_execute_batch`])
//!   for tests, and the service ([`relay::Relay::run`]): a lane per
//!   destination, each with its own bounded concurrency and byte budget, and
//!   housekeeping (reaper, census, retention) in a task of its own.
//! - [`listen`] — `LISTEN/NOTIFY` wake-ups on a connection outside the pool.
//! - [`endpoint`] — a database URL parsed once into the driver's config and
//!   the TLS connector; every connection to Postgres is made through one.
//! - [`tls`] — `sslmode` (disable, prefer, require, verify-ca, verify-full,
//!   with libpq's meanings) and `sslrootcert` as a rustls connector.
//!
//! The admin listener's outbox routes (dead rows, redrive) live in
//! `crate::admin`. [`Schema`] lets the whole outbox live in a schema other
//! than `idemgate` (tests use one per test).
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
//! - **Time** is only ever the database's `now()`: leases, backoffs and
//!   retention are computed in SQL; the relay passes durations, never
//!   instants (its own poll and renewal cadence uses local monotonic timers).
//! - **Known cost**: rows waiting behind a failing head are skipped by every
//!   claim (its scan walks past them), so keep ordering keys fine-grained
//!   (per customer, per order) rather than one key for a whole stream.

pub mod census;
pub mod claim;
pub mod endpoint;
pub mod enqueue;
pub mod listen;
pub mod migrate;
pub mod publisher;
pub mod relay;
pub mod retry;
pub mod roles;
pub mod tls;

use std::borrow::Cow;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

pub use endpoint::Endpoint;

/// The channel `enqueue` and `redrive` notify.
pub const CHANNEL: &str = "idemgate_outbox";

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The database URL does not parse.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// The database URL's TLS settings are unusable (an unknown `sslmode`,
    /// an unreadable `sslrootcert`); `url` is redacted.
    #[error("invalid database URL {url}: {source}")]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// What is wrong, naming the parameter.
        #[source]
        source: tls::TlsError,
    },
    /// No connection could be had from the pool.
    #[error("database unavailable: {}", ErrorChain(.0))]
    Pool(#[source] deadpool_postgres::PoolError),
    /// A statement (or a connection attempt) failed.
    #[error("database error: {}", ErrorChain(.0))]
    Database(#[source] tokio_postgres::Error),
    /// The schema is missing, newer than this binary, or was altered.
    #[error("schema: {0}")]
    Schema(String),
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

/// An error followed by its sources, `: `-joined, on one line.
///
/// tokio-postgres and deadpool print only their outermost layer ("db
/// error", "error performing TLS handshake"), and the cause ("invalid peer
/// certificate: UnknownIssuer", the server's `FATAL` message) is what an
/// operator needs. A source whose text an outer layer already printed is
/// not repeated. An error the server sent is printed as its severity,
/// message and SQLSTATE (with its detail and hint), in place of the
/// driver's bare "db error". The whole is [`printable`]: a server message
/// may hold a newline, and a log line must not.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut printed = String::new();
        let mut next = Some(self.0);
        while let Some(error) = next {
            next = error.source();
            let text = match error.downcast_ref::<tokio_postgres::error::DbError>() {
                Some(db) => server_error(db),
                // Its source, the server's error, says all it would.
                None if error.downcast_ref::<tokio_postgres::Error>().is_some_and(|e| e.as_db_error().is_some()) => {
                    continue;
                }
                None => error.to_string(),
            };
            if !printed.contains(&text) {
                if !printed.is_empty() {
                    printed.push_str(": ");
                }
                printed.push_str(&text);
            }
        }
        f.write_str(&printable(&printed, usize::MAX))
    }
}

/// `ERROR: permission denied for table outbox (SQLSTATE 42501)`, then the
/// detail and the hint if the server sent them.
fn server_error(db: &tokio_postgres::error::DbError) -> String {
    let mut text = format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        text.push_str("; DETAIL: ");
        text.push_str(detail);
    }
    if let Some(hint) = db.hint() {
        text.push_str("; HINT: ");
        text.push_str(hint);
    }
    text
}

/// `text` made safe for one log line or a stored `last_error`, whoever
/// wrote it (a destination's response body, a server's message): control
/// characters (a newline would forge a log line, an escape sequence would
/// drive the operator's terminal), Unicode line and paragraph separators,
/// bidirectional overrides and the backslash itself are escaped as Rust
/// escapes them (`\n`, `\u{1b}`, `\\`), so the escaped text reads back
/// unambiguously. At most `max_chars` characters are kept; `…` marks a cut.
pub fn printable(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars));
    let mut kept = 0usize;
    for c in text.chars() {
        let escaped = c == '\\'
            || c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        let width = if escaped { c.escape_default().count() } else { 1 };
        if kept.saturating_add(width) > max_chars {
            out.push('…');
            break;
        }
        kept += width;
        if escaped {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl From<tokio_postgres::Error> for OutboxError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Database(e)
    }
}

impl From<deadpool_postgres::PoolError> for OutboxError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Pool(e)
    }
}

/// The schema holding the outbox (and the gateway's keys): `idemgate`
/// unless configured otherwise. Another name serves tests (a schema per
/// test) and several independent outboxes in one database. The SQL in this
/// crate is written against `idemgate.`; [`Schema::sql`] rewrites it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema(String);

impl Default for Schema {
    fn default() -> Self {
        Self("idemgate".into())
    }
}

impl Schema {
    /// A schema name: lower-case letters, digits and `_`, not starting with a digit, at most 63.
    pub fn new(name: &str) -> Result<Self, OutboxError> {
        let valid = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if valid {
            Ok(Self(name.into()))
        } else {
            Err(OutboxError::InvalidUrl(format!("invalid schema name {name:?}")))
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// `sql` with every `idemgate.` qualifier pointing at this schema.
    pub fn sql<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        if self.0 == "idemgate" {
            Cow::Borrowed(sql)
        } else {
            Cow::Owned(sql.replace("idemgate.", &format!("{}.", self.0)))
        }
    }
}

/// A pool and the schema its statements address.
#[derive(Clone)]
pub struct Database {
    /// The connections.
    pub pool: Pool,
    /// Where the tables are.
    pub schema: Schema,
}

impl Database {
    /// A pool of `size` connections to `url`, addressing `schema`.
    pub fn connect(url: &str, size: usize, schema: Schema) -> Result<Self, OutboxError> {
        Self::open(Endpoint::parse(url)?, size, schema)
    }

    /// A pool of `size` connections to a parsed endpoint. Connections open
    /// lazily, each bounded by the pool's create timeout.
    pub fn open(endpoint: Endpoint, size: usize, schema: Schema) -> Result<Self, OutboxError> {
        Ok(Self { pool: pool(endpoint, size)?, schema })
    }

    /// [`Database::connect`] for a relay: see [`relay_sessions`].
    pub fn connect_relay(url: &str, size: usize, schema: Schema) -> Result<Self, OutboxError> {
        Self::open(relay_sessions(Endpoint::parse(url)?), size, schema)
    }

    /// A pooled connection and `sql` prepared (and cached) on it.
    pub(crate) async fn prepare(
        &self,
        sql: &str,
    ) -> Result<(deadpool_postgres::Object, tokio_postgres::Statement), OutboxError> {
        let client = self.pool.get().await?;
        let statement = client.prepare_cached(&self.schema.sql(sql)).await?;
        Ok((client, statement))
    }
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

/// A connection pool of `size` connections, with bounded waits.
pub fn pool(endpoint: Endpoint, size: usize) -> Result<Pool, OutboxError> {
    let tls = endpoint.connector();
    let mut config = endpoint.config;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    config.application_name("idemgate");
    let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()
        .map_err(|e| OutboxError::InvalidUrl(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_schema_rewrites_every_qualifier_and_nothing_else() {
        let schema = Schema::new("t_1_ab").unwrap();
        assert_eq!(
            schema.sql("SELECT idemgate.enqueue() FROM idemgate.outbox -- idemgate_outbox"),
            "SELECT t_1_ab.enqueue() FROM t_1_ab.outbox -- idemgate_outbox"
        );
        assert_eq!(Schema::default().sql("idemgate.outbox"), "idemgate.outbox");
    }

    #[test]
    fn printable_text_has_no_line_breaks_or_escape_sequences_and_reads_back() {
        let forged = "bad\n2026-01-01T00:00:00Z  INFO outbox row delivered\r\u{1b}[2J \u{2028}\\n";
        let shown = printable(forged, usize::MAX);
        assert_eq!(shown, "bad\\n2026-01-01T00:00:00Z  INFO outbox row delivered\\r\\u{1b}[2J \\u{2028}\\\\n");
        assert!(!shown.chars().any(char::is_control));
        assert_eq!(printable("naïve \"quotes\" stay", 100), "naïve \"quotes\" stay");
    }

    #[test]
    fn printable_text_is_bounded_and_marks_the_cut() {
        assert_eq!(printable("abcdef", 4), "abcd…");
        assert_eq!(printable("ab\ncd", 3), "ab…", "an escape is never cut in half");
        assert_eq!(printable("abc", 3), "abc");
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for bad in ["", "Idemgate", "1x", "a-b", "a.b", "a;drop", &"x".repeat(64)] {
            assert!(Schema::new(bad).is_err(), "{bad:?}");
        }
        assert!(Schema::new("idemgate_2").is_ok());
    }
}

//! The Postgres floor: the one way to reach Postgres, shared by the
//! Postgres store and the outbox relay.
//!
//! - [`endpoint`] — a database URL parsed once into the driver's config and
//!   the TLS connector; every connection to Postgres is made through one.
//! - [`tls`] — `sslmode` (disable, prefer, require, verify-ca, verify-full,
//!   with libpq's meanings) and `sslrootcert` as a rustls connector.
//! - [`migrate`] — versioned, idempotent schema migrations (SQL files under
//!   `migrations/`, for the outbox and the gateway's keys alike), run under
//!   an advisory lock, and the settings row (`max_payload`) the database
//!   enforces.
//! - [`Database`] — a bounded pool and the [`Schema`] its statements address;
//!   [`PostgresError`] — why reaching it failed, with the server's message
//!   and SQLSTATE ([`ErrorChain`], from [`crate::escape`]).

pub mod endpoint;
pub mod migrate;
pub mod tls;

use std::borrow::Cow;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

pub use endpoint::Endpoint;

pub use crate::escape::ErrorChain;

/// Why reaching Postgres failed.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
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
}

impl From<tokio_postgres::Error> for PostgresError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Database(e)
    }
}

impl From<deadpool_postgres::PoolError> for PostgresError {
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
    /// A schema name: lower-case letters, digits and `_`, not starting
    /// with a digit, at most 63 ([`crate::config::is_schema_name`]).
    pub fn new(name: &str) -> Result<Self, PostgresError> {
        if crate::config::is_schema_name(name) {
            Ok(Self(name.into()))
        } else {
            Err(PostgresError::InvalidUrl(format!("invalid schema name {name:?}")))
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
    pub fn connect(url: &str, size: usize, schema: Schema) -> Result<Self, PostgresError> {
        Self::open(Endpoint::parse(url)?, size, schema)
    }

    /// A pool of `size` connections to a parsed endpoint. Connections open
    /// lazily, each bounded by the pool's create timeout.
    pub fn open(endpoint: Endpoint, size: usize, schema: Schema) -> Result<Self, PostgresError> {
        Ok(Self { pool: pool(endpoint, size)?, schema })
    }

    /// A pooled connection and `sql` prepared (and cached) on it.
    pub async fn prepare(
        &self,
        sql: &str,
    ) -> Result<(deadpool_postgres::Object, tokio_postgres::Statement), PostgresError> {
        let client = self.pool.get().await?;
        let statement = client.prepare_cached(&self.schema.sql(sql)).await?;
        Ok((client, statement))
    }
}

/// A connection pool of `size` connections, with bounded waits.
pub fn pool(endpoint: Endpoint, size: usize) -> Result<Pool, PostgresError> {
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
        .map_err(|e| PostgresError::InvalidUrl(e.to_string()))
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
    fn schema_names_are_plain_identifiers() {
        for bad in ["", "Idemgate", "1x", "a-b", "a.b", "a;drop", &"x".repeat(64)] {
            assert!(Schema::new(bad).is_err(), "{bad:?}");
        }
        assert!(Schema::new("idemgate_2").is_ok());
    }
}

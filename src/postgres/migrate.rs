//! Versioned, idempotent schema migrations for schema `idemgate`.
//!
//! The migrations are SQL files embedded in the binary, numbered
//! `NNNN_name.sql`. [`run`] applies the missing ones in order, all in one
//! transaction that first takes a transaction-level advisory lock
//! ([`lock`]), so two migrators started together do not race: the second
//! waits, then finds nothing to do. `migrate --grant-…` grants under the
//! same lock, so parallel deploys that grant do not race either. `idemgate.schema_migrations` records each applied
//! version with a checksum of its SQL; a recorded migration whose SQL has
//! changed since is an error, never silently re-run. Running [`run`] twice
//! changes nothing the second time.
//!
//! [`configure`] then writes what the config decides into the one row of
//! `idemgate.settings` (the payload cap `enqueue` enforces): a SQL function
//! cannot read the relay's config file, so the database keeps its own copy,
//! refreshed by every `idemgate migrate`. [`run`] alone (the Postgres key
//! store runs it at start) leaves the row as it is.

use tokio_postgres::{Client, Transaction};

use super::{Endpoint, ErrorChain, PostgresError, Schema};
use crate::idempotency::hash::{hash_fields, to_hex};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its number; applied in increasing order.
    pub version: i32,
    /// A short name.
    pub name: &'static str,
    /// The SQL, run as one batch.
    pub sql: &'static str,
}

/// Every migration this binary knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "outbox", sql: include_str!("migrations/0001_outbox.sql") },
    Migration { version: 2, name: "gateway_keys", sql: include_str!("migrations/0002_gateway_keys.sql") },
    Migration { version: 3, name: "gateway_unknown", sql: include_str!("migrations/0003_gateway_unknown.sql") },
    Migration { version: 4, name: "enqueue", sql: include_str!("migrations/0004_enqueue.sql") },
    Migration { version: 5, name: "roles", sql: include_str!("migrations/0005_roles.sql") },
    Migration { version: 6, name: "enqueue_many", sql: include_str!("migrations/0006_enqueue_many.sql") },
    Migration { version: 7, name: "trace_context", sql: include_str!("migrations/0007_trace_context.sql") },
    Migration { version: 8, name: "enqueue_many_insert", sql: include_str!("migrations/0008_enqueue_many_insert.sql") },
    Migration { version: 9, name: "gateway_tenant", sql: include_str!("migrations/0009_gateway_tenant.sql") },
];

/// The schema version this binary needs.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

const BOOKKEEPING: &str = "
    CREATE TABLE IF NOT EXISTS idemgate.schema_migrations (
        version    integer     PRIMARY KEY,
        name       text        NOT NULL,
        checksum   text        NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    );";

fn checksum(migration: &Migration) -> String {
    to_hex(&hash_fields(&[migration.sql.as_bytes()]))
}

/// Waits for, then holds until `transaction` ends, the lock every change
/// to `schema`'s objects is made under: the migrations and the grants of
/// `outbox::roles`. One lock per schema: migrators of one schema queue,
/// others do not wait. (Two `GRANT`s on one object at once fail with
/// `tuple concurrently updated`: catalog rows are updated in place, not
/// under a row lock that would make the second wait.)
pub async fn lock(transaction: &Transaction<'_>, schema: &Schema) -> Result<(), tokio_postgres::Error> {
    let lock = format!("idemgate.migrate:{}", schema.name());
    transaction.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", &[&lock]).await.map(drop)
}

/// Applies the missing migrations to `schema`; returns the versions it applied.
pub async fn run(client: &mut Client, schema: &Schema) -> Result<Vec<i32>, PostgresError> {
    run_up_to(client, schema, latest_version()).await
}

/// [`run`], stopping after migration `last`: what an older binary would
/// have left behind (upgrade tests start from there).
pub async fn run_up_to(client: &mut Client, schema: &Schema, last: i32) -> Result<Vec<i32>, PostgresError> {
    let transaction = client.transaction().await?;
    lock(&transaction, schema).await?;
    transaction.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", schema.name())).await?;
    transaction.batch_execute(&schema.sql(BOOKKEEPING)).await?;
    let rows = transaction.query(&*schema.sql("SELECT version, checksum FROM idemgate.schema_migrations"), &[]).await?;
    let applied: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    if let Some((version, _)) = applied.iter().find(|(v, _)| *v > latest_version()) {
        return Err(PostgresError::Schema(format!(
            "the database is at migration {version}, newer than this binary ({}): upgrade idemgate",
            latest_version()
        )));
    }
    let mut done = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| m.version <= last) {
        match applied.iter().find(|(v, _)| *v == migration.version) {
            Some((_, recorded)) if *recorded == checksum(migration) => {}
            Some(_) => {
                return Err(PostgresError::Schema(format!(
                    "migration {} ({}) was changed after it was applied",
                    migration.version, migration.name
                )));
            }
            None => {
                transaction.batch_execute(&schema.sql(migration.sql)).await.map_err(|e| {
                    PostgresError::Schema(format!("migration {} ({}) failed: {e}", migration.version, migration.name))
                })?;
                transaction
                    .execute(
                        &*schema.sql(
                            "INSERT INTO idemgate.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                        ),
                        &[&migration.version, &migration.name, &checksum(migration)],
                    )
                    .await?;
                done.push(migration.version);
            }
        }
    }
    transaction.commit().await?;
    Ok(done)
}

/// What `idemgate.settings` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The name every derived key starts with (the schema's, when migrated).
    pub outbox: String,
    /// The largest payload `enqueue` accepts, in bytes of its JSON text.
    pub max_payload: u64,
}

/// Reads `idemgate.settings`.
pub async fn settings(client: &Client, schema: &Schema) -> Result<Settings, PostgresError> {
    let row = client.query_one(&*schema.sql("SELECT outbox, max_payload FROM idemgate.settings"), &[]).await?;
    let max_payload: i64 = row.try_get(1)?;
    Ok(Settings { outbox: row.try_get(0)?, max_payload: u64::try_from(max_payload).unwrap_or(0) })
}

/// Sets the payload cap `enqueue` enforces (`relay.max_payload`); returns
/// the settings as they now are.
pub async fn configure(client: &Client, schema: &Schema, max_payload: u64) -> Result<Settings, PostgresError> {
    let cap = i64::try_from(max_payload)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| PostgresError::Schema(format!("relay.max_payload = {max_payload} bytes: must be positive")))?;
    client.execute(&*schema.sql("UPDATE idemgate.settings SET max_payload = $1"), &[&cap]).await?;
    settings(client, schema).await
}

/// One plain connection (outside any pool) for running migrations.
pub async fn connect(url: &str) -> Result<Client, PostgresError> {
    connect_to(&Endpoint::parse(url)?).await
}

/// [`connect`] to an endpoint parsed already.
pub async fn connect_to(endpoint: &Endpoint) -> Result<Client, PostgresError> {
    let (client, connection) = endpoint.connect().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %ErrorChain(&e), "migration connection closed");
        }
    });
    Ok(client)
}

/// The highest applied version, or 0 when the schema was never migrated.
pub async fn current_version(client: &Client, schema: &Schema) -> Result<i32, PostgresError> {
    let exists: bool = client
        .query_one(&*schema.sql("SELECT to_regclass('idemgate.schema_migrations') IS NOT NULL"), &[])
        .await?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let max = schema.sql("SELECT coalesce(max(version), 0) FROM idemgate.schema_migrations");
    Ok(client.query_one(&*max, &[]).await?.get(0))
}

/// Fails unless the schema is exactly at [`latest_version`].
pub async fn require_current(client: &Client, schema: &Schema) -> Result<(), PostgresError> {
    let name = schema.name();
    // `migrate` takes the same schema from the same config (relay.schema).
    let migrate = if name == "idemgate" { String::new() } else { " with the same relay.schema".to_string() };
    match current_version(client, schema).await? {
        v if v == latest_version() => Ok(()),
        0 => Err(PostgresError::Schema(format!(
            "schema {name} is missing: run `idemgate migrate --database-url …`{migrate}"
        ))),
        v if v < latest_version() => Err(PostgresError::Schema(format!(
            "schema {name} is at migration {v}, this binary needs {}: run `idemgate migrate`{migrate}",
            latest_version()
        ))),
        v => Err(PostgresError::Schema(format!(
            "schema {name} is at migration {v}, newer than this binary ({})",
            latest_version()
        ))),
    }
}

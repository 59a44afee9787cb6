//! Postgres for tests: a fresh schema per test on the shared server.
//!
//! The server is `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). [`TestSchema::create`] makes
//! a schema of the test's own (`t_<pid>_<random>`) and the migrations put
//! the outbox there instead of in `idemgate` (see `outbox::Schema`), so
//! every test sees an empty outbox whatever else runs beside it. The guard
//! drops the schema when dropped. A schema left behind by a test process
//! that died is dropped by the next test process: its name carries the
//! pid, and that pid is gone. (A database per test would isolate as well,
//! but `CREATE DATABASE` plus `DROP DATABASE` costs 1–2 s here.)

use std::time::Duration;

use idemgate::postgres::{Database, Schema};
use tokio_postgres::NoTls;

/// The shared server's URL.
pub fn shared_database_url() -> String {
    super::services::postgres_url()
}

async fn admin(sql: String) {
    let (client, connection) = tokio_postgres::connect(&shared_database_url(), NoTls)
        .await
        .unwrap_or_else(|e| panic!("Postgres at {} (set DATABASE_URL): {e}", shared_database_url()));
    let driver = tokio::spawn(connection);
    client.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    drop(client);
    let _ = driver.await;
}

/// Drops the schemas of test processes that no longer exist (once per process).
async fn drop_orphans() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !DONE.swap(true, std::sync::atomic::Ordering::SeqCst) {
        drop_orphaned(r"SELECT nspname::text FROM pg_namespace WHERE nspname ~ '^t_[0-9]+_[0-9a-f]+$'", |name| {
            format!("DROP SCHEMA IF EXISTS {name} CASCADE")
        })
        .await;
    }
}

/// Runs `drop(name)` for every name `query` lists (`t_<pid>_…`) whose test
/// process no longer exists: what a test that died left on the shared
/// server. Best effort: a server that does not answer is left alone.
pub async fn drop_orphaned(query: &str, drop: impl Fn(&str) -> String) {
    let Ok((client, connection)) = tokio_postgres::connect(&shared_database_url(), NoTls).await else { return };
    tokio::spawn(connection);
    let Ok(rows) = client.query(query, &[]).await else { return };
    for row in rows {
        let name: String = row.get(0);
        let pid = name.split('_').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = client.batch_execute(&drop(&name)).await;
        }
    }
}

/// A migrated outbox schema of the test's own; dropped with the guard.
pub struct TestSchema {
    pub schema: Schema,
    /// The shared database's URL.
    pub url: String,
}

impl TestSchema {
    /// Names a schema (dropped with the guard) without creating it.
    pub async fn unmigrated() -> Self {
        drop_orphans().await;
        let name = format!("t_{}_{:016x}", std::process::id(), rand::random::<u64>());
        Self { schema: Schema::new(&name).expect("schema name"), url: shared_database_url() }
    }

    /// Creates the schema and applies the migrations to it.
    pub async fn create() -> Self {
        let guard = Self::unmigrated().await;
        let mut client = idemgate::postgres::migrate::connect(&guard.url)
            .await
            .unwrap_or_else(|e| panic!("Postgres at {} (set DATABASE_URL): {e}", guard.url));
        idemgate::postgres::migrate::run(&mut client, &guard.schema).await.expect("migrate");
        guard
    }

    pub fn name(&self) -> &str {
        self.schema.name()
    }

    /// A store URL for this schema.
    pub fn store_url(&self) -> String {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{separator}schema={}", self.url, self.name())
    }

    /// A pool addressing this schema.
    pub fn database(&self, size: usize) -> Database {
        Database::connect(&self.url, size, self.schema.clone()).expect("pool")
    }

    /// A plain connection, driven in the background.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.expect("connect");
        tokio::spawn(connection);
        client
    }

    /// `sql` against this schema (`idemgate.` rewritten).
    pub fn sql(&self, sql: &str) -> String {
        self.schema.sql(sql).into_owned()
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name());
        // Drop runs inside a test's runtime; a thread with its own runtime may block.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), admin(sql)).await })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: test schema {} was not dropped", self.name());
        }
    }
}

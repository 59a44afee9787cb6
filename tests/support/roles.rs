//! Throwaway login roles on the shared server, for tests of grants.
//!
//! Roles are cluster-wide, unlike the schemas tests isolate themselves in,
//! so each is named after the test's schema (`t_<pid>_<random>_<duty>`)
//! and dropped with its guard, also when the test fails; roles left behind
//! by a test process that died are dropped by the next one, as its
//! schemas are (see `postgres.rs`).

use std::time::Duration;

use tokio_postgres::NoTls;

use super::postgres::{TestSchema, drop_orphaned, shared_database_url};

async fn admin(sql: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(&shared_database_url(), NoTls).await?;
    let driver = tokio::spawn(connection);
    let done = client.batch_execute(sql).await;
    drop(client);
    let _ = driver.await;
    done
}

fn drop_sql(name: &str) -> String {
    format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}';
         DROP OWNED BY {name}; DROP ROLE {name};"
    )
}

/// Drops the roles of test processes that no longer exist (once per process).
async fn drop_orphans() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !DONE.swap(true, std::sync::atomic::Ordering::SeqCst) {
        drop_orphaned(r"SELECT rolname::text FROM pg_roles WHERE rolname ~ '^t_[0-9]+_[0-9a-f]+_[a-z]+$'", drop_sql)
            .await;
    }
}

/// A login role (not a superuser, owning nothing); dropped with the guard.
pub struct TestRole {
    pub name: String,
}

impl TestRole {
    /// `<schema>_<duty>`, created with LOGIN.
    pub async fn create(schema: &TestSchema, duty: &str) -> Self {
        drop_orphans().await;
        let name = format!("{}_{duty}", schema.name());
        admin(&format!("CREATE ROLE {name} LOGIN")).await.unwrap_or_else(|e| panic!("CREATE ROLE {name}: {e}"));
        Self { name }
    }

    /// The shared database's URL, logging in as this role (trust auth), plaintext.
    pub fn url(&self) -> String {
        let config: tokio_postgres::Config = shared_database_url().parse().expect("DATABASE_URL");
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_string(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let database = config.get_dbname().unwrap_or("postgres");
        format!("postgres://{}@{host}:{port}/{database}?sslmode=disable", self.name)
    }

    /// A plain connection as this role, driven in the background.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), NoTls).await.expect("connect as the role");
        tokio::spawn(connection);
        client
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let sql = drop_sql(&self.name);
        // Drop runs inside a test's runtime; a thread with its own runtime may block.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), admin(&sql)).await })
        })
        .join();
        if !matches!(dropped, Ok(Ok(Ok(())))) {
            eprintln!("warning: test role {} was not dropped: {dropped:?}", self.name);
        }
    }
}

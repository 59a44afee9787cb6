//! TLS to PostgreSQL, against private servers that speak it: each test
//! starts its own (`support::postgres_tls`: a CA made at test time, a
//! certificate for `localhost` and `127.0.0.1`) and stops it by PID when
//! its guard drops. Every connection goes through the library's own
//! entry points — `migrate::connect`, `Database::connect`, `listen` — the
//! ones the relay, `idemgate migrate` and the `postgres://` store use.
//! Whether a session is encrypted is asked of the server (`pg_stat_ssl`).

use crate::support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idemgate::outbox::CHANNEL;
use idemgate::outbox::enqueue::{Message, derived_key, enqueue};
use idemgate::postgres::{Database, Endpoint, PostgresError, Schema, migrate};
use serde_json::json;
use support::postgres_tls::{Hba, TestCa, TlsPostgres};
use tokio::sync::Notify;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

/// The bound on every wait below: a connection, a statement, a wake-up.
const TIMEOUT: Duration = Duration::from_secs(20);

async fn bounded<T>(what: &str, work: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, work).await.unwrap_or_else(|_| panic!("{what}: no answer within {TIMEOUT:?}"))
}

async fn connect(url: &str) -> Result<Client, PostgresError> {
    bounded(url, migrate::connect(url)).await
}

/// The error of a connection that must fail.
async fn refused(url: &str) -> String {
    match connect(url).await {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e.to_string(),
    }
}

async fn session_is_encrypted(client: &Client) -> bool {
    let sql = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
    bounded("pg_stat_ssl", client.query_one(sql, &[])).await.expect("pg_stat_ssl").get(0)
}

fn rootcert(path: &std::path::Path) -> String {
    format!("sslrootcert={}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_the_migration_the_pool_and_the_listen_session() {
    // hostssl only: nothing below can have fallen back to plaintext.
    let pg = TlsPostgres::start(Hba::TlsOnly);
    let url = pg.url("sslmode=require");
    let mut client = connect(&url).await.expect("require connects to a TLS-only server");
    assert!(session_is_encrypted(&client).await);
    bounded("migrate", migrate::run(&mut client, &Schema::default())).await.expect("migrate over TLS");

    let db = Database::connect(&url, 2, Schema::default()).expect("pool");
    let mut pooled = bounded("pool", db.pool.get()).await.expect("a pooled connection over TLS");
    assert!(session_is_encrypted(&pooled).await);
    let payload = json!({"to": "a@b.c"});
    let tx = pooled.transaction().await.unwrap();
    let key = bounded("enqueue", enqueue(&tx, &Message::new("email", "order-shipped", "order:1", &payload)))
        .await
        .expect("enqueue over TLS");
    tx.commit().await.unwrap();
    assert_eq!(key, derived_key(&Schema::default(), "email", "order-shipped", "order:1"));
    let stored: String =
        client.query_one("SELECT derived_key FROM idemgate.outbox", &[]).await.expect("the enqueued row").get(0);
    assert_eq!(stored, key);

    // The relay's LISTEN session: it wakes once on connecting, then on a NOTIFY.
    let wake = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let listener =
        tokio::spawn(idemgate::outbox::listen::listen(Endpoint::parse(&url).unwrap(), wake.clone(), stop.clone()));
    bounded("the LISTEN session to connect", wake.notified()).await;
    let listening = "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                      WHERE a.application_name = 'idemgate-listen'";
    let encrypted: bool = client.query_one(listening, &[]).await.expect("the LISTEN session").get(0);
    assert!(encrypted, "the LISTEN session is not encrypted");
    client.batch_execute(&format!("NOTIFY {CHANNEL}")).await.unwrap();
    bounded("a NOTIFY to wake the relay", wake.notified()).await;
    stop.cancel();
    bounded("the listener to stop", listener).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_servers_ca_connects_by_address_and_by_name() {
    let pg = TlsPostgres::start(Hba::Any);
    let root = rootcert(&pg.ca_file());
    let by_address = pg.url(&format!("sslmode=verify-full&{root}"));
    // `localhost` is what TLS checks; the connection goes to hostaddr.
    let by_name = pg.url_for("localhost", &format!("hostaddr=127.0.0.1&sslmode=verify-full&{root}"));
    for url in [by_address, by_name] {
        let client = connect(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(session_is_encrypted(&client).await, "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_another_ca_fails_and_says_the_issuer_is_unknown() {
    let pg = TlsPostgres::start(Hba::Any);
    let stranger = pg.pem_file("stranger.pem", &TestCa::new("another CA").pem);
    let url = pg.url(&format!("sslmode=verify-full&{}", rootcert(&stranger)));
    let error = refused(&url).await;
    assert!(error.contains("TLS handshake") && error.contains("UnknownIssuer"), "{error}");
    // The pool (relay, admin API, postgres:// store) reports the same cause.
    let db = Database::connect(&url, 1, Schema::default()).expect("the pool opens lazily");
    let Err(error) = bounded("pool", db.pool.get()).await else { panic!("the pool connected") };
    let error = PostgresError::from(error).to_string();
    assert!(error.contains("UnknownIssuer"), "{error}");
    // Without sslrootcert the bundled roots are trusted, and they know no test CA.
    let error = refused(&pg.url("sslmode=verify-full")).await;
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_the_certificate_lacks_fails_verify_full_but_passes_verify_ca() {
    let pg = TlsPostgres::start(Hba::Any);
    let root = rootcert(&pg.ca_file());
    let url = |mode: &str| pg.url_for("db.invalid", &format!("hostaddr=127.0.0.1&sslmode={mode}&{root}"));
    let error = refused(&url("verify-full")).await;
    assert!(error.contains("not valid for name") && error.contains("db.invalid"), "{error}");
    let client = connect(&url("verify-ca")).await.expect("verify-ca checks the chain, not the name");
    assert!(session_is_encrypted(&client).await);
    // libpq: require with a root file behaves like verify-ca.
    let client = connect(&url("require")).await.expect("require with sslrootcert");
    assert!(session_is_encrypted(&client).await);
    // ... so it still checks the chain.
    let stranger = pg.pem_file("stranger.pem", &TestCa::new("another CA").pem);
    let chained = pg.url_for("db.invalid", &format!("hostaddr=127.0.0.1&sslmode=require&{}", rootcert(&stranger)));
    let error = refused(&chained).await;
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_and_no_sslmode_at_all_use_tls_when_the_server_offers_it() {
    let pg = TlsPostgres::start(Hba::Any);
    let default = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.server.port());
    for url in [pg.url("sslmode=prefer"), default] {
        let client = connect(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(session_is_encrypted(&client).await, "{url} connected in plaintext");
        let db = Database::connect(&url, 1, Schema::default()).unwrap();
        let pooled = bounded("pool", db.pool.get()).await.expect("a pooled connection");
        assert!(session_is_encrypted(&pooled).await, "{url}: the pool connected in plaintext");
    }
    // Only disable stays in plaintext, where the server allows it.
    let client = connect(&pg.url("sslmode=disable")).await.expect("disable against a server allowing plaintext");
    assert!(!session_is_encrypted(&client).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_against_a_tls_only_server_is_refused_with_the_servers_reason() {
    let pg = TlsPostgres::start(Hba::TlsOnly);
    let error = refused(&pg.url("sslmode=disable")).await;
    assert!(error.contains("no pg_hba.conf entry") && error.contains("no encryption"), "{error}");
    // The same server takes the same client once it encrypts.
    assert!(connect(&pg.url("sslmode=require")).await.is_ok());
}

/// With a password, SCRAM binds itself to the server's certificate
/// (`tls-server-end-point`), so even `require`, which checks no
/// certificate, leaves a man in the middle nothing to relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_under_require_binds_the_channel_to_the_certificate() {
    let pg = TlsPostgres::start(Hba::TlsOnlyScram);
    let admin = connect(&pg.url("sslmode=require")).await.expect("postgres is trusted");
    admin.batch_execute("CREATE ROLE app LOGIN PASSWORD 'app-secret'").await.unwrap();
    // The driver fails unless the server accepted SCRAM-SHA-256-PLUS.
    let url = pg.url_as("app:app-secret", "127.0.0.1", "sslmode=require&channel_binding=require");
    let client = connect(&url).await.unwrap_or_else(|e| panic!("channel binding: {e}"));
    assert!(session_is_encrypted(&client).await);
    let wrong = pg.url_as("app:wrong", "127.0.0.1", "sslmode=require&channel_binding=require");
    let error = refused(&wrong).await;
    assert!(error.contains("password authentication failed"), "{error}");
}

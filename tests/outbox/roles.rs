//! The outbox under least privilege, on the real PostgreSQL: a service role
//! that can enqueue and nothing more, and a relay role that neither owns
//! the schema nor is a superuser, each logging in as itself. The roles are
//! throwaway (`support::roles`), granted exactly what `idemgate migrate
//! --grant-service/--grant-relay` grants.

use crate::support;

use std::process::Command;
use std::time::Duration;

use idemgate::outbox::enqueue::{Message, enqueue_in};
use idemgate::outbox::enqueue_many::enqueue_many_in;
use idemgate::outbox::relay::Relay;
use idemgate::outbox::roles::{Duty, Role, grant, statements};
use idemgate::outbox::{claim, dead};
use idemgate::postgres::{Endpoint, Schema, migrate};
use serde_json::json;
use support::outbox::{DESTINATION, Fixture, settings};
use support::postgres::TestSchema;
use support::roles::TestRole;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");
const LEASE: Duration = Duration::from_secs(30);

async fn grant_to(schema: &TestSchema, duty: Duty, role: &TestRole) {
    let mut owner = schema.connect().await;
    grant(&mut owner, &schema.schema, &[(duty, Role::new(&role.name).unwrap())]).await.expect("grant");
}

/// Runs `sql` as `client` and returns the SQLSTATE it failed with.
async fn refused(client: &tokio_postgres::Client, sql: &str) -> SqlState {
    let error = client.batch_execute(sql).await.expect_err(sql);
    error.code().cloned().unwrap_or_else(|| panic!("{sql}: {error}"))
}

/// Enqueues as `client`'s role in a transaction of its own that also does
/// business work, and commits it.
async fn enqueue_as(client: &mut tokio_postgres::Client, schema: &Schema, business_key: &str) -> String {
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("CREATE TEMP TABLE IF NOT EXISTS orders (id text); INSERT INTO orders VALUES ('x')")
        .await
        .unwrap();
    let payload = json!({"bk": business_key});
    let key = enqueue_in(schema, &tx, &Message::new(DESTINATION, "notify", business_key, &payload))
        .await
        .unwrap_or_else(|e| panic!("enqueue {business_key}: {e}"));
    tx.batch_execute("INSERT INTO orders VALUES ('after the enqueue')").await.expect("the transaction goes on");
    tx.commit().await.unwrap();
    key
}

/// [`enqueue_as`], set-based: one call for all `business_keys`.
async fn enqueue_many_as(client: &mut tokio_postgres::Client, schema: &Schema, business_keys: &[&str]) -> Vec<String> {
    let tx = client.transaction().await.unwrap();
    let payload = json!({"set": true});
    let messages: Vec<Message> =
        business_keys.iter().map(|bk| Message::new(DESTINATION, "notify", bk, &payload)).collect();
    let keys = enqueue_many_in(schema, &tx, &messages).await.unwrap_or_else(|e| panic!("enqueue_many: {e}"));
    tx.commit().await.unwrap();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_role_enqueues_new_duplicate_and_delivered_keys_and_can_touch_no_row() {
    let fx = Fixture::start().await;
    let service = TestRole::create(&fx.schema, "service").await;
    grant_to(&fx.schema, Duty::Service, &service).await;
    let schema = &fx.schema.schema;
    let mut client = service.connect().await;

    let key = enqueue_as(&mut client, schema, "order:1").await;
    assert_eq!(enqueue_as(&mut client, schema, "order:1").await, key, "a duplicate while it waits");
    assert_eq!(fx.count("true").await, 1);
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    // The failure: this aborted the business transaction with
    // "permission denied for table outbox".
    assert_eq!(enqueue_as(&mut client, schema, "order:1").await, key, "a duplicate once delivered");
    assert_eq!((fx.count("true").await, fx.sink.count_for(&key)), (0, 1));

    enqueue_as(&mut client, schema, "order:2").await; // a row to be tempted by
    assert_eq!(enqueue_many_as(&mut client, schema, &["order:1", "order:3"]).await[0], key, "set-based, too");
    assert_eq!(fx.count("true").await, 2, "order:2 and order:3 wait");
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 2);
    enqueue_as(&mut client, schema, "order:4").await; // the row to be tempted by
    let denied = SqlState::INSUFFICIENT_PRIVILEGE;
    for sql in [
        "SELECT count(*) FROM idemgate.outbox",
        "SELECT payload FROM idemgate.outbox",
        "UPDATE idemgate.outbox SET available_at = now()",
        "DELETE FROM idemgate.outbox",
        "INSERT INTO idemgate.outbox (derived_key, destination, operation, business_key, payload)
         VALUES ('k', 'sink', 'o', 'b', '{}')",
        "SELECT count(*) FROM idemgate.delivered",
        "DELETE FROM idemgate.delivered",
        "UPDATE idemgate.settings SET max_payload = 1",
        "UPDATE idemgate.ordering_keys SET last_seq = 0",
        "SELECT idemgate.redrive()",
        "SELECT idemgate.maintain_history(interval '1 hour')",
    ] {
        assert_eq!(refused(&client, &fx.schema.sql(sql)).await, denied, "{sql}");
    }
    assert_eq!(fx.count("true").await, 1, "order:4 still waits, untouched");
    let four = fx.schema.sql("SELECT idemgate.derived_key($1, 'sink', 'notify', 'order:1')");
    let computed: String = client.query_one(&four, &[&fx.schema.name()]).await.expect("derived_key(outbox, …)").get(0);
    assert_eq!(computed, key, "a service computes keys with the four-field form");

    // enqueue and enqueue_many run as their owner, with a search_path no caller can change.
    let owner = fx.schema.connect().await;
    for (function, settings) in [
        ("enqueue(text,text,text,jsonb,text,jsonb,jsonb)", &["search_path=pg_catalog, pg_temp"][..]),
        (
            "enqueue_many(text[],text[],text[],jsonb[],text[],jsonb[],jsonb[])",
            &["search_path=pg_catalog, pg_temp", "jit=off", "plan_cache_mode=force_generic_plan"],
        ),
    ] {
        let sql = fx
            .schema
            .sql(&format!("SELECT prosecdef, proconfig FROM pg_proc WHERE oid = 'idemgate.{function}'::regprocedure"));
        let row = owner.query_one(&sql, &[]).await.unwrap();
        let (definer, config): (bool, Vec<String>) = (row.get(0), row.get(1));
        assert!(definer, "{function}");
        assert_eq!(config, settings, "{function}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_role_that_owns_nothing_does_the_relays_whole_job() {
    let fx = Fixture::start().await;
    let role = TestRole::create(&fx.schema, "relay").await;
    grant_to(&fx.schema, Duty::Relay, &role).await;
    let as_relay = role.connect().await;
    let row = as_relay
        .query_one(
            "SELECT r.rolsuper, n.nspowner = r.oid FROM pg_roles r, pg_namespace n
              WHERE r.rolname = current_user AND n.nspname = $1",
            &[&fx.schema.name()],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, bool>(1)), (false, false), "neither superuser nor owner");
    migrate::require_current(&as_relay, &fx.schema.schema).await.expect("the start-up check");

    let db = idemgate::outbox::connect_relay(&role.url(), 4, fx.schema.schema.clone()).unwrap();
    let relay = Relay::new(db.clone(), fx.publisher(), fx.policies(), settings(LEASE));
    // Claim, publish, complete; retry and bury (503 × max_attempts); bury at once (422).
    let delivered = fx.enqueue("ok", json!({}), None).await;
    fx.enqueue("retried", json!({"status": 503}), None).await;
    fx.enqueue("rejected", json!({"status": 422}), Some("k")).await;
    let outcome = fx.drain(&relay).await;
    assert_eq!((outcome.delivered, outcome.retried, outcome.dead), (1, 2, 2), "{outcome:?}");
    assert_eq!(fx.sink.count_for(&delivered), 1);
    // The admin API's dead rows and redrive, then delivery after the fix.
    assert_eq!(
        dead::page(&db, &dead::DeadQuery { destination: None, offset: 0, limit: 10 }).await.unwrap().rows.len(),
        2
    );
    assert_eq!(claim::redrive(&db, None).await.unwrap(), 2);
    fx.sink.fail_with(Some(200));
    assert_eq!(fx.drain(&relay).await.delivered, 2);
    assert_eq!(relay.reap().await.unwrap(), 0);
    relay.refresh_gauges().await.expect("gauges");

    // Retention drops a whole old partition: only the owner may, so it runs as the owner.
    let owner = fx.schema.connect().await;
    owner
        .batch_execute(&fx.schema.sql(
            "CREATE TABLE idemgate.delivered_20000101 PARTITION OF idemgate.delivered
                 FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-02 00:00+00');
             INSERT INTO idemgate.delivered VALUES (1, 'k', 'd', 'o', 'b', NULL, NULL, 1, now(), '2000-01-01 12:00+00');",
        ))
        .await
        .unwrap();
    let old = fx.schema.sql("SELECT to_regclass('idemgate.delivered_20000101') IS NOT NULL");
    claim::maintain_history(&db, Duration::from_secs(7 * 86_400)).await.expect("retention as the relay role");
    assert!(!owner.query_one(&old, &[]).await.unwrap().get::<_, bool>(0), "the old partition is gone");
    assert_eq!(fx.delivered().await, 3, "only the old row went");
    let floor = claim::maintain_history(&db, Duration::from_secs(60)).await.expect_err("retention below 1 h");
    assert!(floor.to_string().contains("at least 1 hour"), "{floor}");

    // The run loop: LISTEN wake-ups, reaper, retention and gauges, all as the relay role.
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(Some(Endpoint::parse(&role.url()).unwrap()), stop.clone()));
    let woken = fx.enqueue("listened", json!({}), None).await;
    assert!(fx.sink.wait_for_effects(4, Duration::from_secs(30)).await, "the running relay delivered");
    stop.cancel();
    running.await.unwrap();
    assert_eq!(fx.sink.count_for(&woken), 1);

    // What the relay role cannot do.
    for sql in [
        "INSERT INTO idemgate.outbox (derived_key, destination, operation, business_key, payload)
         VALUES ('k', 'sink', 'o', 'b', '{}')",
        "SELECT idemgate.enqueue('sink', 'o', 'b', '{}')",
        "DROP TABLE idemgate.delivered_default",
        "UPDATE idemgate.settings SET max_payload = 1",
        "DELETE FROM idemgate.ordering_keys",
    ] {
        assert_eq!(refused(&as_relay, &fx.schema.sql(sql)).await, SqlState::INSUFFICIENT_PRIVILEGE, "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_grants_from_the_command_line_and_prints_every_statement() {
    let schema = TestSchema::unmigrated().await;
    let (service, relay) = (TestRole::create(&schema, "service").await, TestRole::create(&schema, "relay").await);
    let migrate = |args: &[&str]| {
        Command::new(BINARY)
            .args(["migrate", "--database-url", &schema.url])
            .args(args)
            .env("IDEMGATE__RELAY__SCHEMA", schema.name())
            .output()
            .unwrap()
    };
    let done = migrate(&["--grant-service", &service.name, "--grant-relay", &relay.name]);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let stdout = String::from_utf8_lossy(&done.stdout);
    for (duty, role) in [(Duty::Service, &service), (Duty::Relay, &relay)] {
        for statement in statements(&schema.schema, duty, &Role::new(&role.name).unwrap()) {
            assert!(stdout.contains(&format!("{statement};\n")), "{statement} not printed:\n{stdout}");
        }
    }
    let owner = schema.connect().await;
    let can = |role: &str, what: &str| {
        let sql = format!("SELECT {what}");
        let role = role.to_string();
        let owner = &owner;
        async move { owner.query_one(&sql, &[&role]).await.unwrap().get::<_, bool>(0) }
    };
    let enqueue = format!(
        "has_function_privilege($1, '{}.enqueue(text,text,text,jsonb,text,jsonb,jsonb)', 'EXECUTE')",
        schema.name()
    );
    let read = format!("has_table_privilege($1, '{}.outbox', 'SELECT')", schema.name());
    let many = format!(
        "has_function_privilege($1, '{}.enqueue_many(text[],text[],text[],jsonb[],text[],jsonb[],jsonb[])', 'EXECUTE')",
        schema.name()
    );
    assert!(can(&service.name, &enqueue).await && !can(&service.name, &read).await);
    assert!(can(&service.name, &many).await && !can(&relay.name, &many).await);
    assert!(can(&relay.name, &read).await && !can(&relay.name, &enqueue).await);

    let missing = format!("{}_nobody", schema.name());
    let refused = migrate(&["--grant-service", &missing]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("does not exist: create it first"), "{stderr}");
    let refused = migrate(&["--grant-relay", "public"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("reserved"), "{refused:?}");
}

/// Before migration 5 a service role needed table privileges, and without
/// DELETE a re-enqueue of a delivered key failed; after it, the same role
/// keeps enqueueing (it could use the schema, so it keeps enqueue) and the
/// re-enqueue is the no-op it should be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_enqueue_for_roles_that_used_it_and_mends_their_re_enqueue() {
    let fx = Fixture::start().await;
    let schema = TestSchema::unmigrated().await;
    let mut owner = schema.connect().await;
    migrate::run_up_to(&mut owner, &schema.schema, 4).await.unwrap();
    let role = TestRole::create(&schema, "legacy").await;
    owner
        .batch_execute(&schema.sql(&format!(
            "GRANT USAGE ON SCHEMA {s} TO {r};
             GRANT SELECT, INSERT, UPDATE ON idemgate.outbox, idemgate.ordering_keys TO {r};
             GRANT SELECT ON idemgate.delivered, idemgate.settings TO {r};",
            s = schema.name(),
            r = role.name
        )))
        .await
        .unwrap();
    let mut client = role.connect().await;
    let key = enqueue_as(&mut client, &schema.schema, "order:1").await;
    // Delivered, as a relay of that version recorded it (this binary's relay
    // needs the current schema): the row moves to the history.
    owner
        .batch_execute(&schema.sql(
            "WITH done AS (DELETE FROM idemgate.outbox RETURNING id, derived_key, destination, operation, business_key,
                                                                ordering_key, ordering_seq, attempts, created_at)
             INSERT INTO idemgate.delivered (id, derived_key, destination, operation, business_key, ordering_key,
                                             ordering_seq, attempts, enqueued_at, delivered_at)
             SELECT id, derived_key, destination, operation, business_key, ordering_key, ordering_seq, attempts,
                    created_at, now() FROM done",
        ))
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let payload = json!({});
    let before = enqueue_in(&schema.schema, &tx, &Message::new(DESTINATION, "notify", "order:1", &payload)).await;
    let error = before.expect_err("migration 4 alone: permission denied");
    assert!(error.to_string().contains("permission denied for table outbox"), "{error}");
    drop(tx);

    let later: Vec<i32> = (5..=migrate::latest_version()).collect();
    assert_eq!(migrate::run(&mut owner, &schema.schema).await.unwrap(), later);
    assert_eq!(enqueue_as(&mut client, &schema.schema, "order:1").await, key, "now a no-op");
    enqueue_as(&mut client, &schema.schema, "order:2").await;
    let relay = Relay::new(schema.database(4), fx.publisher(), fx.policies(), settings(LEASE));
    assert_eq!(relay.try_execute_step().await.unwrap().delivered, 1, "order:2 alone");
    assert_eq!(fx.sink.count_for(&key), 0, "the delivered key is not sent again");
    // Migrations 6 and 7 give it the set-based form too, as it had enqueue.
    assert_eq!(enqueue_many_as(&mut client, &schema.schema, &["order:1", "order:3"]).await[0], key);
    assert_eq!(relay.try_execute_step().await.unwrap().delivered, 1);
    assert_eq!(fx.sink.count_for(&key), 0);
    assert_eq!(fx.sink.count(), 2, "order:2 and order:3");
}

/// A database of its own (`CREATE DATABASE` costs a second or two, so only
/// for what a schema cannot show), dropped with the guard.
struct TestDatabase {
    name: String,
}

impl TestDatabase {
    async fn create(schema: &TestSchema) -> Self {
        let name = format!("{}_db", schema.name());
        let admin = schema.connect().await;
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("create database");
        Self { name }
    }

    /// The shared server's URL, naming this database.
    fn url(&self, shared: &str) -> String {
        let (base, query) = shared.split_once('?').map_or((shared, None), |(b, q)| (b, Some(q)));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        match query {
            Some(query) => format!("{server}/{}?{query}", self.name),
            None => format!("{server}/{}", self.name),
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let url = support::postgres::shared_database_url();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                client.batch_execute(&sql).await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: test database {} was not dropped: {dropped:?}", self.name);
        }
    }
}

/// Parallel deploys: ten `migrate --grant-service --grant-relay` at once
/// on a fresh database, three times. Granting outside the migrations' lock,
/// one to five of nine failed with "tuple concurrently updated".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_with_grants_from_ten_processes_at_once_succeeds_in_every_one() {
    let schema = TestSchema::unmigrated().await;
    let (service, relay) = (TestRole::create(&schema, "service").await, TestRole::create(&schema, "relay").await);
    for round in 0..3 {
        let database = TestDatabase::create(&schema).await;
        let url = database.url(&schema.url);
        let args = ["migrate", "--database-url", &url, "--grant-service", &service.name, "--grant-relay", &relay.name];
        let children: Vec<std::process::Child> = (0..10)
            .map(|_| {
                Command::new(BINARY)
                    .args(args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("start idemgate migrate")
            })
            .collect();
        for child in children {
            let done = child.wait_with_output().unwrap();
            assert!(done.status.success(), "round {round}: {}", String::from_utf8_lossy(&done.stderr));
        }
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let granted = "SELECT has_function_privilege($1,
            'idemgate.enqueue(text,text,text,jsonb,text,jsonb,jsonb)', 'EXECUTE')";
        assert!(client.query_one(granted, &[&service.name]).await.unwrap().get::<_, bool>(0), "round {round}");
    }
}

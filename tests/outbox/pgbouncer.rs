//! The outbox behind PgBouncer in transaction mode (docs/outbox.md, "Running
//! behind PgBouncer"). Ignored by default: they need a PgBouncer binary, and the
//! relay test one of 1.21 or newer (protocol-level prepared statements,
//! `max_prepared_statements`, on by default since 1.24):
//!
//! ```sh
//! PGBOUNCER=/usr/sbin/pgbouncer cargo test --test outbox pgbouncer:: -- --ignored
//! ```
//!
//! A private PgBouncer in front of the shared PostgreSQL, 4 server
//! connections for every client, so statements keep landing on server
//! connections their client did not use before.

use crate::support;

use std::time::Duration;

use idemgate::outbox::enqueue::{Message, enqueue_in};
use idemgate::outbox::relay::Relay;
use idemgate::outbox::roles::{Duty, Role, grant};
use idemgate::postgres::Endpoint;
use serde_json::json;
use support::outbox::{DESTINATION, Fixture, settings};
use support::pgbouncer::PgBouncer;
use support::roles::TestRole;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(30);

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// The Rust helper sends one typed statement, unnamed, so it works through
/// any PgBouncer in transaction mode (1.18 included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PGBOUNCER=/path/to/pgbouncer"]
async fn services_enqueue_through_pgbouncer_in_transaction_mode() {
    let fx = Fixture::start().await;
    let service = TestRole::create(&fx.schema, "service").await;
    let mut owner = fx.schema.connect().await;
    grant(&mut owner, &fx.schema.schema, &[(Duty::Service, Role::new(&service.name).unwrap())]).await.unwrap();
    let (bouncer, database) = PgBouncer::in_front_of_shared(&[&service.name]);
    let url = bouncer.url(&service.name, &database);
    let enqueuers = (0..4).map(|lane| {
        let (url, schema) = (url.clone(), fx.schema.schema.clone());
        tokio::spawn(async move {
            let mut client = connect(&url).await;
            for i in 0..50 {
                let tx = client.transaction().await.unwrap();
                let payload = json!({"lane": lane, "i": i});
                let key = format!("order:{lane}:{i}");
                let message = Message::new(DESTINATION, "notify", &key, &payload).ordered_by("one-key");
                enqueue_in(&schema, &tx, &message).await.expect("enqueue through pgbouncer");
                enqueue_in(&schema, &tx, &message).await.expect("a duplicate, a no-op");
                tx.commit().await.unwrap();
            }
        })
    });
    for enqueuer in enqueuers.collect::<Vec<_>>() {
        enqueuer.await.unwrap();
    }
    assert_eq!(fx.count("true").await, 200);
}

/// Two relays (pools of 4 plus a LISTEN session each) through 4 server
/// connections: every row delivered once, under a relay role whose
/// `enable_sort = off` comes from the role, since PgBouncer cannot pass
/// the relay's startup `options` on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PGBOUNCER=/path/to/pgbouncer, 1.21 or newer"]
async fn a_relay_role_behind_pgbouncer_in_transaction_mode_delivers_every_row_once() {
    const ROWS: usize = 500;
    let fx = Fixture::start().await;
    let role = TestRole::create(&fx.schema, "relay").await;
    let mut owner = fx.schema.connect().await;
    grant(&mut owner, &fx.schema.schema, &[(Duty::Relay, Role::new(&role.name).unwrap())]).await.unwrap();
    let (bouncer, database) = PgBouncer::in_front_of_shared(&[&role.name]);
    owner
        .batch_execute(&format!("ALTER ROLE {} IN DATABASE {database} SET enable_sort = off", role.name))
        .await
        .unwrap();
    let url = bouncer.url(&role.name, &database);

    let stop = CancellationToken::new();
    let relays: Vec<_> = (0..2)
        .map(|_| {
            let db = idemgate::outbox::connect_relay(&url, 4, fx.schema.schema.clone()).unwrap();
            let relay = Relay::new(db, fx.publisher(), fx.policies(), settings(LEASE));
            tokio::spawn(relay.run(Some(Endpoint::parse(&url).unwrap()), stop.clone()))
        })
        .collect();
    let bulk = fx.schema.sql(
        "SELECT count(idemgate.enqueue('sink', 'notify', 'row:' || i, jsonb_build_object('i', i),
                                       CASE WHEN i % 2 = 0 THEN 'k' || (i % 10) END))
           FROM generate_series(1, $1::int) i",
    );
    owner.query_one(&bulk, &[&(ROWS as i32)]).await.unwrap();
    assert!(fx.sink.wait_for_effects(ROWS, Duration::from_secs(60)).await, "{} effects", fx.sink.effects());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while fx.count("true").await > 0 {
        assert!(std::time::Instant::now() < deadline, "{} rows not recorded delivered", fx.count("true").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for relay in relays {
        relay.await.unwrap();
    }
    assert_eq!((fx.sink.count(), fx.delivered().await), (ROWS, ROWS as i64), "once each, none repeated");

    let through = connect(&url).await;
    let sort: String = through.query_one("SHOW enable_sort", &[]).await.unwrap().get(0);
    assert_eq!(sort, "off", "the role's setting reaches the relay's sessions");
}

//! Once per key: a message is enqueued once per derived key, and only with
//! the business transaction that commits it. A duplicate enqueue, a rolled
//! back transaction and migrations run a second time change nothing; every
//! request carries the derived key, which a message cannot set itself.

use idemgate::outbox::enqueue::{Message, derived_key, enqueue_in};
use serde_json::json;

use crate::LEASE;
use crate::support::outbox::{DESTINATION, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_twice_change_nothing() {
    let fx = Fixture::start().await;
    let mut client = idemgate::postgres::migrate::connect(&fx.schema.url).await.unwrap();
    let applied = idemgate::postgres::migrate::run(&mut client, &fx.schema.schema).await.unwrap();
    assert!(applied.is_empty(), "second run applied {applied:?}");
    let version = idemgate::postgres::migrate::current_version(&client, &fx.schema.schema).await.unwrap();
    assert_eq!(version, idemgate::postgres::migrate::latest_version());
    // A recorded migration whose SQL changed is refused, not re-run.
    let tamper = fx.schema.sql("UPDATE idemgate.schema_migrations SET checksum = 'x' WHERE version = 1");
    client.execute(&tamper, &[]).await.unwrap();
    let refused = idemgate::postgres::migrate::run(&mut client, &fx.schema.schema).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("changed")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueueing_a_key_twice_delivers_it_once() {
    let fx = Fixture::start().await;
    let first = fx.enqueue("order:1", json!({"n": 1}), None).await;
    let second = fx.enqueue("order:1", json!({"n": 2}), None).await;
    assert_eq!(first, second);
    assert_eq!(fx.count("true").await, 1, "one row per derived key");
    let relay = fx.relay(LEASE);
    assert_eq!(fx.drain(&relay).await.delivered, 1);
    // Once delivered, the history still makes a third enqueue a no-op.
    fx.enqueue("order:1", json!({"n": 3}), None).await;
    assert_eq!(fx.count("true").await, 0);
    assert_eq!(fx.drain(&relay).await.claimed, 0);
    assert_eq!(fx.sink.count_for(&first), 1);
    assert_eq!(fx.sink.received()[0].payload, json!({"n": 1}), "the first enqueue's payload wins");
    assert_eq!(fx.delivered().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_carries_the_derived_key_the_payload_and_the_configured_headers() {
    let mut fx = Fixture::start().await;
    fx.destination.headers.insert("authorization".into(), "Bearer relay".into());
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let payload = json!({"to": "a@b.c"});
    let mut message = Message::new(DESTINATION, "order-shipped", "order:10", &payload);
    message.headers.insert("x-tenant".into(), "acme".into());
    let key = enqueue_in(&fx.schema.schema, &tx, &message).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(key, derived_key(&fx.schema.schema, DESTINATION, "order-shipped", "order:10"));
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    let received = fx.sink.received().remove(0);
    assert_eq!(received.key, key, "a message cannot set its own key: enqueue refuses it");
    assert_eq!(received.payload, payload);
    let header = |name: &str| received.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(header("authorization").as_deref(), Some("Bearer relay"));
    assert_eq!(header("x-tenant").as_deref(), Some("acme"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_business_transaction_delivers_nothing() {
    let fx = Fixture::start().await;
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let payload = json!({"to": "a@b.c"});
    enqueue_in(&fx.schema.schema, &tx, &Message::new(DESTINATION, "notify", "order:2", &payload)).await.unwrap();
    tx.rollback().await.unwrap();
    let relay = fx.relay(LEASE);
    assert_eq!(relay.try_execute_step().await.unwrap().claimed, 0);
    assert_eq!(fx.count("true").await, 0);
    assert_eq!(fx.sink.count(), 0);
}

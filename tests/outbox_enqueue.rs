//! The enqueue side of the outbox against the real PostgreSQL: the derived
//! key (SQL and Rust byte for byte, one per outbox) and what `enqueue`
//! refuses. Each test migrates schemas of its own.

mod support;

use std::time::Duration;

use idemgate::outbox::enqueue::{Message, derived_key, enqueue_in};
use idemgate::outbox::relay::Relay;
use serde_json::json;
use support::outbox::{DESTINATION, Fixture, settings};
use support::postgres::TestSchema;

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_rust_derive_byte_identical_keys_in_every_outbox() {
    let (a, b) = (TestSchema::create().await, TestSchema::create().await);
    let tuples = [
        ("ab", "c", "x"),
        ("a", "bc", "x"),
        ("", "", ""),
        ("email", "order-shipped", "order:1001"),
        ("é", "日本", "😀"),
    ];
    let mut seen = Vec::new();
    for schema in [&a, &b] {
        let client = schema.connect().await;
        let own = schema.sql("SELECT idemgate.derived_key($1, $2, $3)");
        let named = schema.sql("SELECT idemgate.derived_key($1, $2, $3, $4)");
        for (d, o, k) in tuples {
            let rust = derived_key(&schema.schema, d, o, k);
            let from_sql: String = client.query_one(&own, &[&d, &o, &k]).await.unwrap().get(0);
            assert_eq!(from_sql, rust, "{} {d:?} {o:?} {k:?}", schema.name());
            let from_name: String = client.query_one(&named, &[&schema.name(), &d, &o, &k]).await.unwrap().get(0);
            assert_eq!(from_name, rust, "the four-field form, given the outbox's name");
            seen.push(rust);
        }
    }
    assert_ne!(seen[0], seen[1], "(\"ab\",\"c\") and (\"a\",\"bc\") must differ");
    let distinct: std::collections::HashSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "no two tuples, in one outbox or across two, share a key");
}

/// The collision: two outboxes in one database bill the same
/// order through one deduplicating destination. Both charges must apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_outboxes_enqueueing_the_same_message_both_take_effect_at_one_destination() {
    let fx = Fixture::start().await;
    let other = TestSchema::create().await;
    let (shop_a, shop_b) = (json!({"amount": 500, "shop": "a"}), json!({"amount": 700, "shop": "b"}));
    let mut keys = Vec::new();
    for (schema, payload) in [(&fx.schema, &shop_a), (&other, &shop_b)] {
        let mut client = schema.connect().await;
        let tx = client.transaction().await.unwrap();
        let message = Message::new(DESTINATION, "charge", "order:1001", payload);
        keys.push(enqueue_in(&schema.schema, &tx, &message).await.expect("enqueue"));
        tx.commit().await.unwrap();
    }
    assert_ne!(keys[0], keys[1], "each outbox derives its own key");
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    let relay_b = Relay::new(other.database(4), fx.publisher(), fx.policies(), settings(LEASE));
    assert_eq!(relay_b.try_execute_batch().await.unwrap().delivered, 1);
    assert_eq!(fx.sink.effects(), 2, "both charges applied: {:?}", fx.sink.received());
    let statuses: Vec<u16> = fx.sink.received().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200], "neither was refused as a replay of the other");
}

//! `kind = "amqp"` destinations against the real RabbitMQ: each test
//! declares an exchange (and a queue) of its own, runs the relay's
//! production loop (`Relay::run`) against its own schema, and reads what
//! reached the queue — the effects, counted at the broker.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use idemgate::config::{ConfigDuration, DestinationConfig, DestinationKind};
use idemgate::outbox::enqueue::Message;
use idemgate::outbox::publisher::{Delivery, Publisher};
use tokio_util::sync::CancellationToken;

use crate::support;
use support::amqp::{
    RabbitProcess, amqp_url, channel, delete, drain, exchange, exchange_with_queue, header, unique_name,
};
use support::outbox::{DESTINATION, Fixture};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const LEASE: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(60);

fn amqp_destination(url: &str, exchange: &str, routing_key: &str) -> DestinationConfig {
    let mut destination = DestinationConfig::new(url);
    destination.kind = DestinationKind::Amqp;
    destination.exchange = Some(exchange.to_string());
    destination.routing_key = Some(routing_key.to_string());
    destination.timeout = ConfigDuration(Duration::from_secs(2));
    destination.backoff_base = ConfigDuration(Duration::from_millis(10));
    destination.backoff_max = ConfigDuration(Duration::from_millis(50));
    destination
}

#[tokio::test]
async fn rows_reach_the_queue_once_each_persistent_in_order_per_key_under_their_derived_key() {
    let url = amqp_url();
    let name = unique_name();
    let (_connection, channel) = channel(&url).await;
    exchange_with_queue(&channel, &name).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = amqp_destination(&url, &name, "orders.{operation}.{ordering_key}");
    let mut keys = HashMap::new();
    for n in 0..30 {
        let ordering_key = format!("account-{}", n % 3);
        let key = fixture.enqueue(&format!("order-{n}"), serde_json::json!({ "n": n }), Some(&ordering_key)).await;
        keys.insert(key, n);
    }

    fixture.run_until_delivered(30).await;

    let held = drain(&channel, &name).await;
    assert_eq!(held.len(), 30, "one message per row");
    let mut last_per_key: HashMap<String, i64> = HashMap::new();
    let mut ids = HashSet::new();
    for message in &held {
        let id = message.properties.message_id().as_ref().expect("every message carries its derived key").to_string();
        assert!(keys.contains_key(&id), "{id} is one of the derived keys");
        assert!(ids.insert(id), "each derived key once");
        assert_eq!(*message.properties.delivery_mode(), Some(2), "persistent");
        let n = serde_json::from_slice::<serde_json::Value>(&message.data).expect("the payload")["n"].as_i64().unwrap();
        let key = message.routing_key.as_str().rsplit('.').next().unwrap_or_default().to_string();
        assert_eq!(key, format!("account-{}", n % 3), "the routing key is the template filled in");
        let previous = last_per_key.insert(key, n);
        assert!(previous.is_none_or(|p| p < n), "per-key order: {previous:?} before {n}");
    }
    delete(&channel, &name).await;
}

#[tokio::test]
async fn a_message_carries_its_headers_and_a_new_span_of_its_trace() {
    let url = amqp_url();
    let name = unique_name();
    let (_connection, channel) = channel(&url).await;
    exchange_with_queue(&channel, &name).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = amqp_destination(&url, &name, "{operation}");
    fixture.destination.headers.insert("x-source".into(), "billing".into());
    let payload = serde_json::json!({ "amount": 10 });
    let mut message = Message::new(DESTINATION, "charge", "order-1", &payload);
    message.headers.insert("x-tenant".into(), "acme".into());
    message.headers.insert("x-source".into(), "checkout".into());
    message.trace_context = Some((TRACEPARENT, Some("vendor=1")));
    fixture.enqueue_message(&message).await;
    let claimed = fixture.claim(LEASE).await;

    assert_eq!(fixture.publisher().publish(&claimed[0]).await, Delivery::Delivered);

    let held = drain(&channel, &name).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].routing_key.as_str(), "charge");
    assert_eq!(held[0].data, br#"{"amount": 10}"#, "the payload is the body");
    assert_eq!(header(&held[0], "x-tenant").as_deref(), Some("acme"), "the message's headers");
    assert_eq!(
        header(&held[0], "x-source").as_deref(),
        Some("checkout"),
        "the message's header over the configured one"
    );
    let traceparent = header(&held[0], "traceparent").expect("the row's trace context");
    assert!(traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "the same trace: {traceparent}");
    assert!(!traceparent.contains("00f067aa0ba902b7"), "a new span: {traceparent}");
    assert_eq!(header(&held[0], "tracestate").as_deref(), Some("vendor=1"));
    delete(&channel, &name).await;
}

/// RabbitMQ acks a message no queue takes and drops it: with `mandatory`
/// the broker returns it first, and a returned message is not delivered.
#[tokio::test]
async fn a_message_no_queue_takes_is_retried_then_dead_with_the_reason() {
    let url = amqp_url();
    let name = unique_name();
    let (_connection, channel) = channel(&url).await;
    exchange(&channel, &name).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = amqp_destination(&url, &name, "orders");
    fixture.destination.max_attempts = 2;
    fixture.enqueue("order-1", serde_json::json!({}), None).await;

    fixture.run_until("state = 'dead'").await;

    let (attempts, reason) = dead_row(&fixture).await;
    assert_eq!(attempts, 2, "retried up to max_attempts");
    assert!(reason.contains("no queue is bound"), "{reason}");
    delete(&channel, &name).await;
}

/// An exchange that does not exist closes the channel: retried on a new
/// channel, then dead with the broker's reason; the destination publishes
/// again once the exchange exists.
#[tokio::test]
async fn a_missing_exchange_is_retried_on_a_new_channel_then_dead_and_a_redrive_delivers() {
    let url = amqp_url();
    let name = unique_name();
    let (_connection, channel) = channel(&url).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = amqp_destination(&url, &name, "orders");
    fixture.destination.max_attempts = 2;
    fixture.enqueue("order-1", serde_json::json!({}), None).await;

    fixture.run_until("state = 'dead'").await;
    let (attempts, reason) = dead_row(&fixture).await;
    assert_eq!(attempts, 2);
    assert!(reason.contains("NOT_FOUND") && reason.contains(&name), "{reason}");

    exchange_with_queue(&channel, &name).await;
    let client = fixture.db.pool.get().await.unwrap();
    client.execute(&fixture.schema.sql("SELECT idemgate.redrive()"), &[]).await.expect("redrive");
    fixture.run_until_delivered(1).await;
    assert_eq!(drain(&channel, &name).await.len(), 1);
    delete(&channel, &name).await;
}

async fn dead_row(fixture: &Fixture) -> (i32, String) {
    let client = fixture.db.pool.get().await.unwrap();
    let sql = fixture.schema.sql("SELECT attempts, last_error FROM idemgate.outbox WHERE state = 'dead'");
    let row = client.query_one(&sql, &[]).await.unwrap();
    (row.get(0), row.get(1))
}

/// The broker SIGKILLed and restarted mid-run (a private one; its durable
/// queue and persistent messages on disk): the relay opens a new
/// connection by itself, every row reaches the queue, and a consumer
/// deduplicating on `message_id` sees each once, in order per key.
#[tokio::test]
async fn a_broker_restarted_mid_run_costs_retries_and_nothing_else() {
    let mut rabbit = tokio::task::spawn_blocking(RabbitProcess::start).await.expect("start rabbitmq");
    let url = rabbit.url();
    let name = unique_name();
    {
        let (_connection, channel) = channel(&url).await;
        exchange_with_queue(&channel, &name).await;
    }
    let mut fixture = Fixture::start().await;
    fixture.destination = amqp_destination(&url, &name, "{ordering_key}");
    // A broker shutting down returns what it is sent (its queues stop
    // first): enough attempts, paced, to outlast the restart.
    fixture.destination.max_attempts = 1000;
    fixture.destination.backoff_max = ConfigDuration(Duration::from_millis(500));
    for n in 0..40 {
        fixture.enqueue(&format!("order-{n}"), serde_json::json!({ "n": n }), Some(&format!("k{}", n % 4))).await;
    }
    let stop = CancellationToken::new();
    let running = tokio::spawn(fixture.relay(LEASE).run(None, stop.clone()));
    let some = tokio::time::timeout(PATIENCE, async {
        while fixture.delivered().await < 10 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    assert!(some.await.is_ok(), "the first rows were delivered");
    for n in 40..60 {
        fixture.enqueue(&format!("order-{n}"), serde_json::json!({ "n": n }), Some(&format!("k{}", n % 4))).await;
    }
    let rabbit = tokio::task::spawn_blocking(move || {
        rabbit.restart();
        rabbit
    })
    .await
    .expect("restart rabbitmq");
    let all = tokio::time::timeout(PATIENCE, async {
        while fixture.delivered().await < 60 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let all = all.await;
    stop.cancel();
    running.await.expect("the relay ran");
    if all.is_err() {
        let client = fixture.db.pool.get().await.unwrap();
        let sql = fixture.schema.sql("SELECT state, attempts, coalesce(last_error, '') || ' ' || coalesce(ordering_key, '') FROM idemgate.outbox ORDER BY state, id LIMIT 12");
        let rows: Vec<(String, i32, String)> =
            client.query(&sql, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        panic!("{} of 60 rows delivered after the restart; left: {rows:?}", fixture.delivered().await);
    }
    assert_eq!(fixture.count("true").await, 0, "nothing dead, nothing left");

    let (_connection, channel) = channel(&url).await;
    let held = drain(&channel, &name).await;
    let mut seen = HashSet::new();
    let mut last_per_key: HashMap<String, i64> = HashMap::new();
    for message in &held {
        let id = message.properties.message_id().as_ref().expect("a derived key").to_string();
        if !seen.insert(id) {
            continue; // the consumer deduplicates on message_id
        }
        let n = serde_json::from_slice::<serde_json::Value>(&message.data).unwrap()["n"].as_i64().unwrap();
        let previous = last_per_key.insert(message.routing_key.to_string(), n);
        assert!(previous.is_none_or(|p| p < n), "per-key order: {previous:?} before {n}");
    }
    assert_eq!(seen.len(), 60, "every row reached the queue");
    drop(rabbit);
}

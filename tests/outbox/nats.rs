//! `kind = "nats"` destinations against the real NATS server with
//! JetStream: each test makes a stream of its own, runs the relay's
//! production loop (`Relay::run`) against its own schema, and reads what
//! the stream holds — the effects, counted at the broker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use idemgate::config::{ConfigDuration, DestinationConfig, DestinationKind};
use idemgate::outbox::enqueue::Message;
use idemgate::outbox::publisher::{Delivery, Destinations, Publisher};
use idemgate::outbox::relay::Relay;
use idemgate::outbox::retry::RetryPolicy;
use tokio_util::sync::CancellationToken;

use crate::support;
use support::nats::{NatsProcess, create_stream, jetstream, messages, unique_subject};
use support::outbox::{DESTINATION, Fixture, settings};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const LEASE: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(60);

fn nats_destination(url: &str, subject: &str) -> DestinationConfig {
    let mut destination = DestinationConfig::new(url);
    destination.kind = DestinationKind::Nats;
    destination.subject = Some(subject.to_string());
    destination.timeout = ConfigDuration(Duration::from_secs(2));
    destination.backoff_base = ConfigDuration(Duration::from_millis(10));
    destination.backoff_max = ConfigDuration(Duration::from_millis(50));
    destination
}

fn header<'a>(message: &'a async_nats::jetstream::message::StreamMessage, name: &str) -> Option<&'a str> {
    message.headers.get(name).map(|value| value.as_str())
}

#[tokio::test]
async fn rows_reach_the_stream_once_each_in_order_per_key_under_their_derived_key() {
    let url = support::services::nats_url();
    let js = jetstream(&url).await;
    let prefix = unique_subject();
    create_stream(&js, &prefix, vec![format!("{prefix}.>")]).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = nats_destination(&url, &format!("{prefix}.{{operation}}.{{ordering_key}}"));
    let mut keys = HashMap::new();
    for n in 0..30 {
        let ordering_key = format!("account-{}", n % 3);
        let key = fixture.enqueue(&format!("order-{n}"), serde_json::json!({ "n": n }), Some(&ordering_key)).await;
        keys.insert(key, n);
    }

    fixture.run_until_delivered(30).await;

    let held = messages(&js, &prefix).await;
    assert_eq!(held.len(), 30, "one message per row");
    let mut last_per_key: HashMap<String, i64> = HashMap::new();
    let mut ids = HashSet::new();
    for message in &held {
        let id = header(message, "Nats-Msg-Id").expect("every message carries its derived key").to_string();
        assert!(keys.contains_key(&id), "{id} is one of the derived keys");
        assert!(ids.insert(id), "each derived key once");
        let payload: serde_json::Value = serde_json::from_slice(&message.payload).expect("the payload as published");
        let n = payload["n"].as_i64().expect("the row's payload");
        let key = message.subject.as_str().rsplit('.').next().unwrap_or_default().to_string();
        assert_eq!(key, format!("account-{}", n % 3), "the subject is the template filled in");
        let previous = last_per_key.insert(key, n);
        assert!(previous.is_none_or(|p| p < n), "per-key order: {previous:?} before {n}");
    }
    let _ = js.delete_stream(&prefix).await;
}

/// A relay that published and lost the acknowledgement (a crash, a cut
/// connection) publishes again under the same `Nats-Msg-Id`: the stream
/// says `duplicate`, which is a delivery, and holds the message once.
#[tokio::test]
async fn a_publish_repeated_after_a_lost_acknowledgement_is_delivered_and_held_once() {
    let url = support::services::nats_url();
    let js = jetstream(&url).await;
    let prefix = unique_subject();
    create_stream(&js, &prefix, vec![format!("{prefix}.>")]).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = nats_destination(&url, &format!("{prefix}.{{operation}}"));
    fixture.destination.headers.insert("x-source".into(), "billing".into());
    let payload = serde_json::json!({ "amount": 10 });
    let mut message = Message::new(DESTINATION, "charge", "order-1", &payload);
    message.headers.insert("x-tenant".into(), "acme".into());
    message.headers.insert("x-source".into(), "checkout".into());
    message.trace_context = Some((TRACEPARENT, Some("vendor=1")));
    fixture.enqueue_message(&message).await;
    let claimed = fixture.claim(LEASE).await;
    assert_eq!(claimed.len(), 1);
    let publisher = fixture.publisher();

    assert_eq!(publisher.publish(&claimed[0]).await, Delivery::Delivered);
    assert_eq!(publisher.publish(&claimed[0]).await, Delivery::Delivered, "a duplicate is a delivery");

    let held = messages(&js, &prefix).await;
    assert_eq!(held.len(), 1, "the stream holds it once");
    assert_eq!(header(&held[0], "Nats-Msg-Id"), Some(claimed[0].derived_key.as_str()));
    assert_eq!(held[0].payload.as_ref(), br#"{"amount": 10}"#, "the payload is the body");
    assert_eq!(header(&held[0], "x-tenant"), Some("acme"), "the message's headers");
    assert_eq!(header(&held[0], "x-source"), Some("checkout"), "the message's header over the configured one");
    let traceparent = header(&held[0], "traceparent").expect("the row's trace context");
    assert!(traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "the same trace: {traceparent}");
    assert!(!traceparent.contains("00f067aa0ba902b7"), "a new span: {traceparent}");
    assert_eq!(header(&held[0], "tracestate"), Some("vendor=1"));
    let _ = js.delete_stream(&prefix).await;
}

#[tokio::test]
async fn a_subject_no_stream_takes_is_retried_then_dead_with_the_reason() {
    let url = support::services::nats_url();
    let mut fixture = Fixture::start().await;
    fixture.destination = nats_destination(&url, &format!("{}.nowhere", unique_subject()));
    fixture.destination.max_attempts = 2;
    fixture.enqueue("order-1", serde_json::json!({}), None).await;

    fixture.run_until("state = 'dead'").await;

    let client = fixture.db.pool.get().await.unwrap();
    let sql = fixture.schema.sql("SELECT attempts, last_error FROM idemgate.outbox WHERE state = 'dead'");
    let row = client.query_one(&sql, &[]).await.unwrap();
    let (attempts, reason): (i32, String) = (row.get(0), row.get(1));
    assert_eq!(attempts, 2, "retried up to max_attempts");
    assert!(reason.contains("no stream takes subject"), "{reason}");
}

#[tokio::test]
async fn a_business_key_that_would_change_the_subject_is_dead_at_once() {
    let url = support::services::nats_url();
    let js = jetstream(&url).await;
    let prefix = unique_subject();
    create_stream(&js, &prefix, vec![format!("{prefix}.>")]).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = nats_destination(&url, &format!("{prefix}.orders.{{business_key}}"));
    fixture.enqueue("eu.42", serde_json::json!({}), None).await;
    fixture.enqueue("*", serde_json::json!({}), None).await;

    fixture.run_until("state = 'dead' AND (SELECT count(*) FROM idemgate.outbox d WHERE d.state = 'dead') = 2").await;

    let client = fixture.db.pool.get().await.unwrap();
    let sql = fixture
        .schema
        .sql("SELECT attempts, last_error FROM idemgate.outbox WHERE state = 'dead' ORDER BY business_key");
    let rows = client.query(&sql, &[]).await.unwrap();
    let reasons: Vec<(i32, String)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    assert_eq!(reasons.iter().map(|(attempts, _)| *attempts).collect::<Vec<_>>(), [1, 1], "{reasons:?}");
    assert!(reasons[0].1.contains("wildcards"), "{reasons:?}");
    assert!(reasons[1].1.contains("would split it"), "{reasons:?}");
    assert!(messages(&js, &prefix).await.is_empty(), "nothing published under another subject");
    let _ = js.delete_stream(&prefix).await;
}

/// The broker SIGKILLed and restarted mid-run (its JetStream store on
/// disk): the relay reconnects by itself, every row reaches the stream,
/// and a consumer deduplicating on `Nats-Msg-Id` sees each once, in order
/// per key.
#[tokio::test]
async fn a_broker_restarted_mid_run_costs_retries_and_nothing_else() {
    let mut nats = tokio::task::spawn_blocking(NatsProcess::start).await.expect("start nats");
    let url = nats.url();
    let prefix = unique_subject();
    create_stream(&jetstream(&url).await, &prefix, vec![format!("{prefix}.>")]).await;
    let mut fixture = Fixture::start().await;
    fixture.destination = nats_destination(&url, &format!("{prefix}.{{ordering_key}}"));
    fixture.destination.max_attempts = 1000;
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
    nats.kill();
    for n in 40..60 {
        fixture.enqueue(&format!("order-{n}"), serde_json::json!({ "n": n }), Some(&format!("k{}", n % 4))).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let nats = tokio::task::spawn_blocking(move || {
        nats.restart();
        nats
    })
    .await
    .expect("restart nats");
    let all = tokio::time::timeout(PATIENCE, async {
        while fixture.delivered().await < 60 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let all = all.await;
    stop.cancel();
    running.await.expect("the relay ran");
    assert!(all.is_ok(), "{} of 60 rows delivered after the restart", fixture.delivered().await);
    assert_eq!(fixture.count("true").await, 0, "nothing dead, nothing left");

    let held = messages(&jetstream(&url).await, &prefix).await;
    let mut seen = HashSet::new();
    let mut last_per_key: HashMap<String, i64> = HashMap::new();
    for message in &held {
        let id = header(message, "Nats-Msg-Id").expect("a derived key").to_string();
        if !seen.insert(id) {
            continue; // the consumer deduplicates on Nats-Msg-Id
        }
        let n = serde_json::from_slice::<serde_json::Value>(&message.payload).unwrap()["n"].as_i64().unwrap();
        let key = message.subject.as_str().rsplit('.').next().unwrap_or_default().to_string();
        let previous = last_per_key.insert(key, n);
        assert!(previous.is_none_or(|p| p < n), "per-key order: {previous:?} before {n}");
    }
    assert_eq!(seen.len(), 60, "every row reached the stream");
    drop(nats);
}

/// A frozen broker (SIGSTOP: connections open, nothing answers) beside an
/// HTTP destination: the HTTP rows are all delivered meanwhile, and the
/// broker's rows follow once it thaws.
#[tokio::test]
async fn a_frozen_broker_holds_up_no_http_destination() {
    let nats = tokio::task::spawn_blocking(NatsProcess::start).await.expect("start nats");
    let prefix = unique_subject();
    create_stream(&jetstream(&nats.url()).await, &prefix, vec![format!("{prefix}.>")]).await;
    let fixture = Fixture::start().await;
    let mut destinations = BTreeMap::from([(DESTINATION.to_string(), fixture.destination.clone())]);
    destinations.insert("stream".into(), nats_destination(&nats.url(), &format!("{prefix}.{{operation}}")));
    let policies = destinations.iter().map(|(name, d)| (name.clone(), RetryPolicy::from(d))).collect();
    let publisher = Destinations::new(&destinations).expect("valid destinations");
    let relay = Relay::new(fixture.schema.database(4), publisher, policies, settings(LEASE));
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(None, stop.clone()));

    nats.pause();
    let payload = serde_json::json!({});
    for n in 0..10 {
        let business_key = format!("to-stream-{n}");
        fixture.enqueue_message(&Message::new("stream", "notify", &business_key, &payload)).await;
    }
    for n in 0..20 {
        fixture.enqueue(&format!("to-http-{n}"), serde_json::json!({ "n": n }), None).await;
    }
    let http_served = fixture.sink.wait_for_effects(20, PATIENCE).await;
    let stream_pending = fixture.count("destination = 'stream'").await;
    nats.resume();
    let all = tokio::time::timeout(PATIENCE, async {
        while fixture.delivered().await < 30 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.cancel();
    running.await.expect("the relay ran");
    assert!(http_served, "the HTTP destination served its 20 rows while the broker was frozen");
    assert_eq!(stream_pending, 10, "the broker's rows waited for it");
    assert!(all.is_ok(), "{} of 30 rows delivered after the broker thawed", fixture.delivered().await);
}

//! `wait_replicas` on a single Redis with a real replica: a write counts
//! only once the replica holds it. A begin the replica does not
//! acknowledge is released and refused (`503`, nothing forwarded); a
//! complete it does not acknowledge keeps the client waiting, and is
//! retried, until it does — or until the lease would lapse, when the
//! client is answered anyway and that answer is counted. Each count is
//! taken at the upstream or in the servers, never from timings.

mod support;

use std::time::Duration;

use idemgate::config::ConfigDuration;
use support::gateway::{TestGateway, config};
use support::redis_replicas::{Replicated, Resp};
use support::redis_server::unique_prefix;
use support::upstream::Upstream;

const CHARGE: &str = r#"{"amount": 500, "currency": "eur"}"#;
const PRIMARY: usize = 0;
const REPLICA: usize = 1;

fn ms(n: u64) -> ConfigDuration {
    ConfigDuration(Duration::from_millis(n))
}

/// The `st` field of the one record a node holds under `prefix`.
fn record_state(redis: &Replicated, node: usize, prefix: &str) -> Option<String> {
    let Resp::Array(keys) = redis.query(node, &["KEYS", &format!("{prefix}*")]) else { panic!("KEYS") };
    let key = keys.first()?.text();
    match redis.query(node, &["HGET", &key, "st"]) {
        Resp::Bulk(state) => Some(state),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_begin_the_replica_does_not_acknowledge_is_released_and_refused_and_nothing_is_forwarded() {
    let redis = tokio::task::spawn_blocking(Replicated::start).await.expect("start redis");
    let upstream = Upstream::start().await;
    let prefix = unique_prefix();
    let store = redis.url(PRIMARY, &format!("prefix={prefix}&wait_replicas=1"));
    let gateway = TestGateway::start(config(&upstream.url(), &store)).await;

    let first = gateway.post("/charge").key("held").json(CHARGE).send().await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(record_state(&redis, REPLICA, &prefix).as_deref(), Some("c"), "the replica held it before the answer");

    redis.pause(REPLICA);
    let refused = gateway.post("/charge").key("refused").json(CHARGE).send().await;
    assert_eq!((refused.status, refused.problem().as_str()), (503, "store-unavailable"), "{}", refused.text());
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(upstream.count_for("refused"), 0, "nothing forwarded");
    assert_eq!(redis.keys(PRIMARY), 1, "the refused begin left no record on the primary");

    redis.resume(REPLICA);
    let retried = gateway.post("/charge").key("refused").json(CHARGE).send().await;
    assert_eq!(retried.status, 201, "{}", retried.text());
    assert_eq!(upstream.count_for("refused"), 1, "the retry ran it, once");
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    assert!(metrics.contains(r#"idemgate_store_unreplicated_total{operation="begin"} 1"#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_complete_is_answered_only_once_the_replica_holds_it() {
    let redis = tokio::task::spawn_blocking(Replicated::start).await.expect("start redis");
    let upstream = Upstream::start().await;
    let prefix = unique_prefix();
    let store = redis.url(PRIMARY, &format!("prefix={prefix}&wait_replicas=1&wait_timeout=50ms"));
    let mut config = config(&upstream.url(), &store);
    config.gateway.lease = ms(20_000);
    let gateway = std::sync::Arc::new(TestGateway::start(config).await);

    let client = gateway.clone();
    let answer = tokio::spawn(async move { client.post("/slow?ms=300").key("slow").json(CHARGE).send().await });
    upstream.wait_started(1).await;
    // The begin is on the replica; the complete to come will not be.
    redis.pause(REPLICA);
    upstream.wait_finished(1).await;
    // Long enough for several tries of the complete, each refused.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!answer.is_finished(), "answered while the replica could not hold the completion");
    assert_eq!(record_state(&redis, PRIMARY, &prefix).as_deref(), Some("c"), "the primary has it");

    redis.resume(REPLICA);
    let answer = answer.await.expect("the client's task");
    assert_eq!(answer.status, 201, "{}", answer.text());
    assert_eq!(record_state(&redis, REPLICA, &prefix).as_deref(), Some("c"), "the replica held it before the answer");
    let replay = gateway.post("/slow?ms=300").key("slow").json(CHARGE).send().await;
    assert!(replay.replayed(), "{}", replay.text());
    assert_eq!(upstream.count_for("slow"), 1);
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    assert!(metrics.contains("idemgate_unreplicated_answers_total 0"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_complete_never_acknowledged_is_answered_when_the_lease_would_lapse_and_counted() {
    let redis = tokio::task::spawn_blocking(Replicated::start).await.expect("start redis");
    let upstream = Upstream::start().await;
    let prefix = unique_prefix();
    let store = redis.url(PRIMARY, &format!("prefix={prefix}&wait_replicas=1&wait_timeout=50ms"));
    let mut config = config(&upstream.url(), &store);
    config.gateway.lease = ms(1500);
    config.gateway.store_timeout = ms(300);
    let gateway = std::sync::Arc::new(TestGateway::start(config).await);

    let client = gateway.clone();
    let answer = tokio::spawn(async move { client.post("/slow?ms=300").key("lapsing").json(CHARGE).send().await });
    upstream.wait_started(1).await;
    redis.pause(REPLICA);
    let answer = answer.await.expect("the client's task");
    assert_eq!(answer.status, 201, "answered anyway: {}", answer.text());
    let metrics = gateway.admin("GET", "/metrics").send().await.text();
    assert!(metrics.contains("idemgate_unreplicated_answers_total 1"), "{metrics}");
    assert!(metrics.contains("idemgate_settle_abandoned_total 1"), "{metrics}");
    redis.resume(REPLICA);
}

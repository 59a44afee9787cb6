//! `wait_replicas` on a single Redis with a real replica: a write counts
//! only once the replica holds it. A begin the replica does not
//! acknowledge is released and refused (`503`, nothing forwarded); a
//! complete it does not acknowledge keeps the client waiting, and is
//! retried, until it does — or until the lease would lapse, when the
//! client is answered anyway and that answer is counted. Each count is
//! taken at the upstream or in the servers, never from timings.
//!
//! At start, the gateway binary warns of a primary (or a Cluster master)
//! with fewer replicas connected than `wait_replicas` asks, naming the
//! store URL redacted, the numbers, and what follows.

use crate::support;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idemgate::config::ConfigDuration;
use support::gateway::{TestGateway, config};
use support::redis_cluster_replicas::ReplicatedCluster;
use support::redis_replicas::{DATA_PASSWORD, Replicated, Resp};
use support::redis_server::{TempDir, free_port, unique_prefix};
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

/// What `idemgate serve --store STORE` logged by the time it listens: the
/// store is opened, and its start-up checks logged, before it binds.
fn logged_until_listening(store: &str) -> String {
    let dir = TempDir::new("gateway-log");
    let log = dir.0.join("stderr.log");
    let addr = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["serve", "--listen", &addr, "--admin-listen", &admin, "--upstream", "http://127.0.0.1:9"])
        .args(["--store", store])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log file"))
        .spawn()
        .expect("start idemgate serve");
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&addr).is_err() {
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            panic!("idemgate serve did not listen on {addr} ({exited:?}); it said:\n{}", said());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    said()
}

const TOO_FEW: &str = "fewer replicas connected than wait_replicas asks";

/// Waits until a primary counts `n` replicas connected.
fn wait_for_connected(info: impl Fn() -> String, n: u32) {
    let want = format!("connected_slaves:{n}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !info().lines().any(|l| l.trim() == want) {
        assert!(Instant::now() < deadline, "never {want}: {}", info());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_primary_with_fewer_replicas_than_wait_replicas_is_warned_of_at_start_with_the_url_redacted() {
    let mut redis = Replicated::start();
    let port = redis.port(PRIMARY);
    let held = logged_until_listening(&redis.url(PRIMARY, "wait_replicas=1"));
    assert!(!held.contains(TOO_FEW), "one replica connected meets wait_replicas=1:\n{held}");

    redis.kill(REPLICA);
    wait_for_connected(|| redis.query(PRIMARY, &["INFO", "replication"]).text(), 0);
    let logged = logged_until_listening(&redis.url(PRIMARY, "wait_replicas=1"));
    let line = logged.lines().find(|l| l.contains(TOO_FEW)).unwrap_or_else(|| panic!("no warning:\n{logged}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("every new key is refused (503) until they connect"), "{line}");
    assert!(line.contains(&format!("store=redis://:[redacted]@127.0.0.1:{port}/0?wait_replicas=1")), "{line}");
    assert!(line.contains("connected=0") && line.contains("wait_replicas=1"), "{line}");
    assert!(!logged.contains(DATA_PASSWORD), "{logged}");
}

#[test]
fn a_cluster_master_with_fewer_replicas_than_wait_replicas_is_warned_of_at_start_by_address() {
    let mut cluster = ReplicatedCluster::start();
    let held = logged_until_listening(&cluster.url("wait_replicas=1"));
    assert!(!held.contains(TOO_FEW), "every master has its replica:\n{held}");

    let master = cluster.a_master(&[]);
    let replica = cluster.replica_of(master);
    cluster.kill(replica);
    wait_for_connected(|| cluster.query(master, &["INFO", "replication"]).text(), 0);
    let logged = logged_until_listening(&cluster.url("wait_replicas=1"));
    let warned: Vec<&str> = logged.lines().filter(|l| l.contains(TOO_FEW)).collect();
    assert_eq!(warned.len(), 1, "only the master without its replica:\n{logged}");
    let line = warned[0];
    assert!(line.contains(&format!("master=127.0.0.1:{}", cluster.port(master))), "{line}");
    assert!(line.contains("connected=0") && line.contains("wait_replicas=1"), "{line}");
    assert!(line.contains("every new key in its slots is refused (503) until they connect"), "{line}");
    assert!(line.contains("store=redis+cluster://:[redacted]@"), "{line}");
    assert!(!logged.contains(DATA_PASSWORD), "{logged}");
}

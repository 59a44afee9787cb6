//! Destinations are isolated, a claim is bounded by bytes, and the step
//! tests drive is one claim of each lane: the relay's lanes against the
//! real PostgreSQL.
//!
//! The slow destination here is a gate: a real HTTP server that holds
//! every request whose payload says `"hold": true` until the test opens
//! it, so "while the slow destination is still busy" is a fact the test
//! controls, not a race against a timer. Nothing asserts how fast anything
//! went (the ratio of latencies is measured by `load-tests/run`, R1).

use crate::support;

use idemgate::outbox::retry::RetryPolicy;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use idemgate::config::{ConfigDuration, DestinationConfig};
use idemgate::metrics::Metrics;
use idemgate::outbox::claim::{self, Limits};
use idemgate::outbox::publisher::Destinations;
use idemgate::outbox::relay::{Relay, Settings};
use serde_json::json;
use support::http_server::HttpServer;
use support::outbox::settings;
use support::postgres::TestSchema;
use support::sink::Sink;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(30);

/// A destination that holds `"hold": true` requests until opened.
struct Gate {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    arrived: Arc<(AtomicUsize, Notify)>,
    answered: Arc<AtomicUsize>,
    _server: HttpServer,
}

impl Gate {
    async fn start() -> Self {
        let (open, opened) = watch::channel(false);
        let arrived = Arc::new((AtomicUsize::new(0), Notify::new()));
        let answered = Arc::new(AtomicUsize::new(0));
        let (a, b) = (arrived.clone(), answered.clone());
        let server = HttpServer::start(move |request: Request<Incoming>| {
            let (mut opened, arrived, answered) = (opened.clone(), a.clone(), b.clone());
            async move {
                let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                let payload: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                arrived.0.fetch_add(1, Ordering::SeqCst);
                arrived.1.notify_waiters();
                if payload["hold"] == true {
                    let _ = opened.wait_for(|open| *open).await;
                }
                answered.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
            }
        })
        .await;
        Self { addr: server.addr, open, arrived, answered, _server: server }
    }

    fn url(&self) -> String {
        format!("http://{}/deliver", self.addr)
    }

    fn arrived(&self) -> usize {
        self.arrived.0.load(Ordering::SeqCst)
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` requests have arrived.
    async fn wait_arrived(&self, n: usize) {
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                let notified = self.arrived.1.notified();
                if self.arrived() >= n {
                    return;
                }
                notified.await;
            }
        });
        assert!(waited.await.is_ok(), "only {} of {n} requests reached the gate", self.arrived());
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

fn destination(url: String) -> DestinationConfig {
    let mut d = DestinationConfig::new(url);
    d.timeout = ConfigDuration(Duration::from_secs(60)); // the gate holds requests as long as the test says
    d.backoff_base = ConfigDuration(Duration::from_millis(10));
    d.backoff_max = ConfigDuration(Duration::from_millis(20));
    d
}

/// A relay serving `fast` (a sink) and `slow` (the gate), reporting into `metrics`.
fn relay(
    schema: &TestSchema,
    sink: &Sink,
    gate: &Gate,
    settings: Settings,
    metrics: &Arc<Metrics>,
) -> Relay<Destinations> {
    let destinations =
        BTreeMap::from([("fast".to_string(), destination(sink.url())), ("slow".to_string(), destination(gate.url()))]);
    let policies = destinations.iter().map(|(name, d)| (name.clone(), RetryPolicy::from(d))).collect();
    let publisher = Destinations::new(&destinations).unwrap();
    Relay::new(schema.database(4), publisher, policies, settings).with_metrics(metrics.clone())
}

/// Enqueues `count` rows for `destination` in one transaction.
async fn enqueue(schema: &TestSchema, destination: &str, prefix: &str, count: i32, payload: serde_json::Value) {
    let client = schema.connect().await;
    let sql = schema.sql(
        "SELECT count(idemgate.enqueue(destination => $1, operation => 'op', business_key => $2 || i, payload => $3::text::jsonb))
           FROM generate_series(1, $4::int) AS i",
    );
    client.query_one(&sql, &[&destination, &prefix, &payload.to_string(), &count]).await.unwrap();
}

async fn count(schema: &TestSchema, condition: &str) -> i64 {
    let client = schema.connect().await;
    let sql = schema.sql(&format!("SELECT count(*) FROM idemgate.outbox WHERE {condition}"));
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// Waits (bounded) until the metrics show every line of `lines`.
async fn wait_for_metrics(metrics: &Metrics, lines: &[&str]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = String::from_utf8(metrics.render()).unwrap();
        if lines.iter().all(|line| text.contains(line)) {
            return;
        }
        assert!(Instant::now() < deadline, "{lines:?} not all in\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until the outbox is empty.
async fn wait_until_empty(schema: &TestSchema) {
    let deadline = Instant::now() + PATIENCE;
    while count(schema, "true").await > 0 {
        assert!(Instant::now() < deadline, "{} rows left", count(schema, "true").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn listen(schema: &TestSchema) -> Option<idemgate::postgres::Endpoint> {
    Some(idemgate::postgres::Endpoint::parse(&schema.url).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_destination_never_delays_a_fast_one_and_the_gauges_show_it_while_it_is_blocked() {
    let schema = TestSchema::create().await;
    let (sink, gate) = (Sink::start().await, Gate::start().await);
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let running =
        tokio::spawn(relay(&schema, &sink, &gate, settings(LEASE), &metrics).run(listen(&schema), stop.clone()));

    enqueue(&schema, "slow", "s", 3, json!({"hold": true})).await;
    gate.wait_arrived(3).await;
    enqueue(&schema, "fast", "f", 50, json!({})).await;
    assert!(sink.wait_for_effects(50, PATIENCE).await, "the fast destination got {} of 50", sink.effects());
    wait_for_metrics(
        &metrics,
        &[
            r#"idemgate_outbox_rows{destination="slow",state="leased"} 3"#,
            r#"idemgate_outbox_in_flight{destination="slow"} 3"#,
            r#"idemgate_outbox_delivery_attempts_total{destination="fast",outcome="delivered"} 50"#,
        ],
    )
    .await;
    assert_eq!(gate.answered(), 0, "every slow request is still held");

    gate.open();
    wait_until_empty(&schema).await;
    stop.cancel();
    running.await.unwrap();
    assert_eq!((gate.arrived(), sink.count()), (3, 50), "each row published once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_at_max_in_flight_holds_back_only_its_own_rows() {
    let schema = TestSchema::create().await;
    let (sink, gate) = (Sink::start().await, Gate::start().await);
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let running = tokio::spawn(
        relay(&schema, &sink, &gate, Settings { max_in_flight: 2, ..settings(LEASE) }, &metrics)
            .run(listen(&schema), stop.clone()),
    );

    enqueue(&schema, "slow", "held", 4, json!({"hold": true})).await;
    gate.wait_arrived(2).await;
    enqueue(&schema, "fast", "f", 20, json!({})).await;
    assert!(sink.wait_for_effects(20, PATIENCE).await, "the fast destination got {} of 20", sink.effects());
    // The fast rows went through while the slow lane was full: no third request to it.
    assert_eq!(gate.arrived(), 2, "max_in_flight = 2");
    wait_for_metrics(&metrics, &[r#"idemgate_outbox_in_flight{destination="slow"} 2"#]).await;
    // The other two are claimed (their leases renewed) and wait for a slot of their own destination.
    assert_eq!(count(&schema, "destination = 'slow' AND state = 'leased'").await, 4);

    gate.open();
    wait_until_empty(&schema).await;
    stop.cancel();
    running.await.unwrap();
    assert_eq!(gate.arrived(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_publish_does_not_hold_the_rest_of_its_own_claim() {
    let schema = TestSchema::create().await;
    let (sink, gate) = (Sink::start().await, Gate::start().await);
    let metrics = Arc::new(Metrics::new());
    // One transaction: the lane's first claim takes all 21 rows at once.
    let client = schema.connect().await;
    let sql = schema.sql(
        "SELECT count(idemgate.enqueue('slow', 'op', 'k' || i, jsonb_build_object('hold', i = 1)))
           FROM generate_series(1, 21) AS i",
    );
    client.query_one(&sql, &[]).await.unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay(&schema, &sink, &gate, settings(LEASE), &metrics).run(None, stop.clone()));

    gate.wait_arrived(21).await;
    // Recorded, not only published: the 20 rows left the outbox while the first is held.
    let deadline = Instant::now() + PATIENCE;
    while count(&schema, "true").await > 1 {
        assert!(Instant::now() < deadline, "{} rows still in the outbox", count(&schema, "true").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count(&schema, "state = 'leased' AND business_key = 'k1'").await, 1);

    gate.open();
    wait_until_empty(&schema).await;
    stop.cancel();
    running.await.unwrap();
}

/// One step, as the tests drive the relay, is one claim of each lane — at
/// most `batch_size` rows per destination — through the lanes' own
/// publishes and recorders, and returns only once all it claimed is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_step_claims_a_batch_per_destination_and_returns_once_all_of_it_is_recorded() {
    let schema = TestSchema::create().await;
    let (sink, gate) = (Sink::start().await, Gate::start().await);
    enqueue(&schema, "fast", "f", 6, json!({})).await;
    enqueue(&schema, "slow", "s", 6, json!({})).await;
    let metrics = Arc::new(Metrics::new());
    let relay = relay(&schema, &sink, &gate, Settings { batch_size: 4, ..settings(LEASE) }, &metrics);

    let first = relay.try_execute_step().await.unwrap();
    assert_eq!((first.claimed, first.delivered), (8, 8), "{first:?}");
    assert_eq!((sink.count(), gate.arrived()), (4, 4), "four rows to each destination");
    assert_eq!(count(&schema, "state = 'leased'").await, 0, "every delivery recorded before the step returned");
    assert_eq!(count(&schema, "true").await, 4);
    let second = relay.try_execute_step().await.unwrap();
    assert_eq!((second.claimed, second.delivered), (4, 4), "{second:?}");
    assert_eq!(count(&schema, "true").await, 0);
    assert_eq!(relay.try_execute_step().await.unwrap(), Default::default(), "nothing left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_stops_at_its_byte_limit_and_takes_a_row_larger_than_any_limit_alone() {
    let schema = TestSchema::create().await;
    let db = schema.database(2);
    let destinations = ["big".to_string()];
    // Due order: the 5,000-byte row first, then three of about 1,000 bytes.
    enqueue(&schema, "big", "large", 1, json!({"blob": "x".repeat(5000)})).await;
    enqueue(&schema, "big", "small", 3, json!({"blob": "x".repeat(1000)})).await;

    let within = Limits { rows: 10, bytes: 2500, alone: false };
    let none = claim::claim_within(&db, &destinations, within, LEASE).await.unwrap();
    assert!(none.is_empty(), "the first due row does not fit, and nothing passes it");
    let alone = claim::claim_within(&db, &destinations, Limits { alone: true, ..within }, LEASE).await.unwrap();
    assert_eq!(alone.len(), 1, "taken alone: nothing else fits beside it");
    assert!(alone[0].payload.len() > 5000);

    let small = claim::claim_within(&db, &destinations, within, LEASE).await.unwrap();
    assert_eq!(small.len(), 2, "two rows of about 1,000 bytes fit in 2,500");
    assert!(small.iter().all(|row| row.payload.len() < 1100));
    let rows = claim::claim_within(&db, &destinations, Limits::rows(10), LEASE).await.unwrap();
    assert_eq!(rows.len(), 1, "the last one");
}

/// A relay serving no destination still does its housekeeping, until it is
/// stopped: an expired lease (of a relay that crashed mid-publish) comes
/// back while it runs, and `run` returns only once `stop` is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_destinations_keeps_its_housekeeping_until_stopped() {
    let fx = support::outbox::Fixture::start().await;
    fx.enqueue("orphaned", json!({}), None).await;
    assert_eq!(fx.claim(Duration::from_millis(200)).await.len(), 1, "a crashed relay's claim");
    let none = Destinations::new(&BTreeMap::new()).unwrap();
    let relay = Relay::new(fx.schema.database(2), none, BTreeMap::new(), settings(LEASE));
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(None, stop.clone()));
    let deadline = Instant::now() + PATIENCE;
    while fx.count("state = 'ready'").await == 0 {
        assert!(Instant::now() < deadline, "the reaper never returned the expired lease");
        assert!(!running.is_finished(), "the relay stopped on its own");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!running.is_finished(), "the relay stopped on its own");
    stop.cancel();
    tokio::time::timeout(PATIENCE, running).await.expect("stopped once asked").unwrap();
}

//! An outbox fixture: a migrated schema of the test's own, a recording
//! destination, and relays built against both.

use std::collections::BTreeMap;
use std::time::Duration;

use idemgate::config::{ConfigDuration, DestinationConfig};
use idemgate::outbox::claim;
use idemgate::outbox::enqueue::{Message, enqueue_in};
use idemgate::outbox::publisher::Destinations;
use idemgate::outbox::relay::{Outcome, Relay, Settings};
use idemgate::outbox::retry::RetryPolicy;
use idemgate::postgres::Database;

use tokio_util::sync::CancellationToken;

use super::postgres::TestSchema;
use super::sink::Sink;

/// The destination every fixture row goes to.
pub const DESTINATION: &str = "sink";

pub struct Fixture {
    pub schema: TestSchema,
    pub db: Database,
    pub sink: Sink,
    pub destination: DestinationConfig,
}

/// Settings for fast tests: short polls and reaps, a long lease unless changed.
pub fn settings(lease: Duration) -> Settings {
    Settings {
        lease,
        batch_size: 32,
        max_in_flight: 32,
        poll_interval: Duration::from_millis(50),
        reap_interval: Duration::from_millis(50),
        history_retention: Duration::from_secs(7 * 86_400),
        ..Settings::default()
    }
}

impl Fixture {
    pub async fn start() -> Self {
        let schema = TestSchema::create().await;
        let db = schema.database(4);
        let sink = Sink::start().await;
        let mut destination = DestinationConfig::new(sink.url());
        destination.timeout = ConfigDuration(Duration::from_secs(5));
        destination.backoff_base = ConfigDuration(Duration::from_millis(10));
        destination.backoff_max = ConfigDuration(Duration::from_millis(20));
        destination.max_attempts = 3;
        Self { schema, db, sink, destination }
    }

    pub fn publisher(&self) -> Destinations {
        Destinations::new(&BTreeMap::from([(DESTINATION.to_string(), self.destination.clone())])).unwrap()
    }

    pub fn policies(&self) -> BTreeMap<String, RetryPolicy> {
        BTreeMap::from([(DESTINATION.to_string(), RetryPolicy::from(&self.destination))])
    }

    /// A relay with its own pool.
    pub fn relay(&self, lease: Duration) -> Relay<Destinations> {
        Relay::new(self.schema.database(4), self.publisher(), self.policies(), settings(lease))
    }

    /// Enqueues one message in a transaction of its own and commits it.
    pub async fn enqueue(&self, business_key: &str, payload: serde_json::Value, ordering_key: Option<&str>) -> String {
        let mut message = Message::new(DESTINATION, "notify", business_key, &payload);
        message.ordering_key = ordering_key;
        self.enqueue_message(&message).await
    }

    /// Enqueues `message` in a transaction of its own and commits it.
    pub async fn enqueue_message(&self, message: &Message<'_>) -> String {
        let mut client = self.schema.connect().await;
        let tx = client.transaction().await.unwrap();
        let key = enqueue_in(&self.schema.schema, &tx, message).await.expect("enqueue");
        tx.commit().await.unwrap();
        key
    }

    /// Runs steps until one claims nothing and no row is backing off; bounded.
    pub async fn drain(&self, relay: &Relay<Destinations>) -> Outcome {
        let mut total = Outcome::default();
        for _ in 0..200 {
            let outcome = relay.try_execute_step().await.expect("step");
            total += outcome;
            if outcome.claimed == 0 {
                // Ready rows behind their ordering key's head wait for it, not for time.
                let heads = "state = 'ready' AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idemgate.outbox e
                    WHERE e.ordering_key = outbox.ordering_key AND e.ordering_seq < outbox.ordering_seq))";
                if self.count(heads).await == 0 {
                    return total;
                }
                // A retry is backing off: wait for time itself.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        panic!("the outbox did not drain in 200 steps");
    }

    /// Rows in the outbox matching a condition.
    pub async fn count(&self, condition: &str) -> i64 {
        let client = self.db.pool.get().await.unwrap();
        let sql = self.schema.sql(&format!("SELECT count(*) FROM idemgate.outbox WHERE {condition}"));
        client.query_one(&sql, &[]).await.unwrap().get(0)
    }

    /// Rows in the delivered history.
    pub async fn delivered(&self) -> i64 {
        let client = self.db.pool.get().await.unwrap();
        let sql = self.schema.sql("SELECT count(*) FROM idemgate.delivered");
        client.query_one(&sql, &[]).await.unwrap().get(0)
    }

    /// Runs the relay's production loop (`Relay::run`) until `condition`
    /// holds for some row (bounded), then stops it.
    pub async fn run_until(&self, condition: &str) {
        self.run_while(|| async { self.count(condition).await == 0 }, condition).await;
    }

    /// Runs the relay's production loop until `n` rows are delivered (bounded), then stops it.
    pub async fn run_until_delivered(&self, n: i64) {
        self.run_while(|| async { self.delivered().await < n }, &format!("{n} rows delivered")).await;
    }

    async fn run_while<F: Future<Output = bool>>(&self, pending: impl Fn() -> F, what: &str) {
        const PATIENCE: Duration = Duration::from_secs(60);
        let stop = CancellationToken::new();
        let running = tokio::spawn(self.relay(Duration::from_secs(30)).run(None, stop.clone()));
        let waited = tokio::time::timeout(PATIENCE, async {
            while pending().await {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        stop.cancel();
        running.await.expect("the relay ran");
        assert!(waited.is_ok(), "not within {PATIENCE:?}: {what}");
    }

    pub async fn claim(&self, lease: Duration) -> Vec<claim::Claimed> {
        claim::claim_batch(&self.db, &[DESTINATION.to_string()], 32, lease).await.unwrap()
    }
}

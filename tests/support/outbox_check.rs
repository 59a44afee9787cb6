//! The workload and the checker every outbox fault test shares.
//!
//! A [`Workload`] is a seeded plan: rows over many ordering keys (and some
//! without one), split into lanes, each ordering key wholly inside one lane.
//! [`enqueue`] runs the lanes side by side; a lane commits its rows in
//! order, one transaction per row, and retries a row — reconnecting — until
//! it commits, as a service would across a database outage (a retried
//! enqueue is a no-op if the first one did commit: same derived key). Each
//! commit is logged in a [`Ledger`], so per ordering key the ledger's order
//! is the commit order.
//!
//! [`check`] then holds three views against each other: the ledger (what
//! was committed), the database (the outbox and the delivered history) and
//! the [`Sink`] (every request the idempotent downstream received, how it
//! answered, which ones applied an effect). Once the relays are stopped, or
//! idle with the outbox settled ([`wait_until_settled`]), it asserts:
//!
//! 1. **None lost.** Every committed row is delivered (in the history *and*
//!    applied at the sink), or dead with a reason, or waiting behind a dead
//!    row of its own ordering key (blocked by design: order over progress).
//! 2. **Once per derived key.** Every request carries the derived key of the
//!    row its body belongs to; every repeat of a key is byte-identical to its
//!    first request; no business key is applied twice.
//! 3. **Per-key order.** Per ordering key, the rows applied at the sink are
//!    a prefix of the rows committed, in commit order.
//!
//! The [`Report`] carries the figures a test prints: raw requests,
//! acknowledgements and effects, repeats, dead and blocked rows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate::outbox::enqueue::{Message, derived_key, enqueue_in};
use idemgate::postgres::Schema;
use rand::prelude::*;
use serde_json::json;
use tokio_postgres::Client;

use super::sink::{Received, Sink};

/// The operation of every workload row (part of the derived key).
pub const OPERATION: &str = "notify";
/// How long one row may take to commit, outages included.
const ENQUEUE_PATIENCE: Duration = Duration::from_secs(60);
/// Pause before a failed enqueue is tried again.
const ENQUEUE_RETRY: Duration = Duration::from_millis(50);

/// `IDEMGATE_SEED` if set, else a fresh one; printed so a run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("IDEMGATE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    println!("{test}: IDEMGATE_SEED={seed}");
    seed
}

/// One message the workload enqueues.
#[derive(Debug, Clone)]
pub struct Row {
    pub destination: String,
    pub business_key: String,
    pub ordering_key: Option<String>,
    pub payload: serde_json::Value,
}

impl Row {
    /// The key every delivery of this row carries, from the outbox in `schema`.
    pub fn derived_key(&self, schema: &Schema) -> String {
        derived_key(schema, &self.destination, OPERATION, &self.business_key)
    }
}

/// Rows in lanes: each lane is committed in order by one enqueuer.
#[derive(Debug, Clone)]
pub struct Workload {
    pub lanes: Vec<Vec<Row>>,
}

impl Workload {
    /// `keys` ordering keys (`k00`, `k01`, …) of `per_key` rows each, plus
    /// `unordered` rows (`u:0`, …), over `destinations` (an ordering key's
    /// rows all go to one), spread over `lanes` lanes and interleaved at
    /// random; every payload names its business key (`bk`), and ordered
    /// rows their key and place (`key`, `seq`).
    pub fn new(seed: u64, destinations: &[&str], keys: usize, per_key: usize, unordered: usize, lanes: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut streams: Vec<Vec<Vec<Row>>> = vec![Vec::new(); lanes];
        for k in 0..keys {
            let key = format!("k{k:02}");
            let destination = destinations[k % destinations.len()];
            let rows = (0..per_key)
                .map(|seq| {
                    let business_key = format!("{key}:{seq}");
                    let payload = json!({"bk": business_key, "key": key, "seq": seq});
                    Row { destination: destination.into(), business_key, ordering_key: Some(key.clone()), payload }
                })
                .collect();
            streams[rng.random_range(0..lanes)].push(rows);
        }
        for i in 0..unordered {
            let business_key = format!("u:{i}");
            let payload = json!({"bk": business_key});
            let destination = destinations[i % destinations.len()].into();
            streams[rng.random_range(0..lanes)].push(vec![Row {
                destination,
                business_key,
                ordering_key: None,
                payload,
            }]);
        }
        // A random merge that keeps each stream's own order.
        let lanes = streams
            .into_iter()
            .map(|mut lane| {
                lane.iter_mut().for_each(|stream| stream.reverse());
                let mut merged = Vec::new();
                while !lane.is_empty() {
                    let pick = rng.random_range(0..lane.len());
                    merged.extend(lane[pick].pop());
                    if lane[pick].is_empty() {
                        lane.swap_remove(pick);
                    }
                }
                merged
            })
            .collect();
        Self { lanes }
    }

    /// Rows in all.
    pub fn len(&self) -> usize {
        self.lanes.iter().map(Vec::len).sum()
    }

    /// The row with this business key.
    pub fn row_mut(&mut self, business_key: &str) -> &mut Row {
        self.lanes.iter_mut().flatten().find(|r| r.business_key == business_key).expect("a row of the workload")
    }
}

/// What was committed, in commit order.
#[derive(Debug, Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<Row>>>);

impl Ledger {
    fn commit(&self, row: Row) {
        self.0.lock().unwrap().push(row);
    }

    /// Rows committed so far.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Waits (bounded, 60 s) until `n` rows are committed.
    pub async fn wait_for(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.len() < n {
            assert!(Instant::now() < deadline, "only {} of {n} rows committed", self.len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn rows(&self) -> Vec<Row> {
        self.0.lock().unwrap().clone()
    }
}

/// Commits every row of `workload` into the outbox at `url`/`schema`, lanes
/// side by side, pausing `pace` after each row; logs each commit in
/// `ledger`. Returns how many enqueue attempts failed and were retried.
pub async fn enqueue(url: &str, schema: &Schema, workload: &Workload, ledger: &Ledger, pace: Duration) -> usize {
    let mut lanes = tokio::task::JoinSet::new();
    for lane in workload.lanes.clone() {
        let (url, schema, ledger) = (url.to_owned(), schema.clone(), ledger.clone());
        lanes.spawn(async move {
            let mut client = None;
            let mut failures = 0;
            for row in lane {
                let deadline = Instant::now() + ENQUEUE_PATIENCE;
                while let Err(e) = enqueue_one(&mut client, &url, &schema, &row).await {
                    failures += 1;
                    client = None;
                    assert!(
                        Instant::now() < deadline,
                        "{} not enqueued within {ENQUEUE_PATIENCE:?}: {e}",
                        row.business_key
                    );
                    tokio::time::sleep(ENQUEUE_RETRY).await;
                }
                ledger.commit(row);
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
                }
            }
            failures
        });
    }
    lanes.join_all().await.into_iter().sum()
}

async fn enqueue_one(client: &mut Option<Client>, url: &str, schema: &Schema, row: &Row) -> Result<(), String> {
    let attempt = async {
        if client.is_none() {
            *client = Some(connect(url).await?);
        }
        let client = client.as_mut().ok_or("no client")?;
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        let mut message = Message::new(&row.destination, OPERATION, &row.business_key, &row.payload);
        message.ordering_key = row.ordering_key.as_deref();
        let key = enqueue_in(schema, &tx, &message).await.map_err(|e| e.to_string())?;
        // An error here leaves the outcome unknown; the retry is a no-op if it committed.
        tx.commit().await.map_err(|e| e.to_string())?;
        assert_eq!(key, row.derived_key(schema));
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), attempt).await.map_err(|_| "enqueue timed out".to_string())?
}

/// A connection (5 s connect timeout), driven in the background.
pub async fn connect(url: &str) -> Result<Client, String> {
    let mut endpoint = idemgate::postgres::Endpoint::parse(url).map_err(|e| e.to_string())?;
    endpoint.config.connect_timeout(Duration::from_secs(5));
    let (client, connection) = endpoint.connect().await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(client)
}

/// Rows the relays still have to act on: neither dead nor waiting behind a
/// dead row of their ordering key.
const UNSETTLED: &str = "
SELECT count(*) FROM idemgate.outbox o
 WHERE o.state <> 'dead'
   AND NOT EXISTS (SELECT 1 FROM idemgate.outbox d
                    WHERE d.state = 'dead' AND d.ordering_key = o.ordering_key AND d.ordering_seq < o.ordering_seq)";

/// Waits (bounded) until no row is left for the relays to act on,
/// reconnecting across outages. Nothing signals that to a test.
pub async fn wait_until_settled(url: &str, schema: &Schema, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut client = None;
    let mut last = String::from("never connected");
    loop {
        if client.is_none() {
            client = connect(url).await.ok();
        }
        if let Some(c) = &client {
            match c.query_one(&*schema.sql(UNSETTLED), &[]).await {
                Ok(row) if row.get::<_, i64>(0) == 0 => return,
                Ok(row) => last = format!("{} rows unsettled", row.get::<_, i64>(0)),
                Err(e) => {
                    last = e.to_string();
                    client = None;
                }
            }
        }
        assert!(Instant::now() < deadline, "the outbox did not settle within {limit:?}: {last}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The figures of one check.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Rows committed.
    pub rows: usize,
    /// Rows in the delivered history (each applied at the sink).
    pub delivered: usize,
    /// Dead rows (each with a reason).
    pub dead: usize,
    /// Rows waiting behind a dead row of their ordering key.
    pub blocked: usize,
    /// Requests the sink received.
    pub requests: usize,
    /// Requests it answered `2xx`.
    pub acknowledged: usize,
    /// Effects applied (first acknowledgement per key).
    pub effects: usize,
    /// The most requests one key received.
    pub most_requests_per_key: usize,
    /// What broke an invariant.
    pub violations: Vec<String>,
}

impl Report {
    /// Acknowledged repeats of a key already applied: the at-least-once
    /// duplicates the downstream absorbed.
    pub fn repeats(&self) -> usize {
        self.acknowledged - self.effects
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rows: {} delivered, {} dead, {} blocked; sink: {} requests ({} failed), {} acknowledged, \
             {} effects, {} repeats absorbed, at most {} requests for one key; {} violations",
            self.rows,
            self.delivered,
            self.dead,
            self.blocked,
            self.requests,
            self.requests - self.acknowledged,
            self.acknowledged,
            self.effects,
            self.repeats(),
            self.most_requests_per_key,
            self.violations.len()
        )
    }
}

struct OutboxRow {
    state: String,
    last_error: String,
    ordering_key: Option<String>,
    ordering_seq: Option<i64>,
}

/// [`verify`], failing the test on any violation. Call with the relays
/// stopped, or idle once the outbox has settled: a publish still in flight
/// would land after the sink was read.
pub async fn check(client: &Client, schema: &Schema, ledger: &Ledger, sink: &Sink) -> Report {
    check_received(client, schema, ledger, sink.received()).await
}

/// [`check`] over what several downstreams received, each list in its own
/// arrival order (an ordering key's rows all go to one destination).
pub async fn check_received(client: &Client, schema: &Schema, ledger: &Ledger, received: Vec<Received>) -> Report {
    let report = verify_received(client, schema, ledger, received).await;
    let shown: Vec<&String> = report.violations.iter().take(30).collect();
    assert!(report.violations.is_empty(), "{report}\n{shown:#?}");
    report
}

/// Holds the ledger, the database and the sink against each other.
pub async fn verify(client: &Client, schema: &Schema, ledger: &Ledger, sink: &Sink) -> Report {
    verify_received(client, schema, ledger, sink.received()).await
}

/// [`verify`] over what several downstreams received.
pub async fn verify_received(client: &Client, schema: &Schema, ledger: &Ledger, received: Vec<Received>) -> Report {
    let sql = "SELECT derived_key, state, coalesce(last_error, ''), ordering_key, ordering_seq FROM idemgate.outbox";
    let outbox: HashMap<String, OutboxRow> = client
        .query(&*schema.sql(sql), &[])
        .await
        .expect("read the outbox")
        .iter()
        .map(|r| {
            let row =
                OutboxRow { state: r.get(1), last_error: r.get(2), ordering_key: r.get(3), ordering_seq: r.get(4) };
            (r.get(0), row)
        })
        .collect();
    let history: HashSet<String> = client
        .query(&*schema.sql("SELECT derived_key FROM idemgate.delivered"), &[])
        .await
        .expect("read the history")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let committed = ledger.rows();
    let mut report = Report { rows: committed.len(), requests: received.len(), ..Report::default() };
    let violations = &mut report.violations;

    // Every request: a known key, the body of that key's row, identical repeats.
    let by_key: HashMap<String, &Row> = committed.iter().map(|r| (r.derived_key(schema), r)).collect();
    let mut first_body: HashMap<&str, &bytes::Bytes> = HashMap::new();
    let mut requests_per_key: HashMap<&str, usize> = HashMap::new();
    let mut applied_business_keys: HashMap<String, usize> = HashMap::new();
    let mut applied: HashSet<&str> = HashSet::new();
    for r in &received {
        *requests_per_key.entry(&r.key).or_default() += 1;
        report.acknowledged += usize::from((200..300).contains(&r.status));
        if r.effect {
            report.effects += 1;
            // By the body's business key: a message sent under two keys is applied twice.
            let business_key = r.payload["bk"].as_str().unwrap_or_default().to_owned();
            *applied_business_keys.entry(business_key).or_default() += 1;
        }
        let Some(row) = by_key.get(&r.key) else {
            violations.push(format!("a request with a key no committed row has: {:?}", r.key));
            continue;
        };
        if r.payload["bk"] != row.business_key.as_str() {
            violations.push(format!("key {} carried the body of {}", row.business_key, r.payload["bk"]));
        }
        let first = first_body.entry(&r.key).or_insert(&r.body);
        if **first != r.body {
            violations.push(format!("a repeat of {} differs from its first request", row.business_key));
        }
        if r.effect {
            applied.insert(&r.key);
        }
    }
    report.most_requests_per_key = requests_per_key.values().copied().max().unwrap_or(0);
    for (business_key, n) in applied_business_keys {
        if n > 1 {
            violations.push(format!("{business_key} applied {n} times"));
        }
    }

    // Every committed row: delivered, dead, or behind a dead head.
    let dead_before = |key: &str, seq: i64| {
        outbox.values().any(|o| {
            o.state == "dead" && o.ordering_key.as_deref() == Some(key) && o.ordering_seq.is_some_and(|s| s < seq)
        })
    };
    for row in &committed {
        let key = row.derived_key(schema);
        let name = &row.business_key;
        match (history.contains(&key), outbox.get(&key)) {
            (true, Some(_)) => violations.push(format!("{name} is both delivered and still in the outbox")),
            (true, None) if applied.contains(key.as_str()) => report.delivered += 1,
            (true, None) => violations.push(format!("{name} is recorded delivered but the sink never applied it")),
            (false, None) => violations.push(format!("{name} was committed and is gone: lost")),
            (false, Some(o)) if o.state == "dead" => {
                report.dead += 1;
                if o.last_error.is_empty() {
                    violations.push(format!("{name} is dead without a reason"));
                }
            }
            (false, Some(o)) => match (&o.ordering_key, o.ordering_seq) {
                (Some(k), Some(seq)) if o.state == "ready" && dead_before(k, seq) => report.blocked += 1,
                _ => violations.push(format!("{name} is still {} and nothing holds it back", o.state)),
            },
        }
        if applied.contains(key.as_str()) && !history.contains(&key) {
            violations.push(format!("{name} was applied at the sink but is not recorded delivered"));
        }
    }

    // Per ordering key: the applied rows are a prefix of the committed ones.
    let mut commit_order: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for row in &committed {
        if let Some(k) = &row.ordering_key {
            commit_order.entry(k).or_default().push(&row.business_key);
        }
    }
    let mut apply_order: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in received.iter().filter(|r| r.effect) {
        if let Some(row) = by_key.get(&r.key)
            && let Some(k) = &row.ordering_key
        {
            apply_order.entry(k).or_default().push(&row.business_key);
        }
    }
    for (k, committed) in &commit_order {
        let applied = apply_order.get(k).map(Vec::as_slice).unwrap_or_default();
        if !committed.starts_with(applied) {
            violations.push(format!("ordering key {k}: applied {applied:?}, committed {committed:?}"));
        }
    }
    report
}

//! Ordering: per ordering key, delivery follows commit order. Enqueuers of
//! one key are serialised, a failing head blocks only its own key, and four
//! relays sharing a backlog (one of them crashing) keep each key's order.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use idemgate::outbox::enqueue::{Message, enqueue_in};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::LEASE;
use crate::support::outbox::{DESTINATION, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_head_blocks_only_its_own_ordering_key() {
    let fx = Fixture::start().await;
    let a1 = fx.enqueue("a1", json!({"status": 503}), Some("a")).await;
    let a2 = fx.enqueue("a2", json!({}), Some("a")).await;
    let b1 = fx.enqueue("b1", json!({}), Some("b")).await;
    let b2 = fx.enqueue("b2", json!({}), Some("b")).await;
    let free = fx.enqueue("free", json!({}), None).await;
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.delivered, outcome.dead), (3, 1), "{outcome:?}");
    let order: Vec<String> = fx.sink.received().into_iter().map(|r| r.key).filter(|k| *k != a1).collect();
    assert!(order.contains(&free));
    let b_order: Vec<&String> = order.iter().filter(|k| **k == b1 || **k == b2).collect();
    assert_eq!(b_order, [&b1, &b2], "key b flows in order");
    assert_eq!(fx.sink.count_for(&a2), 0, "a dead head keeps holding its key");
    // Deleting (or redriving) the dead head releases the key.
    let client = fx.db.pool.get().await.unwrap();
    client.execute(&fx.schema.sql("DELETE FROM idemgate.outbox WHERE state = 'dead'"), &[]).await.unwrap();
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    assert_eq!(fx.sink.count_for(&a2), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueuers_of_one_ordering_key_are_serialised_so_delivery_follows_commit_order() {
    let fx = Fixture::start().await;
    let mut first = fx.schema.connect().await;
    let tx1 = first.transaction().await.unwrap();
    let p = json!({});
    let m1 = Message::new(DESTINATION, "notify", "rolled-back", &p).ordered_by("k");
    enqueue_in(&fx.schema.schema, &tx1, &m1).await.unwrap();
    // A second enqueuer of the same key waits for the first to finish.
    let schema = fx.schema.schema.clone();
    let mut second = fx.schema.connect().await;
    let second_pid: i32 = second.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let waiting = tokio::spawn(async move {
        let tx2 = second.transaction().await.unwrap();
        let p = json!({});
        let key = enqueue_in(&schema, &tx2, &Message::new(DESTINATION, "notify", "second", &p).ordered_by("k"))
            .await
            .unwrap();
        tx2.commit().await.unwrap();
        key
    });
    let probe = fx.schema.connect().await;
    let mut blocked = false;
    for _ in 0..500 {
        let sql = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1";
        let row = probe.query_one(sql, &[&second_pid]).await.unwrap();
        if row.get::<_, Option<String>>(0).as_deref() == Some("Lock") {
            blocked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(blocked, "the second enqueuer did not wait for the first");
    tx1.rollback().await.unwrap();
    let second_key = waiting.await.unwrap();
    let third_key = fx.enqueue("third", json!({}), Some("k")).await;
    fx.drain(&fx.relay(LEASE)).await;
    let keys: Vec<String> = fx.sink.received().into_iter().map(|r| r.key).collect();
    assert_eq!(keys, [second_key, third_key], "the rolled-back row left no gap that blocks the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
/// Four relays share 2,000 rows; one of them crashes (its task is dropped
/// mid-batch, like a killed process) after a quarter of the rows and a fifth
/// takes its place. Every row is delivered; the only duplicates are rows the
/// crashed relay held (at most its lane's places: `max_in_flight +
/// batch_size`, 64 here) and rows whose lease a starved relay lost (each
/// counted); per ordering key, first deliveries arrive in
/// commit order.
async fn four_relays_deliver_2000_rows_with_duplicates_only_from_a_crash_keeping_per_key_order() {
    const CRASH_LEASE: Duration = Duration::from_secs(1);
    const ORDERED_KEYS: usize = 10;
    const PER_KEY: usize = 100;
    const UNORDERED: usize = 1000;
    let fx = Fixture::start().await;
    let client = fx.schema.connect().await;
    let started = std::time::Instant::now();
    // Interleaved across keys, 100 rows per transaction, in a known order;
    // one statement per transaction (row-by-row round trips cost seconds).
    let bulk = fx.schema.sql(
        "SELECT count(idemgate.enqueue('sink', 'notify', 'row:' || i, jsonb_build_object('i', i, 'seq', seq, 'key', k), k))
           FROM unnest($1::int[], $2::int[], $3::text[]) AS t(i, seq, k)",
    );
    for chunk in 0..(ORDERED_KEYS * PER_KEY + UNORDERED) / 100 {
        let rows = chunk * 100..(chunk + 1) * 100;
        let ordered = |i: usize| i.is_multiple_of(2);
        let ids: Vec<i32> = rows.clone().map(|i| i as i32).collect();
        let seqs: Vec<i32> = rows.clone().map(|i| if ordered(i) { (i / 2 / ORDERED_KEYS) as i32 } else { 0 }).collect();
        let keys: Vec<Option<String>> =
            rows.map(|i| ordered(i).then(|| format!("k{}", (i / 2) % ORDERED_KEYS))).collect();
        client.query_one(&bulk, &[&ids, &seqs, &keys]).await.unwrap();
    }
    eprintln!("enqueued 2000 rows in {:?}", started.elapsed());
    let delivering = std::time::Instant::now();
    let stop = CancellationToken::new();
    // One set of metrics for all: a live relay starved past its lease (a
    // loaded machine) loses rows another relay then publishes too, and
    // counts each such loss.
    let metrics = std::sync::Arc::new(idemgate::metrics::Metrics::new());
    let start_relay = || {
        let listen = idemgate::postgres::Endpoint::parse(&fx.schema.url).unwrap();
        tokio::spawn(fx.relay(CRASH_LEASE).with_metrics(metrics.clone()).run(Some(listen), stop.clone()))
    };
    let mut relays: Vec<_> = (0..4).map(|_| start_relay()).collect();
    assert!(fx.sink.wait_for(500, Duration::from_secs(60)).await);
    let crashed = relays.remove(0);
    crashed.abort(); // no chance to record what it published or to release its leases
    let _ = crashed.await;
    relays.push(start_relay());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fx.count("true").await > 0 {
        assert!(std::time::Instant::now() < deadline, "{} rows left", fx.count("true").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("4 relays (one crashed) delivered 2000 rows in {:?}", delivering.elapsed());
    stop.cancel();
    for relay in relays {
        relay.await.unwrap();
    }
    let received = fx.sink.received();
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    let mut last_seq: BTreeMap<String, i64> = BTreeMap::new();
    for r in &received {
        let seen = per_key.entry(&r.key).or_default();
        *seen += 1;
        // A late duplicate from the crashed relay may arrive after its
        // successor; first deliveries must be in order.
        if let (1, Some(key)) = (*seen, r.payload["key"].as_str()) {
            let seq = r.payload["seq"].as_i64().unwrap();
            let previous = last_seq.insert(key.to_string(), seq).unwrap_or(-1);
            assert!(seq > previous, "key {key}: {seq} first delivered after {previous}");
        }
    }
    assert_eq!(per_key.len(), 2000, "every row delivered");
    let duplicates: usize = per_key.values().map(|n| n - 1).sum();
    eprintln!("duplicates after one crash: {duplicates}");
    let places = 32 + 32; // max_in_flight + batch_size of support::outbox::settings
    let lost = metrics.outbox_lease_lost.get() as usize;
    assert!(
        duplicates <= places + lost,
        "{duplicates} duplicates: more than the crashed relay could hold ({places}) and the {lost} leases lost"
    );
    assert_eq!((fx.count("true").await, fx.delivered().await), (0, 2000));
}

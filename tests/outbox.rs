//! The outbox relay against the real PostgreSQL: each test in a schema of
//! its own, publishing to a real HTTP destination on port 0 that records
//! what it receives. Most tests drive the relay one step at a time
//! (`try_execute_batch`); the waits that remain are for time itself (a
//! lease or a backoff running out) or bounded waits for an outcome.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use idemgate::outbox::claim;
use idemgate::outbox::enqueue::{Message, derived_key, enqueue_in};
use idemgate::outbox::publisher::{Attempt, Publisher};
use serde_json::json;
use support::outbox::{DESTINATION, Fixture};
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(30);
const SHORT_LEASE: Duration = Duration::from_millis(200);
const PAST_SHORT_LEASE: Duration = Duration::from_millis(350);

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
    assert_eq!(relay.try_execute_batch().await.unwrap().claimed, 0);
    assert_eq!(fx.count("true").await, 0);
    assert_eq!(fx.sink.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_lost_between_publish_and_mark_done_is_redelivered_under_the_same_key() {
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:3", json!({"n": 3}), None).await;
    // A relay claims and publishes, then dies before recording the delivery.
    let claimed = fx.claim(SHORT_LEASE).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(fx.publisher().publish(&claimed[0]).await, Attempt::Delivered);
    drop(claimed);
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let relay = fx.relay(LEASE);
    assert_eq!(relay.reap().await.unwrap(), 1, "the expired lease is returned");
    assert_eq!(fx.drain(&relay).await.delivered, 1);
    let keys: Vec<String> = fx.sink.received().into_iter().map(|r| r.key).collect();
    assert_eq!(keys, [key.clone(), key], "delivered twice, both times under the derived key");
    assert_eq!((fx.count("true").await, fx.delivered().await), (0, 1), "nothing lost, recorded once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_claim_after_its_lease_expired_changes_nothing() {
    let fx = Fixture::start().await;
    fx.enqueue("order:4", json!({}), None).await;
    let stale = fx.claim(SHORT_LEASE).await.remove(0);
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    assert_eq!(claim::reap_expired(&fx.db).await.unwrap(), 1);
    let current = fx.claim(LEASE).await.remove(0);
    assert_eq!(current.fence.attempts, stale.fence.attempts + 1, "attempts is the fence");
    assert!(!claim::renew(&fx.db, stale.fence, LEASE).await.unwrap(), "stale renew");
    assert!(!claim::complete(&fx.db, stale.fence).await.unwrap(), "stale complete");
    assert!(!claim::retry(&fx.db, stale.fence, Duration::ZERO, "x").await.unwrap(), "stale retry");
    assert!(!claim::bury(&fx.db, stale.fence, "x").await.unwrap(), "stale bury");
    assert_eq!(fx.count("state = 'leased'").await, 1, "the current claim still holds the row");
    assert!(claim::complete(&fx.db, current.fence).await.unwrap());
    assert_eq!(fx.delivered().await, 1);
}

/// One statement records a whole batch's deliveries, yet each row is still
/// fenced on its own claim: a stale fence in the batch changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_completion_records_only_the_claims_it_still_holds() {
    let fx = Fixture::start().await;
    fx.enqueue("order:5", json!({}), None).await;
    let stale = fx.claim(SHORT_LEASE).await.remove(0);
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    assert_eq!(claim::reap_expired(&fx.db).await.unwrap(), 1);
    fx.enqueue("order:6", json!({}), None).await;
    fx.enqueue("order:7", json!({}), None).await;
    let current = fx.claim(LEASE).await;
    assert_eq!(current.len(), 3, "the reaped row and the two new ones");
    assert!(claim::complete_batch(&fx.db, &[stale.fence]).await.unwrap().is_empty(), "a stale fence alone");
    assert_eq!(fx.count("state = 'leased'").await, 3, "the stale fence changed nothing");
    let mut fences: Vec<_> = current.iter().map(|c| c.fence).collect();
    fences.push(stale.fence);
    let done = claim::complete_batch(&fx.db, &fences).await.unwrap();
    let mut ids: Vec<i64> = done.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    let mut expected: Vec<i64> = current.iter().map(|c| c.fence.id).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "every current claim, and the stale one only once, under its current fence");
    assert_eq!(fx.count("true").await, 0);
    assert_eq!(fx.delivered().await, 3);
    // Completing again (a retried statement whose first try committed) finds nothing.
    assert!(claim::complete_batch(&fx.db, &fences).await.unwrap().is_empty());
}

/// The claim must walk the ready index in order even when the planner's
/// statistics are stale (see `outbox::connect_relay`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sessions_never_sort_so_a_claim_reads_only_the_rows_it_takes() {
    let fx = Fixture::start().await;
    let db = idemgate::outbox::connect_relay(&fx.schema.url, 2, fx.schema.schema.clone()).unwrap();
    let client = db.pool.get().await.unwrap();
    let setting: String = client.query_one("SHOW enable_sort", &[]).await.unwrap().get(0);
    assert_eq!(setting, "off");
    // A plan with a sort it cannot avoid then costs so much that it would be JIT-compiled on every claim.
    let jit: String = client.query_one("SHOW jit", &[]).await.unwrap().get(0);
    assert_eq!(jit, "off");
    let plain = fx.db.pool.get().await.unwrap();
    let setting: String = plain.query_one("SHOW enable_sort", &[]).await.unwrap().get(0);
    assert_eq!(setting, "on", "only the relay's sessions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_claims_keep_expiring_is_buried_once_its_attempts_are_used_up() {
    let fx = Fixture::start().await; // max_attempts = 3
    fx.enqueue("poison", json!({}), None).await;
    for _ in 0..3 {
        // A relay claims and dies without a result, three times over.
        assert_eq!(fx.claim(SHORT_LEASE).await.len(), 1);
        tokio::time::sleep(PAST_SHORT_LEASE).await;
        assert_eq!(claim::reap_expired(&fx.db).await.unwrap(), 1);
    }
    let outcome = fx.relay(LEASE).try_execute_batch().await.unwrap();
    assert_eq!((outcome.claimed, outcome.dead), (1, 1), "{outcome:?}");
    assert_eq!(fx.sink.count(), 0, "buried without a fourth publish");
    let dead = claim::list_dead(&fx.db, 10).await.unwrap();
    assert!(dead[0].last_error.as_deref().is_some_and(|e| e.contains("expired leases")), "{dead:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_publish_keeps_its_lease_by_renewing_it() {
    let fx = Fixture::start().await;
    fx.enqueue("order:5", json!({"delay_ms": 1500}), None).await;
    let slow = fx.relay(Duration::from_millis(600));
    let running = tokio::spawn(async move { slow.try_execute_batch().await.unwrap() });
    for _ in 0..500 {
        if fx.count("state = 'leased'").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another relay reaps and claims throughout the slow publish.
    let other = fx.relay(LEASE);
    while !running.is_finished() {
        other.reap().await.unwrap();
        assert_eq!(other.try_execute_batch().await.unwrap().claimed, 0, "the renewed lease was taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running.await.unwrap().delivered, 1);
    assert_eq!(fx.sink.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_is_dead_at_once_and_a_redrive_delivers_it() {
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:6", json!({"n": 6}), None).await;
    let relay = fx.relay(LEASE);
    fx.sink.fail_with(Some(422));
    let outcome = fx.drain(&relay).await;
    assert_eq!((outcome.claimed, outcome.dead), (1, 1), "{outcome:?}");
    let dead = claim::list_dead(&fx.db, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].derived_key, key);
    assert!(dead[0].last_error.as_deref().is_some_and(|e| e.starts_with("HTTP 422")), "{dead:?}");
    // The operator fixes the destination and redrives.
    fx.sink.fail_with(None);
    assert_eq!(claim::redrive(&fx.db, None).await.unwrap(), 1);
    assert_eq!(fx.drain(&relay).await.delivered, 1);
    assert!(claim::list_dead(&fx.db, 10).await.unwrap().is_empty());
    assert_eq!(fx.sink.count_for(&key), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_rows_are_listed_and_redriven_through_the_admin_api() {
    const TOKEN: &str = "outbox-admin-token-0123456789";
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:11", json!({"secret": "card"}), None).await;
    fx.sink.fail_with(Some(400));
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.dead, 1);
    let mut config = support::gateway::config(&fx.sink.url(), "memory://");
    config.admin.token = Some(idemgate::config::Secret::new(TOKEN));
    config.relay.database_url = Some(idemgate::config::ServiceUrl::new(fx.schema.url.clone()));
    config.relay.schema = fx.schema.name().to_string();
    let gateway = support::gateway::TestGateway::start(config).await;
    let bearer = format!("Bearer {TOKEN}");
    let admin = |method: &'static str, path: &'static str| gateway.admin(method, path).header("authorization", &bearer);

    let ready = gateway.admin("GET", "/readyz").send().await;
    assert_eq!((ready.status, ready.text().contains("\"database\":\"ok\"")), (200, true), "{}", ready.text());
    let listed = admin("GET", "/admin/outbox/dead?limit=10").send().await;
    assert_eq!(listed.status, 200);
    let rows: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(rows["rows"][0]["derived_key"], key);
    assert!(!listed.text().contains("card"), "payloads are never listed");
    let id = rows["rows"][0]["id"].as_i64().unwrap();
    assert_eq!(admin("GET", "/admin/outbox/dead?limit=0").send().await.status, 400);
    assert_eq!(admin("POST", "/admin/outbox/dead/x/redrive").send().await.status, 400);
    assert_eq!(admin("POST", "/admin/outbox/dead/999999/redrive").send().await.status, 404);
    assert_eq!(gateway.admin("POST", "/admin/outbox/redrive").send().await.status, 401, "bearer required");

    let path: &'static str = format!("/admin/outbox/dead/{id}/redrive").leak();
    let redriven = admin("POST", path).send().await;
    assert_eq!((redriven.status, redriven.text()), (200, "{\"redriven\":1}".to_string()));
    fx.sink.fail_with(None);
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    assert_eq!(admin("POST", "/admin/outbox/redrive").send().await.text(), "{\"redriven\":0}");
    assert_eq!(fx.sink.count_for(&key), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_is_retried_until_max_attempts_then_dead() {
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:7", json!({"status": 503}), None).await;
    let outcome = fx.drain(&fx.relay(LEASE)).await;
    assert_eq!((outcome.retried, outcome.dead), (2, 1), "{outcome:?}");
    assert_eq!(fx.sink.count_for(&key), 3, "max_attempts = 3");
    assert_eq!(fx.count("state = 'dead' AND attempts = 3").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_reports_attempts_latencies_and_backlog_in_metrics() {
    let fx = Fixture::start().await;
    fx.enqueue("fails", json!({"status": 503}), None).await;
    fx.enqueue("works", json!({}), None).await;
    let metrics = std::sync::Arc::new(idemgate::metrics::Metrics::new());
    let relay = fx.relay(LEASE).with_metrics(metrics.clone());
    fx.drain(&relay).await;
    relay.refresh_gauges().await.unwrap();
    let text = String::from_utf8(metrics.render()).unwrap();
    for line in [
        r#"idemgate_outbox_delivery_attempts_total{destination="sink",outcome="delivered"} 1"#,
        r#"idemgate_outbox_delivery_attempts_total{destination="sink",outcome="retried"} 2"#,
        r#"idemgate_outbox_delivery_attempts_total{destination="sink",outcome="dead"} 1"#,
        r#"idemgate_outbox_publish_duration_seconds_count{destination="sink"} 4"#,
        r#"idemgate_outbox_commit_to_delivery_seconds_count{destination="sink"} 1"#,
        r#"idemgate_outbox_rows{destination="sink",state="dead"} 1"#,
        r#"idemgate_outbox_rows{destination="sink",state="ready"} 0"#,
        r#"idemgate_outbox_oldest_ready_age_seconds{destination="sink"} 0"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_waits_at_least_that_long() {
    let mut fx = Fixture::start().await;
    fx.destination.backoff_max = idemgate::config::ConfigDuration(Duration::from_secs(60));
    fx.enqueue("order:8", json!({"status": 429, "retry_after": "30"}), None).await;
    let outcome = fx.relay(LEASE).try_execute_batch().await.unwrap();
    assert_eq!(outcome.retried, 1);
    // By the database clock: not due for (nearly) 30 s; a jittered backoff alone would be under 10 ms.
    assert_eq!(fx.count("state = 'ready' AND available_at > now() + interval '29 seconds'").await, 1);
    assert_eq!(fx.count("available_at > now() + interval '31 seconds'").await, 0);
}

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
/// batch_size`, 64 here); per ordering key, first deliveries arrive in
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
    let start_relay = || {
        let listen = idemgate::postgres::Endpoint::parse(&fx.schema.url).unwrap();
        tokio::spawn(fx.relay(CRASH_LEASE).run(Some(listen), stop.clone()))
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
    assert!(duplicates <= places, "{duplicates} duplicates: more than the crashed relay could hold");
    assert_eq!((fx.count("true").await, fx.delivered().await), (0, 2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_notifications_still_delivers_by_polling() {
    let fx = Fixture::start().await;
    let stop = CancellationToken::new();
    // No LISTEN at all: every notification is lost.
    let relay = tokio::spawn(fx.relay(LEASE).run(None, stop.clone()));
    let key = fx.enqueue("order:9", json!({}), None).await;
    assert!(fx.sink.wait_for(1, Duration::from_secs(10)).await, "polling delivered nothing");
    stop.cancel();
    relay.await.unwrap();
    assert_eq!(fx.sink.count_for(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_wakes_a_relay_long_before_its_next_poll() {
    let fx = Fixture::start().await;
    let mut settings = support::outbox::settings(LEASE);
    settings.poll_interval = Duration::from_secs(600);
    settings.reap_interval = Duration::from_secs(600);
    let relay = idemgate::outbox::relay::Relay::new(fx.schema.database(4), fx.publisher(), fx.policies(), settings);
    let stop = CancellationToken::new();
    let running =
        tokio::spawn(relay.run(Some(idemgate::postgres::Endpoint::parse(&fx.schema.url).unwrap()), stop.clone()));
    for n in 0..3 {
        fx.enqueue(&format!("wake:{n}"), json!({}), None).await;
        assert!(fx.sink.wait_for(n + 1, Duration::from_secs(30)).await, "no wake-up for row {n}");
    }
    stop.cancel();
    running.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_listen_connection_reconnects_and_wakes_the_relay_again() {
    let fx = Fixture::start().await;
    let mut settings = support::outbox::settings(LEASE);
    settings.poll_interval = Duration::from_secs(600);
    settings.reap_interval = Duration::from_secs(600);
    let relay = idemgate::outbox::relay::Relay::new(fx.schema.database(4), fx.publisher(), fx.policies(), settings);
    let application = format!("listen-{}", fx.schema.name());
    let mut listen = idemgate::postgres::Endpoint::parse(&fx.schema.url).unwrap();
    listen.config.application_name(&application);
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(Some(listen), stop.clone()));
    fx.enqueue("before", json!({}), None).await;
    assert!(fx.sink.wait_for(1, Duration::from_secs(30)).await, "no wake-up before the drop");
    // The database drops the LISTEN session (a restart, a proxy timeout...).
    let admin = fx.schema.connect().await;
    let kill = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1";
    let killed: i64 = admin.query_one(kill, &[&application]).await.unwrap().get(0);
    assert_eq!(killed, 1);
    fx.enqueue("after", json!({}), None).await;
    assert!(fx.sink.wait_for(2, Duration::from_secs(30)).await, "no wake-up after the drop");
    stop.cancel();
    running.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_retention_drops_whole_day_partitions() {
    let fx = Fixture::start().await;
    let client = fx.db.pool.get().await.unwrap();
    let setup = fx.schema.sql(
        "CREATE TABLE idemgate.delivered_20000101 PARTITION OF idemgate.delivered
             FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-02 00:00+00');
         INSERT INTO idemgate.delivered VALUES (1, 'k', 'd', 'o', 'b', NULL, NULL, 1, now(), '2000-01-01 12:00+00');",
    );
    client.batch_execute(&setup).await.unwrap();
    claim::maintain_history(&fx.db, Duration::from_secs(7 * 86_400)).await.unwrap();
    let partitions: Vec<String> = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1",
            &[&fx.schema.name()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!partitions.contains(&"delivered_20000101".to_string()), "{partitions:?}");
    assert!(partitions.len() >= 4, "default plus today and the next two days: {partitions:?}");
    assert_eq!(fx.delivered().await, 0);
}

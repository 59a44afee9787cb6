//! Set-based enqueue (`idemgate.enqueue_many`, `enqueue_many_in`): row by
//! row what `enqueue` means — once per derived key within a call and across
//! calls, nothing without the commit, per ordering key input order within a
//! call and commit order across transactions (also two transactions racing
//! on the same keys) — counted at the destination.

use std::collections::BTreeMap;
use std::time::Duration;

use idemgate::outbox::enqueue::{Message, derived_key, enqueue_in};
use idemgate::outbox::enqueue_many::enqueue_many_in;
use serde_json::{Value, json};

use crate::LEASE;
use crate::support::outbox::{DESTINATION, Fixture};

/// A row to enqueue: its business key and its ordering key.
type Row<'a> = (&'a str, Option<&'a str>);

/// The payload of each row: its business key, its ordering key and `tag`.
fn payloads(rows: &[Row<'_>], tag: &str) -> Vec<Value> {
    rows.iter().map(|(bk, key)| json!({"bk": bk, "key": key, "tag": tag})).collect()
}

fn messages<'a>(rows: &[Row<'a>], payloads: &'a [Value]) -> Vec<Message<'a>> {
    rows.iter()
        .zip(payloads)
        .map(|((bk, key), payload)| {
            let mut message = Message::new(DESTINATION, "notify", bk, payload);
            message.ordering_key = *key;
            message
        })
        .collect()
}

/// Enqueues `rows` in one call, in a transaction of its own, and commits.
async fn enqueue_committed(fx: &Fixture, rows: &[Row<'_>], tag: &str) -> Vec<String> {
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let payloads = payloads(rows, tag);
    let keys = enqueue_many_in(&fx.schema.schema, &tx, &messages(rows, &payloads)).await.expect("enqueue_many");
    tx.commit().await.unwrap();
    keys
}

/// Per ordering key, the business keys in the order they were first delivered.
fn delivered_per_key(fx: &Fixture) -> BTreeMap<String, Vec<String>> {
    let mut seen = std::collections::HashSet::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in fx.sink.received() {
        if let (true, Some(key)) = (seen.insert(r.key.clone()), r.payload["key"].as_str()) {
            order.entry(key.to_string()).or_default().push(r.payload["bk"].as_str().unwrap().to_string());
        }
    }
    order
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_repeated_within_one_call_or_across_calls_is_enqueued_and_delivered_once() {
    let fx = Fixture::start().await;
    let key = |bk: &str| derived_key(&fx.schema.schema, DESTINATION, "notify", bk);
    let first = enqueue_committed(&fx, &[("x", None), ("y", None), ("x", None)], "first").await;
    assert_eq!(first, [key("x"), key("y"), key("x")], "every key, in input order, as enqueue derives them");
    let second = enqueue_committed(&fx, &[("y", None), ("z", None)], "second").await;
    assert_eq!(second, [key("y"), key("z")]);
    assert_eq!(fx.count("true").await, 3, "x, y and z: one row each");
    let client = fx.db.pool.get().await.unwrap();
    // Ids follow the keys within a call, not the input: compared by business key.
    let tags = fx.schema.sql("SELECT business_key, payload->>'tag' FROM idemgate.outbox ORDER BY business_key");
    let rows: Vec<(String, String)> =
        client.query(&tags, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected = [("x", "first"), ("y", "first"), ("z", "second")].map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(rows, expected, "the first of each key wins");

    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 3);
    // Delivered keys stay no-ops, beside a new one in the same call.
    let third = enqueue_committed(&fx, &[("x", None), ("w", None), ("z", None)], "third").await;
    assert_eq!(third, [key("x"), key("w"), key("z")]);
    assert_eq!(fx.count("true").await, 1, "only w waits");
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1);
    for bk in ["x", "y", "z", "w"] {
        assert_eq!(fx.sink.count_for(&key(bk)), 1, "{bk} reached the destination once");
    }
    assert_eq!(fx.sink.effects(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_call_enqueues_nothing_and_holds_back_no_later_row() {
    let fx = Fixture::start().await;
    let mut client = fx.schema.connect().await;
    let tx = client.transaction().await.unwrap();
    let rows = [("a1", Some("a")), ("free", None), ("a2", Some("a"))];
    let payloads = payloads(&rows, "rolled back");
    enqueue_many_in(&fx.schema.schema, &tx, &messages(&rows, &payloads)).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(fx.count("true").await, 0);
    let owner = fx.db.pool.get().await.unwrap();
    let sequences = fx.schema.sql("SELECT count(*) FROM idemgate.ordering_keys");
    assert_eq!(owner.query_one(&sequences, &[]).await.unwrap().get::<_, i64>(0), 0, "no sequence row kept");

    let kept = enqueue_committed(&fx, &[("a1", Some("a")), ("a3", Some("a"))], "kept").await;
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 2);
    let received: Vec<String> = fx.sink.received().into_iter().map(|r| r.key).collect();
    assert_eq!(received, kept, "only the committed call, in order");
}

/// The call's numbers come after every number any of its keys handed out
/// before: here key `a` is far ahead of key `b` when a call mixes both, and
/// a later single-row enqueue of `b` must still come after that call's `b`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_ordering_keys_keep_input_order_within_a_call_and_commit_order_across_calls() {
    let fx = Fixture::start().await;
    let a_first: Vec<String> = (0..30).map(|i| format!("a{i}")).collect();
    let rows: Vec<Row> = a_first.iter().map(|bk| (bk.as_str(), Some("a"))).collect();
    enqueue_committed(&fx, &rows, "1").await;
    let mixed = [("b0", Some("b")), ("a30", Some("a")), ("free0", None), ("b1", Some("b")), ("a31", Some("a"))];
    enqueue_committed(&fx, &mixed, "2").await;
    fx.enqueue("b2", json!({"bk": "b2", "key": "b"}), Some("b")).await;
    enqueue_committed(&fx, &[("b3", Some("b")), ("free1", None), ("a32", Some("a"))], "3").await;

    fx.drain(&fx.relay(LEASE)).await;
    let order = delivered_per_key(&fx);
    let mut a_all = a_first.clone();
    a_all.extend(strings(&["a30", "a31", "a32"]));
    assert_eq!(order["a"], a_all);
    assert_eq!(order["b"], strings(&["b0", "b1", "b2", "b3"]));
    assert_eq!(fx.sink.count(), 30 + 5 + 1 + 3);
}

/// Two transactions on the same keys: the second call waits for the first
/// transaction, whose later call (after the second began) neither deadlocks
/// with it nor loses its place: per key, delivery is commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_on_shared_keys_wait_for_each_other_without_deadlock_in_commit_order() {
    let fx = Fixture::start().await;
    let mut first = fx.schema.connect().await;
    let tx1 = first.transaction().await.unwrap();
    let a1 = json!({"bk": "a1", "key": "a"});
    enqueue_in(&fx.schema.schema, &tx1, &Message::new(DESTINATION, "notify", "a1", &a1).ordered_by("a")).await.unwrap();

    let schema = fx.schema.schema.clone();
    let mut second = fx.schema.connect().await;
    let second_pid: i32 = second.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let waiting = tokio::spawn(async move {
        let tx2 = second.transaction().await.unwrap();
        // Input order b before a: the locks are still taken a before b.
        let rows = [("b2", Some("b")), ("a2", Some("a"))];
        let payloads = payloads(&rows, "second");
        let keys = enqueue_many_in(&schema, &tx2, &messages(&rows, &payloads)).await;
        tx2.commit().await.map(|()| keys)
    });
    assert!(waits_for_a_lock(&fx, second_pid).await, "the second call did not wait for the first transaction");
    // Had the second call locked b first, this would deadlock with it.
    let b1 = json!({"bk": "b1", "key": "b"});
    let b1_message = [Message::new(DESTINATION, "notify", "b1", &b1).ordered_by("b")];
    enqueue_many_in(&fx.schema.schema, &tx1, &b1_message).await.expect("no deadlock");
    tx1.commit().await.unwrap();
    waiting.await.unwrap().expect("the second transaction commits").expect("its call succeeds");

    fx.drain(&fx.relay(LEASE)).await;
    let order = delivered_per_key(&fx);
    assert_eq!(order["a"], strings(&["a1", "a2"]));
    assert_eq!(order["b"], strings(&["b1", "b2"]), "b1 committed first, though its call began later");
}

/// A call inserts its rows in the order of their keys (migration 8), not
/// of the input; in a call of 1,300 rows, with repeats, ordering keys and
/// a key already waiting, every rule of a small call still holds
/// — keys answered in input order, the first of a repeat wins within the
/// call and a key already waiting wins across calls, per ordering key
/// input order — and each key reaches the destination once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_large_enough_to_be_inserted_in_key_order_keeps_every_rule_of_a_small_one() {
    let fx = Fixture::start().await;
    let key = |bk: &str| derived_key(&fx.schema.schema, DESTINATION, "notify", bk);
    // 50 ordering keys (a relay step delivers one row of each), and every fourth row has none.
    let ordering: Vec<String> = (0..50).map(|k| format!("k{k}")).collect();
    let ordering_of = |i: usize| (i % 4 != 3).then(|| ordering[i % 50].as_str());
    enqueue_committed(&fx, &[("r7", Some("earlier"))], "earlier").await;
    let names: Vec<String> = (0..1200).map(|i| format!("r{i}")).collect();
    let mut rows: Vec<Row> = names.iter().enumerate().map(|(i, bk)| (bk.as_str(), ordering_of(i))).collect();
    // Repeats of the first 100 under another ordering key: all no-ops.
    rows.extend(names[..100].iter().map(|bk| (bk.as_str(), Some("repeat"))));
    let keys = enqueue_committed(&fx, &rows, "large").await;
    let expected: Vec<String> = rows.iter().map(|(bk, _)| key(bk)).collect();
    assert_eq!(keys, expected, "every key, in input order");
    assert_eq!(fx.count("true").await, 1200, "one row per business key, r7 the earlier one");
    assert_eq!(fx.count("ordering_key = 'repeat'").await, 0, "no repeat took a key");

    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 1200);
    let order = delivered_per_key(&fx);
    for key_name in &ordering {
        let in_input: Vec<String> = (0..1200)
            .filter(|&i| ordering_of(i) == Some(key_name.as_str()) && i != 7)
            .map(|i| names[i].clone())
            .collect();
        assert_eq!(order[key_name], in_input, "ordering key {key_name}: input order");
    }
    assert_eq!(order["earlier"], strings(&["r7"]));
    assert!(!order.contains_key("repeat"));
    for bk in &names {
        assert_eq!(fx.sink.count_for(&key(bk)), 1, "{bk} reached the destination once");
    }
    assert_eq!(fx.sink.effects(), 1200);
}

/// Until `pid`'s backend waits for a lock; false if it never does.
async fn waits_for_a_lock(fx: &Fixture, pid: i32) -> bool {
    let probe = fx.schema.connect().await;
    for _ in 0..500 {
        let sql = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1";
        let row = probe.query_one(sql, &[&pid]).await.unwrap();
        if row.get::<_, Option<String>>(0).as_deref() == Some("Lock") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// A call whose key another transaction holds, uncommitted, waits for it;
/// then it is a no-op for that key if the holder commits, and inserts it if
/// the holder rolls back; either way the rest of the call goes in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_key_another_transaction_holds_waits_then_skips_it_on_commit_and_takes_it_on_rollback() {
    let fx = Fixture::start().await;
    for (held, commit) in [("held-committed", true), ("held-rolled-back", false)] {
        let mut first = fx.schema.connect().await;
        let tx1 = first.transaction().await.unwrap();
        let holder = payloads(&[(held, None)], "holder");
        enqueue_many_in(&fx.schema.schema, &tx1, &messages(&[(held, None)], &holder)).await.unwrap();

        let schema = fx.schema.schema.clone();
        let mut second = fx.schema.connect().await;
        let second_pid: i32 = second.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
        let tag = format!("waiter of {held}");
        let (before, after) = (format!("before {held}"), format!("after {held}"));
        let waiting = tokio::spawn(async move {
            let tx2 = second.transaction().await.unwrap();
            let rows = [(before.as_str(), None), (held, None), (after.as_str(), None)];
            let payloads = payloads(&rows, &tag);
            let keys = enqueue_many_in(&schema, &tx2, &messages(&rows, &payloads)).await;
            tx2.commit().await.map(|()| keys)
        });
        assert!(waits_for_a_lock(&fx, second_pid).await, "the call did not wait for the holder of {held}");
        if commit {
            tx1.commit().await.unwrap()
        } else {
            tx1.rollback().await.unwrap()
        }
        let keys = waiting.await.unwrap().expect("the waiter commits").expect("its call succeeds");
        assert_eq!(keys.len(), 3);
    }
    assert_eq!(fx.count("true").await, 6, "two keys held and four around them, one row each");
    assert_eq!(fx.drain(&fx.relay(LEASE)).await.delivered, 6);
    let tags: BTreeMap<String, (usize, String)> = fx.sink.received().into_iter().fold(BTreeMap::new(), |mut m, r| {
        let bk = r.payload["bk"].as_str().unwrap().to_string();
        let tag = r.payload["tag"].as_str().unwrap().to_string();
        m.entry(bk).or_insert((0, tag)).0 += 1;
        m
    });
    let expected = [
        ("after held-committed", "waiter of held-committed"),
        ("after held-rolled-back", "waiter of held-rolled-back"),
        ("before held-committed", "waiter of held-committed"),
        ("before held-rolled-back", "waiter of held-rolled-back"),
        ("held-committed", "holder"),
        ("held-rolled-back", "waiter of held-rolled-back"),
    ]
    .map(|(bk, tag)| (bk.to_string(), (1, tag.to_string())));
    assert_eq!(tags, BTreeMap::from(expected), "each key delivered once, with the payload that took it");
}

/// Until `pid`'s backend waits for a lock or `call` has finished.
async fn waits_or_finishes<T>(fx: &Fixture, pid: i32, call: &tokio::task::JoinHandle<T>) {
    let probe = fx.schema.connect().await;
    for _ in 0..500 {
        let sql = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1";
        // No row: the call is over and its connection closed.
        let Some(row) = probe.query_opt(sql, &[&pid]).await.unwrap() else { return };
        if call.is_finished() || row.get::<_, Option<String>>(0).as_deref() == Some("Lock") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} neither waited for a lock nor finished");
}

/// Commits `rows` enqueued in one call on `client`, in a task; its backend's pid too.
async fn spawn_call(
    fx: &Fixture,
    rows: Vec<(String, Option<String>)>,
) -> (i32, tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>) {
    let schema = fx.schema.schema.clone();
    let mut client = fx.schema.connect().await;
    let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let call = tokio::spawn(async move {
        let tx = client.transaction().await?;
        let payload = json!({"set": true});
        let messages: Vec<Message> = rows
            .iter()
            .map(|(bk, key)| {
                let mut message = Message::new(DESTINATION, "notify", bk, &payload);
                message.ordering_key = key.as_deref();
                message
            })
            .collect();
        match enqueue_many_in(&schema, &tx, &messages).await {
            Ok(_) => tx.commit().await,
            Err(idemgate::outbox::OutboxError::Postgres(idemgate::postgres::PostgresError::Database(e))) => Err(e),
            Err(other) => panic!("enqueue_many: {other}"),
        }
    });
    (pid, call)
}

fn plain(keys: &[&str]) -> Vec<(String, Option<String>)> {
    keys.iter().map(|k| (k.to_string(), None)).collect()
}

/// The case: A holds x; B's call (a, x, b) waits for it; C's call
/// (b, a) comes next. In input order B held a and C held b, each then
/// waiting for the other once A committed: C failed with 40P01. In key
/// order both take a and b in one order, so one simply waits for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sharing_keys_in_opposite_orders_beside_a_holder_wait_instead_of_deadlocking() {
    let fx = Fixture::start().await;
    let mut holder = fx.schema.connect().await;
    let a = holder.transaction().await.unwrap();
    let x = json!({"bk": "x"});
    enqueue_in(&fx.schema.schema, &a, &Message::new(DESTINATION, "notify", "x", &x)).await.unwrap();
    let (b_pid, b) = spawn_call(&fx, plain(&["a", "x", "b"])).await;
    waits_or_finishes(&fx, b_pid, &b).await;
    assert!(!b.is_finished(), "B waits for A's x");
    let (c_pid, c) = spawn_call(&fx, plain(&["b", "a"])).await;
    waits_or_finishes(&fx, c_pid, &c).await;
    a.commit().await.unwrap();
    b.await.unwrap().expect("B commits");
    c.await.unwrap().expect("C commits: no deadlock");
    assert_eq!(fx.count("true").await, 3, "a, b and x, once each");
}

/// Fifty rounds of four calls on one set of keys, two in one order and two
/// in the other, beside two transactions holding one key each by
/// `enqueue` (with an ordering key), all let go at once: every transaction
/// commits, none is chosen as a deadlock's victim (40P01). (The calls have
/// no ordering keys: shared ones would queue the calls whole, before any
/// key, as a test above shows.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_and_single_enqueues_on_shared_keys_never_deadlock() {
    let fx = Fixture::start().await;
    const ROWS: usize = 300;
    for round in 0..50 {
        let rows: Vec<(String, Option<String>)> = (0..ROWS).map(|i| (format!("r{round}-{i}"), None)).collect();
        let reversed: Vec<_> = rows.iter().rev().cloned().collect();
        let held = |i: usize| vec![(rows[i].0.clone(), Some(format!("o{round}-{i}")))];
        // One message per holder, the rest one call each; all start together.
        let work: Vec<Vec<(String, Option<String>)>> =
            vec![held(ROWS / 4), held(3 * ROWS / 4), rows.clone(), reversed.clone(), rows, reversed];
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(work.len()));
        let mut calls = Vec::new();
        for messages in work {
            let (schema, start) = (fx.schema.schema.clone(), start.clone());
            let mut client = fx.schema.connect().await;
            calls.push(tokio::spawn(async move {
                let tx = client.transaction().await?;
                let payload = json!({"set": true});
                let messages: Vec<Message> = messages
                    .iter()
                    .map(|(bk, key)| {
                        let mut message = Message::new(DESTINATION, "notify", bk, &payload);
                        message.ordering_key = key.as_deref();
                        message
                    })
                    .collect();
                start.wait().await;
                let done = match &messages[..] {
                    [one] => enqueue_in(&schema, &tx, one).await.map(drop),
                    many => enqueue_many_in(&schema, &tx, many).await.map(drop),
                };
                match done {
                    Ok(()) => tx.commit().await,
                    Err(idemgate::outbox::OutboxError::Postgres(idemgate::postgres::PostgresError::Database(e))) => {
                        Err(e)
                    }
                    Err(other) => panic!("enqueue: {other}"),
                }
            }));
        }
        for call in calls {
            if let Err(e) = call.await.unwrap() {
                panic!("round {round}: {e} (SQLSTATE {:?})", e.code().map(|c| c.code()));
            }
        }
    }
    assert_eq!(fx.count("true").await, 50 * ROWS as i64, "every key once");
}

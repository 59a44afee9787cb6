//! Retention: a long-running outbox stays cheap. Delivered history is
//! dropped by whole day partitions, and relay sessions never sort, so a
//! claim reads only the rows it takes however stale the statistics. The
//! cleanup of idle ordering keys never waits for an enqueuer.

use std::time::Duration;

use idemgate::outbox::claim;

use crate::support::outbox::Fixture;

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

/// When `pid`'s backend started its current (or last) statement.
async fn query_start(fx: &Fixture, pid: i32) -> Option<String> {
    let probe = fx.schema.connect().await;
    let sql = "SELECT query_start::text FROM pg_stat_activity WHERE pid = $1";
    probe.query_opt(sql, &[&pid]).await.unwrap().and_then(|row| row.get(0))
}

/// Until `pid`'s backend, running `statement` (one started after `previous`,
/// its last statement's `query_start`, when given), waits for a lock or is
/// idle again (the statement over).
async fn blocked_or_done(fx: &Fixture, pid: i32, statement: &str, previous: Option<String>) {
    let probe = fx.schema.connect().await;
    for _ in 0..500 {
        let sql = "SELECT wait_event_type, state, query, query_start::text FROM pg_stat_activity WHERE pid = $1";
        let Some(row) = probe.query_opt(sql, &[&pid]).await.unwrap() else { return };
        let (wait, state, query, start): (Option<String>, Option<String>, Option<String>, Option<String>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        // Until the backend has taken `statement`, its idle state is its
        // previous statement's (a spawned call may not have started yet),
        // which may be the same statement once more: `previous` tells them apart.
        let started = query.is_some_and(|query| query.contains(statement)) && (previous.is_none() || start != previous);
        if started && (wait.as_deref() == Some("Lock") || state.as_deref() != Some("active")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} neither waited for a lock nor finished");
}

/// Retention deletes idle ordering keys' sequence rows. It used to lock
/// them in scan order and wait for one an enqueuer held while holding
/// another that enqueuer then wanted: the enqueuer's transaction (the
/// service's) was the deadlock's victim. Here the scan meets k2, k3, k1;
/// another transaction holds k3 while the enqueuer holds k1 and then asks
/// for k2. Retention now skips rows others hold and waits for none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_never_waits_for_an_ordering_key_an_enqueuer_holds() {
    use idemgate::outbox::enqueue::{Message, enqueue_in};
    let fx = Fixture::start().await;
    let owner = fx.schema.connect().await;
    let idle = "INSERT INTO idemgate.ordering_keys (ordering_key, last_seq, updated_at)
                VALUES ('k2', 5, now() - interval '2 days'), ('k3', 5, now() - interval '2 days'),
                       ('k1', 5, now() - interval '2 days')";
    owner.batch_execute(&fx.schema.sql(idle)).await.unwrap();
    let mut other = fx.schema.connect().await;
    let holder = other.transaction().await.unwrap();
    holder
        .batch_execute(&fx.schema.sql("SELECT 1 FROM idemgate.ordering_keys WHERE ordering_key = 'k3' FOR UPDATE"))
        .await
        .unwrap();

    let (schema, mut enqueuer) = (fx.schema.schema.clone(), fx.schema.connect().await);
    let enqueuer_pid: i32 = enqueuer.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let (first_done, first) = tokio::sync::oneshot::channel();
    let (go_on, second) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(async move {
        let tx = enqueuer.transaction().await?;
        let payload = serde_json::json!({});
        let message = |business_key, ordering_key| {
            Message::new(crate::support::outbox::DESTINATION, "notify", business_key, &payload).ordered_by(ordering_key)
        };
        let database_error = |error| match error {
            idemgate::outbox::OutboxError::Postgres(idemgate::postgres::PostgresError::Database(e)) => e,
            other => panic!("enqueue: {other}"),
        };
        enqueue_in(&schema, &tx, &message("a", "k1")).await.map_err(database_error)?;
        let _ = first_done.send(());
        let _ = second.await;
        enqueue_in(&schema, &tx, &message("b", "k2")).await.map_err(database_error)?;
        tx.commit().await
    });
    first.await.unwrap();

    let retention = fx.schema.connect().await;
    let retention_pid: i32 = retention.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let sql = fx.schema.sql("SELECT idemgate.maintain_history(interval '7 days')");
    let job = tokio::spawn(async move { retention.batch_execute(&sql).await });
    blocked_or_done(&fx, retention_pid, "maintain_history", None).await;
    // The enqueuer's last statement was an enqueue too (k1's): wait for the next.
    let previous = query_start(&fx, enqueuer_pid).await;
    go_on.send(()).unwrap();
    blocked_or_done(&fx, enqueuer_pid, "enqueue", previous).await;
    holder.commit().await.unwrap();
    job.await.unwrap().expect("retention runs");
    service.await.unwrap().expect("the service's transaction commits: no deadlock");
    let left = fx.schema.sql("SELECT ordering_key FROM idemgate.ordering_keys ORDER BY 1");
    let left: Vec<String> = owner.query(&left, &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(left, ["k1", "k2", "k3"], "k1 and k2 in use again, k3 skipped while held");
}

//! Retention: a long-running outbox stays cheap. Delivered history is
//! dropped by whole day partitions, and relay sessions never sort, so a
//! claim reads only the rows it takes however stale the statistics.

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

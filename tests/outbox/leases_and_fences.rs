//! Leases and fences: a claim is a lease, fenced by the row's attempt count.
//! A relay lost between publish and mark-done is redelivered under the same
//! key; a stale claim — alone or inside a batch completion — changes
//! nothing; a slow publish keeps its lease by renewing it; and a row whose
//! leases keep expiring is buried once its attempts are used up.

use std::time::Duration;

use idemgate::outbox::publisher::{Delivery, Publisher};
use idemgate::outbox::{claim, dead};
use serde_json::json;

use crate::support::outbox::Fixture;
use crate::{LEASE, PAST_SHORT_LEASE, SHORT_LEASE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_lost_between_publish_and_mark_done_is_redelivered_under_the_same_key() {
    let fx = Fixture::start().await;
    let key = fx.enqueue("order:3", json!({"n": 3}), None).await;
    // A relay claims and publishes, then dies before recording the delivery.
    let claimed = fx.claim(SHORT_LEASE).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(fx.publisher().publish(&claimed[0]).await, Delivery::Delivered);
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
    let outcome = fx.relay(LEASE).try_execute_step().await.unwrap();
    assert_eq!((outcome.claimed, outcome.dead), (1, 1), "{outcome:?}");
    assert_eq!(fx.sink.count(), 0, "buried without a fourth publish");
    let dead = dead::page(&fx.db, &dead::DeadQuery { destination: None, offset: 0, limit: 10 }).await.unwrap().rows;
    assert!(dead[0].last_error.as_deref().is_some_and(|e| e.contains("expired leases")), "{dead:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_publish_keeps_its_lease_by_renewing_it() {
    let fx = Fixture::start().await;
    fx.enqueue("order:5", json!({"delay_ms": 1500}), None).await;
    let slow = fx.relay(Duration::from_millis(600));
    let running = tokio::spawn(async move { slow.try_execute_step().await.unwrap() });
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
        assert_eq!(other.try_execute_step().await.unwrap().claimed, 0, "the renewed lease was taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running.await.unwrap().delivered, 1);
    assert_eq!(fx.sink.count(), 1);
}

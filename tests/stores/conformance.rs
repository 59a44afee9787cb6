//! The store conformance suite: one behavioural contract, every backend.
//!
//! Each case below is written once, generic over [`Store`], and checks one
//! clause of the contract in `src/store/mod.rs` against the decision table
//! (`decide`). `conformance_suite!` runs every case against:
//!
//! - `on_memory::<case>` — the embedded [`MemoryStore`];
//! - `on_redis::<case>` — [`RedisStore`] on the shared Redis (`REDIS_URL`),
//!   with a fresh key prefix per test;
//! - `on_postgres::<case>` — [`PostgresStore`] on the shared Postgres
//!   (`DATABASE_URL`), in a fresh schema per test;
//! - `on_redis_cluster::every_case_passes` — [`RedisStore`] on a private
//!   three-master Redis Cluster, started once and shared by all the cases.
//!
//! Every case uses keys drawn at random, so cases never see each other's
//! records. The cases about expiry sleep past a short lease or ttl: on
//! Redis and Postgres that waits for their clocks, which nothing could
//! signal; the memory store keeps tokio's time, so its cases run on a
//! paused clock and the sleeps pass at once.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use idemgate::idempotency::{Completion, Decision, Fence, Fingerprint, Record, ScopedKey, StoredResponse, decide};
use idemgate::store::memory::MemoryStore;
use idemgate::store::postgres::PostgresStore;
use idemgate::store::redis::RedisStore;
use idemgate::store::sealing::Sealer;
use idemgate::store::{Begin, Store, StoreError};
use support::postgres::TestSchema;
use support::redis_server::{RedisCluster, RedisProcess, shared_redis_url, unique_prefix, with_option};

/// A lease no case outlives.
const LEASE: Duration = Duration::from_secs(30);
/// A retention no case outlives.
const TTL: Duration = Duration::from_secs(60);
/// A lease or ttl a case waits out.
const SHORT: Duration = Duration::from_millis(300);
/// Long enough after [`SHORT`] for it to have run out by any clock.
const PAST_SHORT: Duration = Duration::from_millis(450);

fn fresh_key() -> ScopedKey {
    ScopedKey::from_digest(rand::random())
}

fn fresh_fingerprint() -> Fingerprint {
    Fingerprint(rand::random())
}

/// A response with everything a codec could get wrong: non-ASCII and empty
/// header values, a repeated header whose order matters, a binary body.
fn awkward_response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: [
            ("content-type", &b"application/json"[..]),
            ("x-repeated", b"first"),
            ("x-binary", b"\x80\xff\t\""),
            ("x-empty", b""),
            ("x-repeated", b"second"),
        ]
        .into_iter()
        .fold(HeaderMap::new(), |mut map, (name, value)| {
            map.append(name, HeaderValue::from_bytes(value).unwrap());
            map
        })
        .into(),
        body: (0..=255u8).cycle().take(70_000).collect::<Vec<u8>>().into(),
    }
}

/// Begins an attempt that must acquire the key.
async fn acquire<S: Store>(store: &S, key: &ScopedKey, fingerprint: &Fingerprint, lease: Duration) -> Fence {
    let fence = Fence::random();
    let begin = store.try_begin(key, fingerprint, fence, lease).await.expect("try_begin");
    assert!(matches!(begin, Begin::Acquired { .. }), "expected to acquire a free key, got {begin:?}");
    fence
}

/// Begins an attempt that must find a record, and returns it.
async fn existing<S: Store>(store: &S, key: &ScopedKey, fingerprint: &Fingerprint) -> Record {
    match store.try_begin(key, fingerprint, Fence::random(), LEASE).await.expect("try_begin") {
        Begin::Existing(record) => record,
        other => panic!("expected an existing record, got {other:?}"),
    }
}

async fn a_begin_on_a_fresh_key_acquires_it<S: Store>(store: Arc<S>) {
    let (key, fp, fence) = (fresh_key(), fresh_fingerprint(), Fence::random());
    assert_eq!(store.try_begin(&key, &fp, fence, LEASE).await.unwrap(), Begin::Acquired { took_over: false });
    match store.get(&key).await.unwrap() {
        Some(Record::InFlight { fingerprint, fence: held, .. }) => assert_eq!((fingerprint, held), (fp, fence)),
        other => panic!("expected the new attempt in flight, got {other:?}"),
    }
}

async fn a_second_begin_on_a_held_key_reports_it_in_flight<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let first = acquire(&*store, &key, &fp, LEASE).await;
    let record = existing(&*store, &key, &fp).await;
    let Record::InFlight { fingerprint, fence, lease_remaining } = record else {
        panic!("expected in flight, got {record:?}");
    };
    assert_eq!((fingerprint, fence), (fp, first), "the record is the first attempt's");
    assert!(!lease_remaining.is_zero() && lease_remaining <= LEASE, "lease_remaining {lease_remaining:?}");
    assert!(matches!(decide(&record, &fp), Decision::InFlight { .. }));
}

async fn another_fingerprint_on_an_in_flight_key_is_a_mismatch<S: Store>(store: Arc<S>) {
    let (key, fp, other) = (fresh_key(), fresh_fingerprint(), fresh_fingerprint());
    let first = acquire(&*store, &key, &fp, LEASE).await;
    let record = existing(&*store, &key, &other).await;
    assert!(matches!(record, Record::InFlight { fingerprint, fence, .. } if fingerprint == fp && fence == first));
    assert_eq!(decide(&record, &other), Decision::Mismatch);
    let after = store.get(&key).await.unwrap();
    assert!(
        matches!(after, Some(Record::InFlight { fingerprint, fence, .. }) if fingerprint == fp && fence == first),
        "the mismatching begin changed the record: {after:?}"
    );
    assert!(
        store.complete(&key, &fp, first, Completion::NotKept, TTL).await.unwrap(),
        "the first attempt still holds the key"
    );
}

async fn another_fingerprint_on_a_completed_key_is_a_mismatch<S: Store>(store: Arc<S>) {
    let (key, fp, other) = (fresh_key(), fresh_fingerprint(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&awkward_response()), TTL).await.unwrap());
    let record = existing(&*store, &key, &other).await;
    assert_eq!(*record.fingerprint(), fp);
    assert_eq!(decide(&record, &other), Decision::Mismatch);
    assert!(matches!(store.get(&key).await.unwrap(), Some(Record::Completed { .. })), "still completed");
}

async fn a_completed_key_replays_the_byte_identical_response<S: Store>(store: Arc<S>) {
    let (key, fp, response) = (fresh_key(), fresh_fingerprint(), awkward_response());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&response), TTL).await.unwrap());
    let expected = Record::Completed { fingerprint: fp, response: Some(response.clone()) };
    let record = existing(&*store, &key, &fp).await;
    assert_eq!(record, expected);
    assert_eq!(decide(&record, &fp), Decision::Replay(&response));
    assert_eq!(store.get(&key).await.unwrap(), Some(expected));
}

async fn an_empty_response_is_kept_as_a_response<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let empty = StoredResponse { status: 204, headers: Default::default(), body: Bytes::new() };
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&empty), TTL).await.unwrap());
    let record = existing(&*store, &key, &fp).await;
    assert_eq!(decide(&record, &fp), Decision::Replay(&empty), "an empty body is not a missing response");
}

async fn a_completion_without_a_response_is_not_replayable<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::NotKept, TTL).await.unwrap());
    let record = existing(&*store, &key, &fp).await;
    assert_eq!(record, Record::Completed { fingerprint: fp, response: None });
    assert_eq!(decide(&record, &fp), Decision::NotReplayable);
}

async fn an_unknown_outcome_holds_the_key_until_it_expires_or_is_purged<S: Store>(store: Arc<S>) {
    let (key, fp, other) = (fresh_key(), fresh_fingerprint(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Unknown, TTL).await.unwrap());
    let record = existing(&*store, &key, &fp).await;
    assert_eq!(record, Record::Unknown { fingerprint: fp });
    assert_eq!(decide(&record, &fp), Decision::OutcomeUnknown);
    assert_eq!(decide(&existing(&*store, &key, &other).await, &other), Decision::Mismatch);
    assert!(!store.release(&key, fence).await.unwrap(), "an unknown record is no longer in flight");
    assert!(!store.complete(&key, &fp, fence, Completion::NotKept, TTL).await.unwrap(), "nor completable again");
    assert_eq!(store.get(&key).await.unwrap(), Some(Record::Unknown { fingerprint: fp }));
    assert!(store.purge(&key).await.unwrap(), "an operator can purge it");
    acquire(&*store, &key, &fp, LEASE).await;
}

async fn a_wrong_fence_can_neither_renew_complete_nor_release<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    let wrong = Fence::random();
    assert!(!store.renew(&key, wrong, LEASE * 100).await.unwrap(), "renew");
    assert!(
        !store.complete(&key, &fp, wrong, Completion::Response(&awkward_response()), TTL).await.unwrap(),
        "complete"
    );
    assert!(!store.release(&key, wrong).await.unwrap(), "release");
    match store.get(&key).await.unwrap() {
        Some(Record::InFlight { fingerprint, fence: held, lease_remaining }) => {
            assert_eq!((fingerprint, held), (fp, fence));
            assert!(lease_remaining <= LEASE, "the wrong renew extended the lease to {lease_remaining:?}");
        }
        other => panic!("expected the record unchanged, got {other:?}"),
    }
}

async fn renew_and_release_on_a_missing_key_change_nothing<S: Store>(store: Arc<S>) {
    let key = fresh_key();
    let fence = Fence::random();
    assert!(!store.renew(&key, fence, LEASE).await.unwrap(), "renew");
    assert!(!store.release(&key, fence).await.unwrap(), "release");
    assert_eq!(store.get(&key).await.unwrap(), None, "no record was created");
}

/// The record of an attempt whose lease lapsed while the store was down
/// may be gone when the store returns (Redis expires it). Nobody took
/// over, since a takeover writes its own fence, and the upstream acted:
/// the completion creates the record, and the request is replayed.
async fn a_complete_that_finds_no_record_creates_the_completed_one<S: Store>(store: Arc<S>) {
    let (key, fp, response) = (fresh_key(), fresh_fingerprint(), awkward_response());
    let fence = Fence::random();
    assert!(store.complete(&key, &fp, fence, Completion::Response(&response), TTL).await.unwrap());
    let completed = Record::Completed { fingerprint: fp, response: Some(response.clone()) };
    assert_eq!(store.get(&key).await.unwrap(), Some(completed.clone()));
    assert_eq!(existing(&*store, &key, &fp).await, completed, "a retry replays it");
    let late = StoredResponse { status: 500, headers: Default::default(), body: Bytes::from_static(b"late") };
    let other = Fence::random();
    assert!(!store.complete(&key, &fp, other, Completion::Response(&late), TTL).await.unwrap(), "never overwritten");
    assert!(!store.release(&key, fence).await.unwrap(), "nor released");

    let (unknown, fp) = (fresh_key(), fresh_fingerprint());
    assert!(store.complete(&unknown, &fp, Fence::random(), Completion::Unknown, TTL).await.unwrap());
    assert_eq!(existing(&*store, &unknown, &fp).await, Record::Unknown { fingerprint: fp }, "an unknown outcome held");
}

/// The store was down past the lease, and came back before anyone took
/// over: the attempt's completion still lands.
async fn a_complete_after_its_lease_lapsed_lands_while_nobody_took_over<S: Store>(store: Arc<S>) {
    let (key, fp, response) = (fresh_key(), fresh_fingerprint(), awkward_response());
    let fence = acquire(&*store, &key, &fp, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert!(!store.renew(&key, fence, LEASE).await.unwrap(), "a lapsed lease is not renewed");
    assert!(store.complete(&key, &fp, fence, Completion::Response(&response), TTL).await.unwrap());
    let completed = Record::Completed { fingerprint: fp, response: Some(response) };
    assert_eq!(existing(&*store, &key, &fp).await, completed, "a retry replays it");
}

/// A lapsed attempt of another fence is refused, like a live one, while the
/// store holds it (Redis drops it a lease after the lapse).
async fn a_complete_under_another_fence_is_refused_even_after_the_lease_lapsed<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    acquire(&*store, &key, &fp, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    let other = Fence::random();
    assert!(!store.complete(&key, &fp, other, Completion::NotKept, TTL).await.unwrap(), "another fence");
    assert_eq!(store.get(&key).await.unwrap(), None, "the lapsed record is still no record");
    acquire(&*store, &key, &fp, LEASE).await;
}

async fn fenced_operations_on_a_completed_key_change_nothing<S: Store>(store: Arc<S>) {
    let (key, fp, response) = (fresh_key(), fresh_fingerprint(), awkward_response());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&response), TTL).await.unwrap());
    let other = StoredResponse { status: 500, headers: Default::default(), body: Bytes::from_static(b"late") };
    assert!(!store.complete(&key, &fp, fence, Completion::Response(&other), TTL).await.unwrap(), "a second complete");
    assert!(
        !store.complete(&key, &fp, fence, Completion::NotKept, TTL).await.unwrap(),
        "a second complete without a response"
    );
    assert!(!store.renew(&key, fence, LEASE).await.unwrap(), "renew");
    assert!(!store.release(&key, fence).await.unwrap(), "release");
    assert_eq!(store.get(&key).await.unwrap(), Some(Record::Completed { fingerprint: fp, response: Some(response) }));
}

async fn release_with_the_right_fence_deletes_and_the_next_begin_acquires<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.release(&key, fence).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert!(!store.release(&key, fence).await.unwrap(), "a second release finds nothing");
    acquire(&*store, &key, &fp, LEASE).await;
}

async fn a_stale_fence_cannot_complete_after_release_and_reacquire<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let stale = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.release(&key, stale).await.unwrap());
    let current = acquire(&*store, &key, &fp, LEASE).await;
    assert!(
        !store.complete(&key, &fp, stale, Completion::Response(&awkward_response()), TTL).await.unwrap(),
        "stale complete"
    );
    assert!(!store.renew(&key, stale, LEASE).await.unwrap(), "stale renew");
    assert!(!store.release(&key, stale).await.unwrap(), "stale release");
    assert!(matches!(store.get(&key).await.unwrap(), Some(Record::InFlight { fence, .. }) if fence == current));
    assert!(
        store.complete(&key, &fp, current, Completion::NotKept, TTL).await.unwrap(),
        "the current attempt completes"
    );
}

async fn an_expired_lease_is_taken_over_and_the_old_fence_is_dead<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let old = acquire(&*store, &key, &fp, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(store.get(&key).await.unwrap(), None, "an expired lease is the same as no record");
    let fence = Fence::random();
    let begin = store.try_begin(&key, &fp, fence, LEASE).await.unwrap();
    assert_eq!(begin, Begin::Acquired { took_over: true }, "the same request after a lapsed lease is a takeover");
    assert!(
        !store.complete(&key, &fp, old, Completion::Response(&awkward_response()), TTL).await.unwrap(),
        "old complete"
    );
    assert!(!store.release(&key, old).await.unwrap(), "old release");
    assert!(!store.renew(&key, old, LEASE).await.unwrap(), "old renew");
    assert!(store.complete(&key, &fp, fence, Completion::NotKept, TTL).await.unwrap(), "the new attempt completes");
}

async fn another_request_after_a_lapsed_lease_starts_afresh<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let old = acquire(&*store, &key, &fp, SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    let begin = store.try_begin(&key, &fresh_fingerprint(), Fence::random(), LEASE).await.unwrap();
    assert_eq!(begin, Begin::Acquired { took_over: false }, "a lapsed record is no record for another request");
    assert!(!store.renew(&key, old, LEASE).await.unwrap(), "old renew");
}

async fn renew_extends_a_live_lease<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, SHORT).await;
    assert!(store.renew(&key, fence, LEASE).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    let record = existing(&*store, &key, &fp).await;
    assert!(
        matches!(record, Record::InFlight { fence: held, lease_remaining, .. }
            if held == fence && lease_remaining > LEASE / 2),
        "expected the renewed lease still live, got {record:?}"
    );
}

async fn a_completed_record_expires_after_its_ttl<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&awkward_response()), SHORT).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(store.get(&key).await.unwrap(), None);
    acquire(&*store, &key, &fresh_fingerprint(), LEASE).await;
}

async fn get_reports_no_record_then_the_record_as_it_stands<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    assert_eq!(store.get(&key).await.unwrap(), None);
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    let Some(Record::InFlight { fingerprint, fence: held, lease_remaining }) = store.get(&key).await.unwrap() else {
        panic!("expected in flight");
    };
    assert_eq!((fingerprint, held), (fp, fence));
    assert!(!lease_remaining.is_zero() && lease_remaining <= LEASE);
    assert!(store.complete(&key, &fp, fence, Completion::NotKept, TTL).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), Some(Record::Completed { fingerprint: fp, response: None }));
    assert_eq!(store.get(&key).await.unwrap(), store.get(&key).await.unwrap(), "get changes nothing");
}

async fn purge_deletes_any_record_and_reports_whether_one_existed<S: Store>(store: Arc<S>) {
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    assert!(!store.purge(&key).await.unwrap(), "nothing to purge");
    let purged = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.purge(&key).await.unwrap(), "an in-flight record");
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert!(!store.release(&key, purged).await.unwrap(), "the purged attempt has nothing to release");
    let fence = acquire(&*store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&awkward_response()), TTL).await.unwrap());
    assert!(store.purge(&key).await.unwrap(), "a completed record");
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert!(!store.purge(&key).await.unwrap(), "already purged");
    acquire(&*store, &key, &fp, LEASE).await;
}

async fn exactly_one_of_many_concurrent_begins_acquires<S: Store>(store: Arc<S>) {
    const KEYS: usize = 8;
    const CONTENDERS: usize = 64;
    let keys: Vec<(ScopedKey, Fingerprint)> = (0..KEYS).map(|_| (fresh_key(), fresh_fingerprint())).collect();
    // Every contender waits at the barrier, so the begins really overlap.
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS * CONTENDERS));
    let mut tasks = tokio::task::JoinSet::new();
    for (index, (key, fp)) in keys.iter().copied().enumerate() {
        for _ in 0..CONTENDERS {
            let (store, barrier, fence) = (store.clone(), barrier.clone(), Fence::random());
            tasks.spawn(async move {
                barrier.wait().await;
                (index, fence, store.try_begin(&key, &fp, fence, LEASE).await.expect("try_begin"))
            });
        }
    }
    let mut winners = vec![Vec::new(); KEYS];
    let mut seen = vec![Vec::new(); KEYS];
    while let Some(joined) = tasks.join_next().await {
        let (index, fence, begin) = joined.expect("contender task");
        match begin {
            Begin::Acquired { .. } => winners[index].push(fence),
            Begin::Existing(Record::InFlight { fence: held, .. }) => seen[index].push(held),
            other => panic!("unexpected {other:?}"),
        }
    }
    for (index, winners) in winners.iter().enumerate() {
        assert_eq!(winners.len(), 1, "key {index}: {} contenders acquired", winners.len());
        assert!(seen[index].iter().all(|held| *held == winners[0]), "key {index}: losers saw another holder");
        assert_eq!(seen[index].len(), CONTENDERS - 1);
    }
}

async fn ping_answers<S: Store>(store: Arc<S>) {
    store.ping().await.expect("ping");
}

/// Runs every case against every backend (see the module docs).
macro_rules! conformance_suite {
    ($($case:ident),* $(,)?) => {
        mod on_memory {
            use super::*;
            $(
                // The embedded store keeps tokio's time: its expiry cases
                // run on a paused clock, which jumps over their sleeps.
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::$case(Arc::new(MemoryStore::default())).await;
                }
            )*
        }

        mod on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(shared_redis_store().await).await;
                }
            )*
        }

        mod on_postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let schema = TestSchema::create().await;
                    let url = schema.store_url();
                    let store = PostgresStore::open(&url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
                    super::$case(Arc::new(store)).await;
                }
            )*
        }

        mod on_redis_cluster {
            use super::*;

            /// One cluster for all cases: starting one costs about a second.
            /// Its store seals responses at rest, so sealing meets every case too.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn every_case_passes_with_sealed_responses() {
                let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("start the cluster");
                let url = cluster.url();
                let sealer = Sealer::from_spec(SEALING_KEYS).expect("test keys");
                let store = RedisStore::open(&url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
                let store = Arc::new(store.sealed(Some(Arc::new(sealer))));
                $(
                    eprintln!("case {}", stringify!($case));
                    super::$case(store.clone()).await;
                )*
            }
        }
    };
}

conformance_suite! {
    a_begin_on_a_fresh_key_acquires_it,
    a_second_begin_on_a_held_key_reports_it_in_flight,
    another_fingerprint_on_an_in_flight_key_is_a_mismatch,
    another_fingerprint_on_a_completed_key_is_a_mismatch,
    a_completed_key_replays_the_byte_identical_response,
    an_empty_response_is_kept_as_a_response,
    a_completion_without_a_response_is_not_replayable,
    an_unknown_outcome_holds_the_key_until_it_expires_or_is_purged,
    a_wrong_fence_can_neither_renew_complete_nor_release,
    renew_and_release_on_a_missing_key_change_nothing,
    a_complete_that_finds_no_record_creates_the_completed_one,
    a_complete_after_its_lease_lapsed_lands_while_nobody_took_over,
    a_complete_under_another_fence_is_refused_even_after_the_lease_lapsed,
    fenced_operations_on_a_completed_key_change_nothing,
    release_with_the_right_fence_deletes_and_the_next_begin_acquires,
    a_stale_fence_cannot_complete_after_release_and_reacquire,
    an_expired_lease_is_taken_over_and_the_old_fence_is_dead,
    another_request_after_a_lapsed_lease_starts_afresh,
    renew_extends_a_live_lease,
    a_completed_record_expires_after_its_ttl,
    get_reports_no_record_then_the_record_as_it_stands,
    purge_deletes_any_record_and_reports_whether_one_existed,
    exactly_one_of_many_concurrent_begins_acquires,
    ping_answers,
}

const SEALING_KEYS: &str = "test:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// A store on the shared Redis whose keys no other test sees.
async fn shared_redis_store() -> Arc<RedisStore> {
    let url = with_option(&shared_redis_url(), "prefix", &unique_prefix());
    let store = RedisStore::open(&url).await.unwrap_or_else(|e| panic!("shared Redis at {url} (set REDIS_URL): {e}"));
    Arc::new(store)
}

/// A store opened while its server was up sees it go down as an error
/// within the store timeout, and works again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_reports_an_outage_within_its_timeout_and_recovers() {
    const TIMEOUT: Duration = Duration::from_millis(500);
    let mut server = tokio::task::spawn_blocking(RedisProcess::start).await.expect("start redis-server");
    let store = RedisStore::open(&with_option(&server.url(), "timeout", "500ms")).await.expect("open");
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    acquire(&store, &key, &fp, LEASE).await;

    tokio::task::block_in_place(|| server.stop());
    let started = Instant::now();
    let outcome = store.try_begin(&fresh_key(), &fp, Fence::random(), LEASE).await;
    let elapsed = started.elapsed();
    assert!(matches!(outcome, Err(StoreError::Unavailable(_) | StoreError::Timeout)), "while down: {outcome:?}");
    // The timeout bounds the call; the slack is for scheduling, not retries.
    assert!(elapsed < TIMEOUT * 2, "try_begin took {elapsed:?} with a {TIMEOUT:?} store timeout");
    assert!(store.ping().await.is_err(), "ping while down");

    tokio::task::block_in_place(|| server.start_again());
    // The connection manager reconnects in the background; give it a
    // bounded number of tries rather than a fixed time.
    let mut recovered = false;
    for _ in 0..50 {
        if store.ping().await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the store did not recover after the server came back");
    // The restarted server is empty (no persistence), and scripts load again.
    let fence = acquire(&store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&awkward_response()), TTL).await.unwrap());
    assert!(matches!(existing(&store, &key, &fp).await, Record::Completed { response: Some(_), .. }));
}

/// A store opened while its server is down opens all the same, fails every
/// call until the server answers, and then works from the first call on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_opens_while_its_server_is_down_and_works_once_it_returns() {
    let mut server = tokio::task::spawn_blocking(RedisProcess::start).await.expect("start redis-server");
    tokio::task::block_in_place(|| server.stop());
    let store = RedisStore::open(&with_option(&server.url(), "timeout", "500ms")).await.expect("opens while down");
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    for _ in 0..3 {
        let outcome = store.try_begin(&key, &fp, Fence::random(), LEASE).await;
        assert!(matches!(outcome, Err(StoreError::Unavailable(_))), "while down: {outcome:?}");
        assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))), "ping while down");
    }
    // The outage outlasts the reconnect the last call started (two refused
    // connects and at most 500 ms between them), as a real one does: that
    // attempt has failed for good when the server returns. Nothing signals
    // its end, so this waits for time itself.
    tokio::time::sleep(Duration::from_millis(700)).await;

    tokio::task::block_in_place(|| server.start_again());
    store.ping().await.expect("the first ping after the server returns connects");
    let fence = acquire(&store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&awkward_response()), TTL).await.unwrap());
    assert!(matches!(existing(&store, &key, &fp).await, Record::Completed { response: Some(_), .. }));
}

/// The same for a cluster whose every node is down when the store opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_opens_while_every_node_is_down_and_works_once_the_cluster_is_up() {
    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("start the cluster");
    tokio::task::block_in_place(|| cluster.stop());
    let store = RedisStore::open(&with_option(&cluster.url(), "timeout", "500ms")).await.expect("opens while down");
    let (key, fp) = (fresh_key(), fresh_fingerprint());
    let outcome = store.try_begin(&key, &fp, Fence::random(), LEASE).await;
    assert!(matches!(outcome, Err(StoreError::Unavailable(_))), "while down: {outcome:?}");
    assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))), "ping while down");

    tokio::task::block_in_place(|| cluster.start_again());
    store.ping().await.expect("the first ping after the cluster is up connects");
    let fence = acquire(&store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&awkward_response()), TTL).await.unwrap());
    assert!(matches!(existing(&store, &key, &fp).await, Record::Completed { response: Some(_), .. }));
}

/// A third of the keys live on each master: with one of them dead the
/// cluster is not ready, although the other two still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_master_down_does_not_answer_ping() {
    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("start the cluster");
    let store = RedisStore::open(&with_option(&cluster.url(), "timeout", "500ms")).await.expect("open");
    store.ping().await.expect("ping with every master up");
    tokio::task::block_in_place(|| cluster.stop_node(1));
    let outcome = store.ping().await;
    let dead = format!("127.0.0.1:{}", cluster.port(1));
    assert!(
        matches!(&outcome, Err(e @ StoreError::Unavailable(_)) if e.to_string().contains(&dead)),
        "one master down names it: {outcome:?}"
    );
    tokio::task::block_in_place(|| cluster.start_again());
    store.ping().await.expect("ping once the master is back");
}

/// What cannot work is refused at open, before any connection is tried.
#[tokio::test]
async fn a_redis_url_that_cannot_work_fails_at_open() {
    for url in [
        "redis://127.0.0.1:1/0?prefix={x}",
        "redis://127.0.0.1:1/0?timeout=soon",
        "redis://127.0.0.1:1/0?ca_file=/nonexistent/ca.pem",
        "redis://127.0.0.1:1/notadb",
        "redis+cluster://",
        "redis+cluster://127.0.0.1:1?timeout=soon",
    ] {
        let opened = RedisStore::open(url).await;
        assert!(matches!(opened, Err(StoreError::InvalidUrl(_))), "{url}: {:?}", opened.err());
    }
}

/// With encryption keys, the Postgres store keeps responses sealed at rest
/// (the cluster run covers sealing against every case; this looks at the row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_with_keys_keeps_responses_sealed_at_rest() {
    let schema = TestSchema::create().await;
    let sealer = Arc::new(Sealer::from_spec(SEALING_KEYS).expect("test keys"));
    let store = PostgresStore::open(&schema.store_url()).await.expect("open").sealed(Some(sealer));
    let (key, fp, response) = (fresh_key(), fresh_fingerprint(), awkward_response());
    let fence = acquire(&store, &key, &fp, LEASE).await;
    assert!(store.complete(&key, &fp, fence, Completion::Response(&response), TTL).await.unwrap());
    let client = schema.connect().await;
    let sql = schema.sql("SELECT response FROM idemgate.gateway_keys WHERE key = $1");
    let stored: Vec<u8> = client.query_one(&sql, &[&&key.as_bytes()[..]]).await.unwrap().get(0);
    assert_eq!(stored[0], idemgate::store::sealing::SEALED);
    assert!(!stored.windows(16).any(|w| w == &response.body[..16]), "the body is not in the clear");
    assert_eq!(existing(&store, &key, &fp).await, Record::Completed { fingerprint: fp, response: Some(response) });
}

/// `tenant_quota`: the cases below run on stores opened with [`QUOTA`] by
/// `quota_suite!` (every backend), each with tenants drawn at random.
mod quota {
    use super::*;
    use idemgate::config::TenantQuota;
    use idemgate::idempotency::TenantId;
    use idemgate::store::QuotaLimit;

    /// Live keys a tenant may hold in these cases.
    pub const MAX_KEYS: u64 = 4;
    /// Stored bytes a tenant may hold: more than one [`awkward_response`], less than two.
    pub const MAX_BYTES: u64 = 100_000;
    pub const QUOTA: TenantQuota = TenantQuota { max_keys: MAX_KEYS, max_bytes: MAX_BYTES };

    fn fresh_tenant() -> TenantId {
        TenantId(rand::random())
    }

    fn key_of(tenant: TenantId) -> ScopedKey {
        ScopedKey::from_parts(tenant, rand::random())
    }

    async fn over_quota<S: Store>(store: &S, key: &ScopedKey) -> QuotaLimit {
        match store.try_begin(key, &fresh_fingerprint(), Fence::random(), LEASE).await.expect("try_begin") {
            Begin::OverQuota(limit) => limit,
            other => panic!("expected the tenant over its quota, got {other:?}"),
        }
    }

    pub async fn a_tenant_at_max_keys_is_refused_new_keys_only<S: Store>(store: Arc<S>) {
        let (tenant, fp) = (fresh_tenant(), fresh_fingerprint());
        let keys: Vec<ScopedKey> = (0..MAX_KEYS).map(|_| key_of(tenant)).collect();
        let mut fences = Vec::new();
        for key in &keys {
            fences.push(acquire(&*store, key, &fp, LEASE).await);
        }
        let response =
            StoredResponse { status: 200, headers: HeaderMap::new().into(), body: Bytes::from_static(b"ok") };
        assert!(store.complete(&keys[0], &fp, fences[0], Completion::Response(&response), TTL).await.unwrap());

        assert_eq!(over_quota(&*store, &key_of(tenant)).await, QuotaLimit::Keys);
        assert_eq!(store.get(&keys[0]).await.unwrap().map(|r| matches!(r, Record::Completed { .. })), Some(true));
        // Its replays and its attempts in flight are decided as ever.
        assert!(matches!(existing(&*store, &keys[0], &fp).await, Record::Completed { response: Some(_), .. }));
        assert!(matches!(existing(&*store, &keys[1], &fp).await, Record::InFlight { .. }));
        assert!(store.renew(&keys[2], fences[2], LEASE).await.unwrap(), "renew in quota");
        assert!(
            store.complete(&keys[1], &fp, fences[1], Completion::Response(&response), TTL).await.unwrap(),
            "a completion is never refused"
        );
        // Another tenant is not counted with it.
        acquire(&*store, &key_of(fresh_tenant()), &fp, LEASE).await;
        // A release gives a place back.
        assert!(store.release(&keys[3], fences[3]).await.unwrap());
        acquire(&*store, &key_of(tenant), &fp, LEASE).await;
        assert_eq!(over_quota(&*store, &key_of(tenant)).await, QuotaLimit::Keys);
    }

    pub async fn expiry_and_purge_give_a_tenant_its_keys_back<S: Store>(store: Arc<S>) {
        let (tenant, fp) = (fresh_tenant(), fresh_fingerprint());
        let keys: Vec<ScopedKey> = (0..MAX_KEYS).map(|_| key_of(tenant)).collect();
        for key in &keys {
            let fence = acquire(&*store, key, &fp, LEASE).await;
            assert!(store.complete(key, &fp, fence, Completion::NotKept, SHORT).await.unwrap());
        }
        assert_eq!(over_quota(&*store, &key_of(tenant)).await, QuotaLimit::Keys);
        tokio::time::sleep(PAST_SHORT).await;
        for _ in 0..MAX_KEYS - 1 {
            acquire(&*store, &key_of(tenant), &fp, LEASE).await;
        }
        let last = key_of(tenant);
        acquire(&*store, &last, &fp, LEASE).await;
        assert_eq!(over_quota(&*store, &key_of(tenant)).await, QuotaLimit::Keys);
        assert!(store.purge(&last).await.unwrap());
        acquire(&*store, &key_of(tenant), &fp, LEASE).await;
    }

    pub async fn a_tenant_past_max_bytes_is_refused_new_keys_and_its_completions_still_land<S: Store>(store: Arc<S>) {
        let (tenant, fp, response) = (fresh_tenant(), fresh_fingerprint(), awkward_response());
        let (first, second) = (key_of(tenant), key_of(tenant));
        let first_fence = acquire(&*store, &first, &fp, LEASE).await;
        let second_fence = acquire(&*store, &second, &fp, LEASE).await;
        assert!(store.complete(&first, &fp, first_fence, Completion::Response(&response), TTL).await.unwrap());
        // About 70 kB held of 100 kB: a new key still fits.
        let third = key_of(tenant);
        acquire(&*store, &third, &fp, LEASE).await;
        // This one takes the tenant past max_bytes, and lands all the same.
        assert!(store.complete(&second, &fp, second_fence, Completion::Response(&response), TTL).await.unwrap());
        assert_eq!(
            existing(&*store, &second, &fp).await,
            Record::Completed { fingerprint: fp, response: Some(response) }
        );
        assert_eq!(over_quota(&*store, &key_of(tenant)).await, QuotaLimit::Bytes);
        assert!(store.purge(&first).await.unwrap());
        acquire(&*store, &key_of(tenant), &fp, LEASE).await;
    }

    pub async fn expired_responses_give_a_tenant_its_bytes_back<S: Store>(store: Arc<S>) {
        let (tenant, fp, response) = (fresh_tenant(), fresh_fingerprint(), awkward_response());
        for _ in 0..2 {
            let key = key_of(tenant);
            let fence = acquire(&*store, &key, &fp, LEASE).await;
            assert!(store.complete(&key, &fp, fence, Completion::Response(&response), SHORT).await.unwrap());
        }
        assert_eq!(over_quota(&*store, &key_of(tenant)).await, QuotaLimit::Bytes);
        tokio::time::sleep(PAST_SHORT).await;
        acquire(&*store, &key_of(tenant), &fp, LEASE).await;
    }

    pub async fn concurrent_first_requests_never_take_more_than_the_quota<S: Store>(store: Arc<S>) {
        const CONTENDERS: usize = 24;
        let tenant = fresh_tenant();
        let tasks: Vec<_> = (0..CONTENDERS)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    store.try_begin(&key_of(tenant), &fresh_fingerprint(), Fence::random(), LEASE).await.unwrap()
                })
            })
            .collect();
        let mut acquired = 0;
        for task in tasks {
            match task.await.unwrap() {
                Begin::Acquired { .. } => acquired += 1,
                Begin::OverQuota(QuotaLimit::Keys) => {}
                other => panic!("a fresh key answered {other:?}"),
            }
        }
        assert_eq!(acquired, MAX_KEYS as usize, "{CONTENDERS} first requests of one tenant");
    }
}

/// Runs every quota case against every backend opened with [`quota::QUOTA`].
macro_rules! quota_suite {
    ($($case:ident),* $(,)?) => {
        mod quota_on_memory {
            use super::*;
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::quota::$case(Arc::new(MemoryStore::default().with_quota(Some(quota::QUOTA)))).await;
                }
            )*
        }

        mod quota_on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let store = Arc::into_inner(shared_redis_store().await).expect("one owner");
                    super::quota::$case(Arc::new(store.with_quota(Some(quota::QUOTA)))).await;
                }
            )*
        }

        mod quota_on_postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let schema = TestSchema::create().await;
                    let url = schema.store_url();
                    let store = PostgresStore::open(&url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
                    super::quota::$case(Arc::new(store.with_quota(Some(quota::QUOTA)))).await;
                }
            )*
        }

        mod quota_on_redis_cluster {
            use super::*;

            /// One cluster for all cases, as `on_redis_cluster`.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn every_quota_case_passes() {
                let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.expect("start the cluster");
                let url = cluster.url();
                let store = RedisStore::open(&url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
                let store = Arc::new(store.with_quota(Some(quota::QUOTA)));
                $(
                    eprintln!("case {}", stringify!($case));
                    super::quota::$case(store.clone()).await;
                )*
            }
        }
    };
}

quota_suite! {
    a_tenant_at_max_keys_is_refused_new_keys_only,
    expiry_and_purge_give_a_tenant_its_keys_back,
    a_tenant_past_max_bytes_is_refused_new_keys_and_its_completions_still_land,
    expired_responses_give_a_tenant_its_bytes_back,
    concurrent_first_requests_never_take_more_than_the_quota,
}

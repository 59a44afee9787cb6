//! The memory store's own tests: its limits, its sweeps and its accounting.
//! (The behaviour every store shares is in `tests/stores/conformance.rs`.)

use super::*;
use crate::idempotency::TenantId;
use crate::store::QuotaLimit;
use proptest::prelude::*;

fn key(n: u8) -> ScopedKey {
    ScopedKey::from_digest([n; 32])
}

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(60);

/// A key in shard `shard` (the first byte picks the shard); `n` tells apart keys of one shard.
fn key_in(shard: u8, n: u16) -> ScopedKey {
    let mut digest = [0; 32];
    digest[0] = shard;
    digest[1..3].copy_from_slice(&n.to_be_bytes());
    ScopedKey::from_digest(digest)
}

fn response(body_bytes: usize) -> StoredResponse {
    StoredResponse { status: 200, headers: Default::default(), body: vec![b'x'; body_bytes].into() }
}

impl MemoryStore {
    /// What the budgets count and what the maps hold: `(entries, bytes)` each.
    fn accounting(&self) -> ((usize, usize), (usize, usize)) {
        let counted = (self.budgets.entries.used(), self.budgets.bytes.used());
        let held = self.shards.iter().fold((0, 0), |(entries, bytes), shard| {
            let shard = lock(shard);
            (entries + shard.map.len(), bytes + shard.map.values().map(Entry::size).sum::<usize>())
        });
        (counted, held)
    }

    fn assert_accounting_is_exact(&self) {
        let (counted, held) = self.accounting();
        assert_eq!(counted, held, "(entries, bytes) counted vs held in the maps");
    }
}

#[tokio::test]
async fn a_full_store_refuses_new_keys_instead_of_forgetting_live_ones() {
    let store = MemoryStore::new(1, DEFAULT_MAX_BYTES);
    let fp = Fingerprint([1; 32]);
    assert_eq!(store.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap(), Begin::Acquired { took_over: false });
    assert!(matches!(store.try_begin(&key(1), &fp, Fence(2), LEASE).await, Err(StoreError::Full(_))));
    assert!(matches!(
        store.try_begin(&key(0), &fp, Fence(3), LEASE).await.unwrap(),
        Begin::Existing(Record::InFlight { .. })
    ));
}

#[tokio::test]
async fn a_full_store_makes_room_from_expired_records() {
    let store = MemoryStore::new(1, DEFAULT_MAX_BYTES);
    let fp = Fingerprint([1; 32]);
    store.try_begin(&key(0), &fp, Fence(1), Duration::ZERO).await.unwrap();
    assert_eq!(
        store.try_begin(&key(1), &fp, Fence(2), LEASE).await.unwrap(),
        Begin::Acquired { took_over: false },
        "the expired record in another shard made room"
    );
    assert_eq!(store.len(), 1);
    store.assert_accounting_is_exact();
}

/// Whether `store` refuses a new key `n` of shard 9 (acquiring it otherwise).
async fn refuses(store: &MemoryStore, n: u16) -> bool {
    let begin = store.try_begin(&key_in(9, n), &Fingerprint([1; 32]), Fence(9), Duration::from_secs(3600)).await;
    matches!(begin, Err(StoreError::Full(_)))
}

/// A full store skips the shards where nothing can have expired yet (see
/// `Shard::earliest`); every way a record's expiry is set after the last
/// sweep still makes its shard count when that time comes.
#[tokio::test(start_paused = true)]
async fn a_full_store_makes_room_from_records_whose_expiry_was_set_after_its_last_sweep() {
    const LONG: Duration = Duration::from_secs(3600);
    const SHORT: Duration = Duration::from_secs(1);
    let after_short = SHORT + Duration::from_millis(1);
    let store = MemoryStore::new(2, DEFAULT_MAX_BYTES);
    let fp = Fingerprint([1; 32]);
    store.try_begin(&key_in(0, 0), &fp, Fence(1), LONG).await.unwrap();
    store.try_begin(&key_in(1, 0), &fp, Fence(2), LONG).await.unwrap();
    assert!(refuses(&store, 0).await, "two live records: full, and the sweep found nothing to drop");
    // A completion whose TTL is shorter than the lease it ends.
    assert!(store.complete(&key_in(0, 0), &fp, Fence(1), Completion::NotKept, SHORT).await.unwrap());
    assert!(refuses(&store, 0).await, "nothing expired yet");
    tokio::time::advance(after_short).await;
    assert!(!refuses(&store, 0).await, "the completed record expired and made room");
    // A new key whose lease is the first expiry of a shard last swept empty.
    assert!(store.release(&key_in(9, 0), Fence(9)).await.unwrap());
    store.try_begin(&key_in(2, 0), &fp, Fence(3), SHORT).await.unwrap();
    assert!(refuses(&store, 1).await);
    tokio::time::advance(after_short).await;
    assert!(!refuses(&store, 1).await, "the lapsed attempt made room");
    // A renewal with a shorter lease than the one it renews.
    assert!(store.renew(&key_in(9, 1), Fence(9), SHORT).await.unwrap());
    assert!(refuses(&store, 2).await);
    tokio::time::advance(after_short).await;
    assert!(!refuses(&store, 2).await, "the attempt renewed for less lapsed and made room");
    store.assert_accounting_is_exact();
}

#[tokio::test]
async fn the_entry_limit_is_one_budget_for_the_whole_store() {
    let store = MemoryStore::from_url("memory://?max_entries=50").unwrap();
    let fp = Fingerprint([1; 32]);
    // 50 keys over 3 shards: 17 in one shard, far more than 50 / 64.
    for n in 0..50u16 {
        let begin = store.try_begin(&key_in((n % 3) as u8, n), &fp, Fence(1), LEASE).await;
        assert_eq!(begin.unwrap(), Begin::Acquired { took_over: false }, "key {n}");
    }
    assert_eq!(store.len(), 50);
    let refused = store.try_begin(&key_in(40, 0), &fp, Fence(1), LEASE).await;
    assert!(matches!(refused, Err(StoreError::Full(_))), "the 51st key, even in an empty shard");
    store.assert_accounting_is_exact();
}

#[tokio::test]
async fn the_budget_of_expired_records_is_reused() {
    let store = MemoryStore::from_url("memory://?max_entries=50").unwrap();
    let fp = Fingerprint([1; 32]);
    for n in 0..25u16 {
        store.try_begin(&key_in(0, n), &fp, Fence(1), Duration::ZERO).await.unwrap();
    }
    for n in 25..50u16 {
        store.try_begin(&key_in(1, n), &fp, Fence(1), LEASE).await.unwrap();
        assert!(
            store
                .complete(&key_in(1, n), &fp, Fence(1), Completion::Response(&response(10)), Duration::ZERO)
                .await
                .unwrap()
        );
    }
    // All 50 have expired; 50 new keys in other shards take their places.
    for n in 0..50u16 {
        let begin = store.try_begin(&key_in(2 + (n % 5) as u8, n), &fp, Fence(2), LEASE).await;
        assert_eq!(begin.unwrap(), Begin::Acquired { took_over: false }, "key {n}");
    }
    assert!(matches!(store.try_begin(&key_in(9, 0), &fp, Fence(2), LEASE).await, Err(StoreError::Full(_))));
    assert_eq!(store.accounting().0, (50, 0), "the expired records and their bodies are gone");
    store.assert_accounting_is_exact();
}

#[tokio::test]
async fn a_one_mebibyte_budget_stores_a_30_kib_response() {
    let store = MemoryStore::from_url("memory://?max_bytes=1MiB").unwrap();
    let fp = Fingerprint([1; 32]);
    store.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap();
    let stored = response(30 << 10);
    assert!(store.complete(&key(0), &fp, Fence(1), Completion::Response(&stored), TTL).await.unwrap());
    assert_eq!(store.get(&key(0)).await.unwrap(), Some(Record::Completed { fingerprint: fp, response: Some(stored) }));
}

#[tokio::test]
async fn a_response_over_the_byte_budget_is_kept_without_its_body() {
    let store = MemoryStore::new(100, 1000);
    let fp = Fingerprint([1; 32]);
    store.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap();
    assert!(store.complete(&key(0), &fp, Fence(1), Completion::Response(&response(2000)), TTL).await.unwrap());
    assert_eq!(store.get(&key(0)).await.unwrap(), Some(Record::Completed { fingerprint: fp, response: None }));
    store.assert_accounting_is_exact();
}

#[tokio::test]
async fn bodies_fill_the_byte_budget_and_expired_ones_make_room() {
    let size = response(600).size();
    let store = MemoryStore::new(100, 2 * size);
    let fp = Fingerprint([1; 32]);
    for (n, ttl) in [(0, Duration::ZERO), (1, TTL), (2, TTL), (3, TTL)] {
        store.try_begin(&key(n), &fp, Fence(1), LEASE).await.unwrap();
        assert!(store.complete(&key(n), &fp, Fence(1), Completion::Response(&response(600)), ttl).await.unwrap());
    }
    let has_body =
        |n| store.shard(&key(n)).map.get(&key(n)).map(|e| matches!(e.state, State::Completed { response: Some(_) }));
    assert_eq!(has_body(0), None, "key 0 expired; sweeping it made room for key 2's body");
    assert_eq!((has_body(1), has_body(2), has_body(3)), (Some(true), Some(true), Some(false)));
    assert_eq!(store.accounting().0, (3, 2 * size));
    store.assert_accounting_is_exact();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_begins_never_pass_the_entry_limit() {
    let store = std::sync::Arc::new(MemoryStore::new(250, DEFAULT_MAX_BYTES));
    let tasks: Vec<_> = (0..8u16)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut acquired = 0;
                for n in 0..100u16 {
                    let key = key_in((n % 64) as u8, task * 100 + n);
                    match store.try_begin(&key, &Fingerprint([1; 32]), Fence(1), LEASE).await {
                        Ok(Begin::Acquired { .. }) => acquired += 1,
                        Err(StoreError::Full(_)) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                    tokio::task::yield_now().await;
                }
                acquired
            })
        })
        .collect();
    let mut acquired = 0;
    for task in tasks {
        acquired += task.await.unwrap();
    }
    assert_eq!(acquired, 250);
    assert_eq!(store.len(), 250);
    store.assert_accounting_is_exact();
}

#[tokio::test]
async fn expired_records_are_reclaimed_before_the_store_fills() {
    let store = MemoryStore::with_sweep_interval(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES, Duration::ZERO);
    let fp = Fingerprint([1; 32]);
    // Keys 0, 64, 128, 192 share a shard; three of them expire at once.
    for (n, fence) in [(0, 1), (64, 2), (128, 3)] {
        store.try_begin(&key(n), &fp, Fence(fence), Duration::ZERO).await.unwrap();
    }
    store.try_begin(&key(192), &fp, Fence(4), LEASE).await.unwrap();
    let held = store.shard(&key(0)).map.len();
    assert_eq!(held, 1, "the expired records were dropped, the live one kept");
    assert_eq!(store.len(), 1);
    store.assert_accounting_is_exact();
    // With the default interval nothing is swept early.
    let lazy = MemoryStore::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES);
    for (n, fence) in [(0, 1), (64, 2)] {
        lazy.try_begin(&key(n), &fp, Fence(fence), Duration::ZERO).await.unwrap();
    }
    assert_eq!(lazy.shard(&key(0)).map.len(), 2);
    // A routine sweep keeps an attempt that lapsed within its interval
    // (its retry is a takeover) but drops an expired completed record.
    let done = MemoryStore::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES);
    done.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap();
    assert!(done.complete(&key(0), &fp, Fence(1), Completion::NotKept, Duration::ZERO).await.unwrap());
    done.try_begin(&key(64), &fp, Fence(2), Duration::ZERO).await.unwrap();
    let mut shard = done.shard(&key(0));
    shard.sweep(Instant::now(), Duration::from_secs(60), &done.budgets);
    assert!(shard.map.contains_key(&key(64)) && !shard.map.contains_key(&key(0)));
}

/// Leases and TTLs run on tokio's clock: a paused test moves through them
/// without sleeping.
#[tokio::test(start_paused = true)]
async fn a_lease_lapses_after_its_length_and_a_record_after_its_ttl() {
    let store = MemoryStore::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES);
    let fp = Fingerprint([1; 32]);
    store.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap();
    tokio::time::advance(LEASE - Duration::from_millis(1)).await;
    let held = store.try_begin(&key(0), &fp, Fence(2), LEASE).await.unwrap();
    assert!(
        matches!(held, Begin::Existing(Record::InFlight { lease_remaining, .. }) if lease_remaining == Duration::from_millis(1)),
        "{held:?}"
    );
    assert!(store.renew(&key(0), Fence(1), LEASE).await.unwrap(), "renewed a moment before it lapsed");
    tokio::time::advance(LEASE).await;
    assert_eq!(store.try_begin(&key(0), &fp, Fence(3), LEASE).await.unwrap(), Begin::Acquired { took_over: true });
    assert!(!store.renew(&key(0), Fence(1), LEASE).await.unwrap(), "the first attempt is fenced out");
    assert!(store.complete(&key(0), &Fingerprint([1; 32]), Fence(3), Completion::NotKept, TTL).await.unwrap());
    tokio::time::advance(TTL - Duration::from_millis(1)).await;
    assert!(store.get(&key(0)).await.unwrap().is_some(), "kept for its whole ttl");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(store.get(&key(0)).await.unwrap(), None, "gone once it expired");
}

/// One step of a mixed workload over a few keys in a few shards.
#[derive(Debug, Clone)]
enum Step {
    Begin { key: u16, expired: bool },
    Complete { key: u16, body: Option<usize>, expired: bool },
    Unknown { key: u16 },
    Renew { key: u16 },
    Release { key: u16 },
    Purge { key: u16 },
}

fn step() -> impl Strategy<Value = Step> {
    let key = 0..8u16;
    prop_oneof![
        (key.clone(), any::<bool>()).prop_map(|(key, expired)| Step::Begin { key, expired }),
        (key.clone(), proptest::option::of(0..900usize), any::<bool>())
            .prop_map(|(key, body, expired)| Step::Complete { key, body, expired }),
        key.clone().prop_map(|key| Step::Unknown { key }),
        key.clone().prop_map(|key| Step::Renew { key }),
        key.clone().prop_map(|key| Step::Release { key }),
        key.prop_map(|key| Step::Purge { key }),
    ]
}

proptest! {
    #[test]
    fn the_budgets_count_exactly_what_the_maps_hold(
        steps in proptest::collection::vec(step(), 1..60),
        routine_sweeps in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        // Small limits so the workload hits both. Keys fall in shards 0, 1
        // and 2. With routine sweeps on every new key, expired records are
        // swept; without, they are overwritten or swept only for room.
        let every = if routine_sweeps { Duration::ZERO } else { SWEEP_EVERY };
        let store = MemoryStore::with_sweep_interval(5, 2000, every);
        let fp = Fingerprint([1; 32]);
        let at = |key: u16| key_in((key % 3) as u8, key);
        let lease = |expired: bool| if expired { Duration::ZERO } else { LEASE };
        runtime.block_on(async {
            for step in steps {
                let _ = match step {
                    Step::Begin { key, expired } => store.try_begin(&at(key), &fp, Fence(1), lease(expired)).await.map(|_| true),
                    Step::Complete { key, body, expired } => {
                        let body = body.map(response);
                        store.complete(&at(key), &fp, Fence(1), Completion::from_response(body.as_ref()), lease(expired)).await
                    }
                    Step::Unknown { key } => store.complete(&at(key), &fp, Fence(1), Completion::Unknown, TTL).await,
                    Step::Renew { key } => store.renew(&at(key), Fence(1), LEASE).await,
                    Step::Release { key } => store.release(&at(key), Fence(1)).await,
                    Step::Purge { key } => store.purge(&at(key)).await,
                };
                let (counted, held) = store.accounting();
                prop_assert_eq!(counted, held);
                prop_assert!(counted.0 <= 5 && counted.1 <= 2000);
            }
            Ok(())
        })?;
    }
}

#[test]
fn url_options_are_checked() {
    assert!(MemoryStore::from_url("memory://?max_entries=10&max_bytes=1MiB").is_ok());
    assert!(
        matches!(MemoryStore::from_url("memory://?max_entrys=10"), Err(StoreError::InvalidUrl(m)) if m.contains("max_entries"))
    );
    assert!(MemoryStore::from_url("memory://?max_entries=ten").is_err());
}

impl MemoryStore {
    /// What the shards' tenant tallies say, against what their maps hold:
    /// `(tenants tallied, keys, bytes)` each.
    fn tenant_accounting(&self) -> ((usize, usize, usize), (usize, usize, usize)) {
        let mut tallied = (0, 0, 0);
        let mut held = std::collections::HashMap::<TenantId, (usize, usize)>::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for usage in shard.tenants.iter().flat_map(|t| t.values()) {
                tallied = (tallied.0 + 1, tallied.1 + usage.keys, tallied.2 + usage.bytes);
            }
            for (key, entry) in &shard.map {
                let tenant = held.entry(key.tenant()).or_default();
                *tenant = (tenant.0 + 1, tenant.1 + entry.size());
            }
        }
        let keys = held.values().map(|h| h.0).sum();
        let bytes = held.values().map(|h| h.1).sum();
        (tallied, (held.len(), keys, bytes))
    }
}

/// With a quota, each tenant's tally is what its shard holds, and a tenant
/// whose records are all gone (released, purged, swept) is forgotten: the
/// tallies are bounded by the records, not by the tenants ever seen.
#[tokio::test(start_paused = true)]
async fn tenant_tallies_follow_the_records_and_forget_tenants_that_hold_nothing() {
    let store = MemoryStore::default().with_quota(Some(TenantQuota::new(3, u64::MAX)));
    let fp = Fingerprint([1; 32]);
    let mut held = Vec::new();
    for tenant in 0..50u8 {
        for n in 0..3u8 {
            let key = ScopedKey::from_parts(TenantId([tenant; 16]), [n; 32]);
            let fence = Fence::random();
            assert_eq!(store.try_begin(&key, &fp, fence, LEASE).await.unwrap(), Begin::Acquired { took_over: false });
            held.push((key, fence));
        }
        let fourth = ScopedKey::from_parts(TenantId([tenant; 16]), [9; 32]);
        assert_eq!(
            store.try_begin(&fourth, &fp, Fence::random(), LEASE).await.unwrap(),
            Begin::OverQuota(QuotaLimit::Keys)
        );
    }
    for (i, (key, fence)) in held.iter().enumerate() {
        match i % 3 {
            0 => assert!(store.release(key, *fence).await.unwrap()),
            1 => assert!(store.complete(key, &fp, *fence, Completion::Response(&response(100)), TTL).await.unwrap()),
            _ => assert!(store.purge(key).await.unwrap()),
        }
    }
    let (tallied, held_now) = store.tenant_accounting();
    assert_eq!(tallied, held_now);
    assert_eq!(tallied, (50, 50, 50 * response(100).size()), "one completed record per tenant is left");
    tokio::time::sleep(TTL * 2).await;
    store.sweep_for_room(Instant::now());
    assert_eq!(store.tenant_accounting(), ((0, 0, 0), (0, 0, 0)), "swept: no tenant is remembered");
    store.assert_accounting_is_exact();
}

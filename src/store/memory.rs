//! The embedded store: records in this process's memory.
//!
//! For a single gateway process — the default, so `idemgate serve` needs
//! nothing installed. Records do not survive a restart and are not shared
//! between processes; run Redis or Postgres for that.
//!
//! The map is split into shards, each behind its own mutex, so concurrent
//! requests on different keys rarely contend; every transition holds one
//! shard's lock for its whole read-decide-write, which is what makes it
//! atomic. Memory is bounded two ways (both settable in the URL,
//! `memory://?max_entries=100000&max_bytes=256MiB`):
//!
//! - **entries**: when a shard is full, expired records are swept; if it is
//!   still full a new key is refused with [`StoreError::Full`] (a `503`), so
//!   the store never forgets a live record to make room — forgetting one
//!   would let a retry execute twice.
//! - **bytes**: a completed response that would exceed the byte budget is
//!   recorded as completed *without* its body: retries get
//!   `response-not-replayable` rather than a second execution.
//!
//! Expired records are also reclaimed without waiting for a shard to fill:
//! the first new key a shard sees after [`SWEEP_EVERY`] sweeps it (about
//! 1,600 entries per shard at the default limit, well under a millisecond).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Begin, Store, StoreError, url_options};
use crate::config::ByteSize;
use crate::idempotency::{Completion, Decision, Fence, Fingerprint, Record, ScopedKey, StoredResponse, decide};

const SHARDS: usize = 64;

/// Default limit on live records.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// Default limit on bytes of stored responses.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;
/// How often a shard that receives new keys drops its expired records.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// See the module docs.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    entries_per_shard: usize,
    bytes_per_shard: usize,
    sweep_every: Duration,
}

struct Shard {
    map: HashMap<ScopedKey, Entry>,
    bytes: usize,
    next_sweep: Instant,
}

struct Entry {
    fingerprint: Fingerprint,
    state: State,
    expires_at: Instant,
}

enum State {
    InFlight { fence: Fence },
    Completed { response: Option<StoredResponse> },
    Unknown,
}

impl Entry {
    fn size(&self) -> usize {
        match &self.state {
            State::Completed { response: Some(r) } => r.size(),
            _ => 0,
        }
    }

    fn to_record(&self, now: Instant) -> Record {
        match &self.state {
            State::InFlight { fence } => Record::InFlight {
                fingerprint: self.fingerprint,
                fence: *fence,
                lease_remaining: self.expires_at.saturating_duration_since(now),
            },
            State::Completed { response } => {
                Record::Completed { fingerprint: self.fingerprint, response: response.clone() }
            }
            State::Unknown => Record::Unknown { fingerprint: self.fingerprint },
        }
    }
}

impl Shard {
    /// The live entry for `key`. Expired entries stay until swept or
    /// overwritten, so a lapsed attempt can still be recognised as such.
    fn live(&mut self, key: &ScopedKey, now: Instant) -> Option<&mut Entry> {
        self.map.get_mut(key).filter(|e| e.expires_at > now)
    }

    fn remove(&mut self, key: &ScopedKey) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        self.bytes -= entry.size();
        Some(entry)
    }

    /// Drops expired records. A routine sweep keeps an in-flight record
    /// that lapsed less than `every` ago, so that its request's retry is
    /// still recognised as a takeover; a sweep for room (`every` zero)
    /// drops everything expired.
    fn sweep(&mut self, now: Instant, every: Duration) {
        let before = self.map.len();
        let mut freed = 0;
        self.map.retain(|_, e| {
            let lapsed_recently = matches!(e.state, State::InFlight { .. }) && e.expires_at + every > now;
            let keep = e.expires_at > now || lapsed_recently;
            if !keep {
                freed += e.size();
            }
            keep
        });
        self.bytes -= freed;
        tracing::debug!(swept = before - self.map.len(), "memory store sweep");
    }

    /// The live in-flight entry held under `fence`.
    fn held(&mut self, key: &ScopedKey, fence: Fence, now: Instant) -> Option<&mut Entry> {
        self.live(key, now).filter(|e| matches!(e.state, State::InFlight { fence: f } if f == fence))
    }
}

impl MemoryStore {
    /// A store holding at most `max_entries` records and `max_bytes` of responses.
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self::with_sweep_interval(max_entries, max_bytes, SWEEP_EVERY)
    }

    fn with_sweep_interval(max_entries: usize, max_bytes: usize, sweep_every: Duration) -> Self {
        let now = Instant::now();
        let shard = || Mutex::new(Shard { map: HashMap::new(), bytes: 0, next_sweep: now + sweep_every });
        Self {
            shards: (0..SHARDS).map(|_| shard()).collect(),
            entries_per_shard: max_entries.div_ceil(SHARDS).max(1),
            bytes_per_shard: max_bytes.div_ceil(SHARDS),
            sweep_every,
        }
    }

    /// Parses `memory://` with optional `max_entries` and `max_bytes`.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (mut entries, mut bytes) = (DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES);
        for (name, value) in url_options(url) {
            match name {
                "max_entries" => {
                    entries = value
                        .parse()
                        .map_err(|_| StoreError::InvalidUrl(format!("max_entries={value:?} is not a number")))?
                }
                "max_bytes" => bytes = value.parse::<ByteSize>().map_err(StoreError::InvalidUrl)?.bytes(),
                other => {
                    return Err(StoreError::InvalidUrl(format!(
                        "memory:// has no option {other:?} (known: max_entries, max_bytes)"
                    )));
                }
            }
        }
        Ok(Self::new(entries, bytes))
    }

    fn shard(&self, key: &ScopedKey) -> std::sync::MutexGuard<'_, Shard> {
        let index = usize::from(key.as_bytes()[0]) % SHARDS;
        // A poisoned shard only means another thread panicked mid-update of
        // plain data whose invariants we re-check on every access.
        self.shards[index].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Live records, for tests and metrics (expired ones are not counted).
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.values().filter(|e| e.expires_at > now).count())
            .sum()
    }

    /// `true` when no live record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

impl Store for MemoryStore {
    async fn try_begin(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        // An expired attempt of this very request: acquiring is a takeover.
        let lapsed = shard.map.get(key).is_some_and(|e| {
            matches!(e.state, State::InFlight { .. }) && e.expires_at <= now && e.fingerprint == *fingerprint
        });
        let record = shard.live(key, now).map(|e| e.to_record(now));
        let took_over = match decide(record.as_ref(), fingerprint) {
            Decision::Start => lapsed,
            Decision::TakeOver => true,
            _ => return Ok(Begin::Existing(record.ok_or(StoreError::Corrupt("decision without record".into()))?)),
        };
        if record.is_none() && shard.map.len() >= self.entries_per_shard {
            shard.sweep(now, Duration::ZERO);
            if shard.map.len() >= self.entries_per_shard {
                return Err(StoreError::Full("the embedded store holds max_entries live records"));
            }
        }
        if now >= shard.next_sweep {
            shard.sweep(now, self.sweep_every);
            shard.next_sweep = now + self.sweep_every;
        }
        shard.remove(key);
        shard.map.insert(
            *key,
            Entry { fingerprint: *fingerprint, state: State::InFlight { fence }, expires_at: now + lease },
        );
        Ok(Begin::Acquired { took_over })
    }

    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        Ok(shard.held(key, fence, now).map(|e| e.expires_at = now + lease).is_some())
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        if shard.held(key, fence, now).is_none() {
            return Ok(false);
        }
        let response = match completion {
            Completion::Response(response) => Some(response),
            Completion::NotKept => None,
            Completion::Unknown => {
                let Some(entry) = shard.map.get_mut(key) else { return Ok(false) };
                entry.state = State::Unknown;
                entry.expires_at = now + ttl;
                return Ok(true);
            }
        };
        let size = response.map_or(0, StoredResponse::size);
        if shard.bytes + size > self.bytes_per_shard {
            shard.sweep(now, Duration::ZERO);
        }
        // Over budget even after the sweep: keep the fact, drop the body.
        let response = response.filter(|_| shard.bytes + size <= self.bytes_per_shard).cloned();
        let Some(entry) = shard.map.get_mut(key) else {
            return Ok(false);
        };
        entry.state = State::Completed { response };
        entry.expires_at = now + ttl;
        let added = entry.size();
        shard.bytes += added;
        Ok(true)
    }

    async fn release(&self, key: &ScopedKey, fence: Fence) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        if shard.held(key, fence, now).is_none() {
            return Ok(false);
        }
        Ok(shard.remove(key).is_some())
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        Ok(self.shard(key).live(key, now).map(|e| e.to_record(now)))
    }

    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let existed = shard.live(key, now).is_some();
        shard.remove(key);
        Ok(existed)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> ScopedKey {
        ScopedKey::from_digest([n; 32])
    }

    const LEASE: Duration = Duration::from_secs(30);
    const TTL: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_full_store_refuses_new_keys_instead_of_forgetting_live_ones() {
        // One entry per shard; keys 0 and 64 land in the same shard.
        let store = MemoryStore::new(1, DEFAULT_MAX_BYTES);
        let fp = Fingerprint([1; 32]);
        assert_eq!(store.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap(), Begin::Acquired { took_over: false });
        assert!(matches!(store.try_begin(&key(64), &fp, Fence(2), LEASE).await, Err(StoreError::Full(_))));
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
            store.try_begin(&key(64), &fp, Fence(2), LEASE).await.unwrap(),
            Begin::Acquired { took_over: false }
        );
        assert_eq!(store.len(), 1);
    }

    #[tokio::test]
    async fn a_response_over_the_byte_budget_is_kept_without_its_body() {
        let store = MemoryStore::new(100, SHARDS * 1000);
        let fp = Fingerprint([1; 32]);
        store.try_begin(&key(0), &fp, Fence(1), LEASE).await.unwrap();
        let big = StoredResponse { status: 200, headers: vec![], body: vec![b'x'; 2000].into() };
        assert!(store.complete(&key(0), Fence(1), Completion::Response(&big), TTL).await.unwrap());
        assert_eq!(store.get(&key(0)).await.unwrap(), Some(Record::Completed { fingerprint: fp, response: None }));
    }

    #[tokio::test]
    async fn expired_records_are_reclaimed_before_the_shard_fills() {
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
        assert!(done.complete(&key(0), Fence(1), Completion::NotKept, Duration::ZERO).await.unwrap());
        done.try_begin(&key(64), &fp, Fence(2), Duration::ZERO).await.unwrap();
        let mut shard = done.shard(&key(0));
        shard.sweep(Instant::now(), Duration::from_secs(60));
        assert!(shard.map.contains_key(&key(64)) && !shard.map.contains_key(&key(0)));
    }

    #[test]
    fn url_options_are_checked() {
        assert!(MemoryStore::from_url("memory://?max_entries=10&max_bytes=1MiB").is_ok());
        assert!(
            matches!(MemoryStore::from_url("memory://?max_entrys=10"), Err(StoreError::InvalidUrl(m)) if m.contains("max_entries"))
        );
        assert!(MemoryStore::from_url("memory://?max_entries=ten").is_err());
    }
}

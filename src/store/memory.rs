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
//! `memory://?max_entries=100000&max_bytes=256MiB`), each limit one budget
//! for the whole store however the keys fall over the shards:
//!
//! - **entries**: a new key reserves a unit of the entry budget before it
//!   is inserted. When none is left, expired records are swept from every
//!   shard and the key tries once more; if the budget is still spent it is
//!   refused with [`StoreError::Full`] (a `503`), so the store never forgets
//!   a live record to make room — forgetting one would let a retry execute
//!   twice.
//! - **bytes**: a completed response reserves its size of the byte budget
//!   the same way (sweep, try once more); one that still does not fit is
//!   recorded as completed *without* its body: retries get
//!   `response-not-replayable` rather than a second execution.
//!
//! The budgets count what the maps hold, expired records included, until a
//! sweep or an overwrite removes them; a unit is reserved before an insert,
//! so two racing inserts cannot both take the last one. The sweep for room
//! visits every shard in which a record may have expired (each knows its
//! earliest expiry), taking one shard's lock at a time and only after the
//! caller has dropped its own: nothing here ever holds two. So a store
//! full of live records refuses a new key after 64 lock round trips, not
//! a walk over every record.
//!
//! Expired records are also reclaimed without waiting for the store to
//! fill: the first new key a shard sees after [`SWEEP_EVERY`] sweeps it
//! (about 1,600 entries per shard at the default limit, well under a
//! millisecond).
//!
//! **Tenant quota** ([`MemoryStore::with_quota`]). With a quota, a key's
//! shard is chosen by its tenant, not by the key, so all of a tenant's
//! records share one shard and that shard keeps the tenant's usage (live
//! entries, stored bytes) beside them: every change to a tenant's records
//! updates its usage under the same lock, which makes "under quota, then
//! insert" one atomic step. A tenant at its limit first has its shard
//! swept (records of its that expired give their share back), then is
//! refused. The price: one tenant's traffic takes one shard's lock, not
//! 64 — a lock held for a hash-map operation, so it only shows when a
//! single tenant runs many cores' worth of new keys.

mod budget;
mod shard;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use budget::Budget;
use shard::{Entry, Shard, State, signed, tally};
// tokio's clock, so tests drive leases and TTLs with `tokio::time::pause`.
use tokio::time::Instant;

use super::{Begin, Store, StoreError, url_options};
use crate::config::{ByteSize, TenantQuota};
use crate::idempotency::{Admission, Completion, Fence, Fingerprint, Record, ScopedKey, StoredResponse, admit};

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
    budgets: Budgets,
    sweep_every: Duration,
    quota: Option<TenantQuota>,
}

/// The store-wide limits. Every entry in a map holds one unit of `entries`
/// and [`Entry::size`] units of `bytes`.
struct Budgets {
    entries: Budget,
    bytes: Budget,
}

impl Budgets {
    /// Gives back what an entry that left its map held.
    fn release(&self, entry: &Entry) {
        self.entries.release(1);
        self.bytes.release(entry.size());
    }
}

impl MemoryStore {
    /// A store holding at most `max_entries` records and `max_bytes` of responses.
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self::with_sweep_interval(max_entries, max_bytes, SWEEP_EVERY)
    }

    fn with_sweep_interval(max_entries: usize, max_bytes: usize, sweep_every: Duration) -> Self {
        let now = Instant::now();
        let shard =
            || Mutex::new(Shard { map: HashMap::new(), next_sweep: now + sweep_every, earliest: None, tenants: None });
        Self {
            shards: (0..SHARDS).map(|_| shard()).collect(),
            budgets: Budgets { entries: Budget::new(max_entries), bytes: Budget::new(max_bytes) },
            sweep_every,
            quota: None,
        }
    }

    /// Enforces `quota` per tenant (see the module docs). Records already
    /// held are dropped: they were filed by key, not by tenant, and the
    /// quota is set before the store serves.
    pub fn with_quota(&self, quota: Option<TenantQuota>) -> Self {
        let mut store =
            Self::with_sweep_interval(self.budgets.entries.limit(), self.budgets.bytes.limit(), self.sweep_every);
        for shard in &store.shards {
            lock(shard).tenants = quota.map(|_| HashMap::new());
        }
        store.quota = quota;
        store
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
                "max_bytes" => {
                    bytes = value.parse::<ByteSize>().map_err(|e| StoreError::InvalidUrl(e.to_string()))?.bytes()
                }
                other => {
                    return Err(StoreError::InvalidUrl(format!(
                        "memory:// has no option {other:?} (known: max_entries, max_bytes)"
                    )));
                }
            }
        }
        Ok(Self::new(entries, bytes))
    }

    fn shard(&self, key: &ScopedKey) -> MutexGuard<'_, Shard> {
        // With a quota a tenant's records share a shard, which keeps its usage.
        let byte = if self.quota.is_some() { key.tenant().0[0] } else { key.as_bytes()[0] };
        lock(&self.shards[usize::from(byte) % SHARDS])
    }

    /// Drops every expired record to make room, one shard at a time: the
    /// caller holds no shard lock, and this never holds two.
    fn sweep_for_room(&self, now: Instant) {
        for shard in &self.shards {
            lock(shard).sweep(now, Duration::ZERO, &self.budgets);
        }
    }

    /// Reserves `size` bytes for a stored response, sweeping once for room.
    fn reserve_bytes(&self, size: usize, now: Instant) -> bool {
        if self.budgets.bytes.try_reserve(size) {
            return true;
        }
        // No sweep can make room for a body larger than the whole budget.
        if size > self.budgets.bytes.limit() {
            return false;
        }
        self.sweep_for_room(now);
        self.budgets.bytes.try_reserve(size)
    }

    /// Live records, for tests and metrics (expired ones are not counted).
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.shards.iter().map(|s| lock(s).map.values().filter(|e| e.expires_at > now).count()).sum()
    }

    /// `true` when no live record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The earlier of a bound that may be unset and `at`.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A poisoned shard only means another thread panicked mid-update of
    // plain data whose invariants we re-check on every access.
    shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
        // At most twice: the second time after a sweep for room, which
        // needs this shard's lock released (and lets the record change).
        let mut swept = false;
        loop {
            let mut shard = self.shard(key);
            // An expired attempt of this very request: acquiring is a takeover.
            let lapsed = shard.map.get(key).is_some_and(|e| {
                matches!(e.state, State::InFlight { .. }) && e.expires_at <= now && e.fingerprint == *fingerprint
            });
            let record = shard.live(key, now).map(|e| e.to_record(now));
            let took_over = match admit(record, fingerprint) {
                Admission::Acquire { took_over } => took_over || lapsed,
                Admission::Existing(record) => return Ok(Begin::Existing(record)),
            };
            if now >= shard.next_sweep {
                shard.sweep(now, self.sweep_every, &self.budgets);
                shard.next_sweep = now + self.sweep_every;
            }
            // An expired record of this key hands its entry unit (and its
            // place in its tenant's quota) on to the new attempt; only a key
            // the map does not hold needs a new one.
            let slot = match shard.map.remove(key) {
                Some(old) => {
                    self.budgets.bytes.release(old.size());
                    tally(&mut shard.tenants, key.tenant(), -1, -signed(old.size()));
                    true
                }
                None => {
                    if let Some(quota) = &self.quota {
                        // The tenant's records are all in this shard: its
                        // expired ones can be given back here and now.
                        if shard.over_quota(key.tenant(), quota).is_some() {
                            shard.sweep(now, Duration::ZERO, &self.budgets);
                        }
                        if let Some(limit) = shard.over_quota(key.tenant(), quota) {
                            return Ok(Begin::OverQuota(limit));
                        }
                    }
                    self.budgets.entries.try_reserve(1)
                }
            };
            if !slot {
                if swept {
                    return Err(StoreError::Full("the embedded store holds max_entries live records"));
                }
                drop(shard);
                self.sweep_for_room(now);
                swept = true;
                continue;
            }
            shard.insert(
                key,
                Entry { fingerprint: *fingerprint, state: State::InFlight { fence }, expires_at: now + lease },
            );
            return Ok(Begin::Acquired { took_over });
        }
    }

    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let Some(entry) = shard.held(key, fence, now) else {
            return Ok(false);
        };
        entry.expires_at = now + lease;
        shard.expires(now + lease);
        Ok(true)
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        // A body's bytes are reserved before the shard's lock is taken,
        // because finding room may sweep every shard; they are given back
        // if the attempt turns out not to be held.
        let kept = match completion {
            Completion::Response(response) => self.reserve_bytes(response.size(), now).then_some(response),
            Completion::NotKept | Completion::Unknown => None,
        };
        let give_back = |kept: Option<&StoredResponse>| {
            if let Some(response) = kept {
                self.budgets.bytes.release(response.size());
            }
        };
        let state = || match completion {
            Completion::Unknown => State::Unknown,
            // Out of budget even after the sweep (`kept` is `None`): keep the fact, drop the body.
            Completion::Response(_) | Completion::NotKept => State::Completed { response: kept.cloned() },
        };
        // At most twice, as in `try_begin`: a record to create may need a
        // sweep for room, which needs this shard's lock released.
        let mut swept = false;
        loop {
            let mut shard = self.shard(key);
            match shard.map.get_mut(key) {
                // Ours, its lease live or lapsed: nobody took over.
                Some(entry) if matches!(entry.state, State::InFlight { fence: f } if f == fence) => {
                    entry.state = state();
                    entry.expires_at = now + ttl;
                    // Never refused for its tenant's bytes: the upstream acted.
                    let grown = signed(entry.size());
                    tally(&mut shard.tenants, key.tenant(), 0, grown);
                    shard.expires(now + ttl);
                    return Ok(true);
                }
                // Another attempt's, or completed while it lives: never overwritten.
                Some(entry) if entry.expires_at > now || matches!(entry.state, State::InFlight { .. }) => {
                    give_back(kept);
                    return Ok(false);
                }
                // An expired completion is no record.
                Some(entry) => {
                    let held_before = entry.size();
                    *entry = Entry { fingerprint: *fingerprint, state: state(), expires_at: now + ttl };
                    let grown = signed(entry.size()) - signed(held_before);
                    tally(&mut shard.tenants, key.tenant(), 0, grown);
                    shard.expires(now + ttl);
                    self.budgets.bytes.release(held_before);
                    return Ok(true);
                }
                // No record: our lease lapsed and the record went, and nobody
                // took over (a takeover writes its own fence). The upstream
                // acted, so the record says so.
                None if self.budgets.entries.try_reserve(1) => {
                    shard.insert(key, Entry { fingerprint: *fingerprint, state: state(), expires_at: now + ttl });
                    return Ok(true);
                }
                None if swept => {
                    give_back(kept);
                    return Err(StoreError::Full("the embedded store holds max_entries live records"));
                }
                None => {
                    drop(shard);
                    self.sweep_for_room(now);
                    swept = true;
                }
            }
        }
    }

    async fn release(&self, key: &ScopedKey, fence: Fence) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        if shard.held(key, fence, now).is_none() {
            return Ok(false);
        }
        Ok(shard.remove(key, &self.budgets).is_some())
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        Ok(self.shard(key).live(key, now).map(|e| e.to_record(now)))
    }

    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let existed = shard.live(key, now).is_some();
        shard.remove(key, &self.budgets);
        Ok(existed)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;

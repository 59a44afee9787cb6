//! One shard of the embedded store: its records, when the earliest of
//! them expires, and with a tenant quota each tenant's usage, all changed
//! together under the shard's lock (see the parent module's docs).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Budgets;
use crate::config::TenantQuota;
use crate::idempotency::{Fence, Fingerprint, Record, ScopedKey, StoredResponse, TenantId};
use crate::store::QuotaLimit;

pub(super) struct Shard {
    pub(super) map: HashMap<ScopedKey, Entry>,
    pub(super) next_sweep: Instant,
    /// No record of this shard expires before this (`None`: none held
    /// since the last sweep), so a sweep before then frees nothing and is
    /// skipped. Lowered ([`Shard::expires`]) wherever a record's expiry is
    /// set; only a sweep raises it, to the earliest expiry it kept.
    pub(super) earliest: Option<Instant>,
    /// With a tenant quota: what each tenant with records in this shard
    /// holds, counted as the budgets count (expired entries included until
    /// they leave the map). A tenant holding nothing has no entry.
    pub(super) tenants: Option<HashMap<TenantId, Usage>>,
}

/// One tenant's share of its shard.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) keys: usize,
    pub(super) bytes: usize,
}

/// Adds to a tenant's usage (negative: takes away); a tenant left with
/// no keys is forgotten, so the map holds only tenants with records.
pub(super) fn tally(tenants: &mut Option<HashMap<TenantId, Usage>>, tenant: TenantId, keys: isize, bytes: isize) {
    let Some(tenants) = tenants else { return };
    let usage = tenants.entry(tenant).or_default();
    usage.keys = usage.keys.saturating_add_signed(keys);
    usage.bytes = usage.bytes.saturating_add_signed(bytes);
    if usage.keys == 0 {
        tenants.remove(&tenant);
    }
}

pub(super) fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

pub(super) struct Entry {
    pub(super) fingerprint: Fingerprint,
    pub(super) state: State,
    pub(super) expires_at: Instant,
}

pub(super) enum State {
    InFlight { fence: Fence },
    Completed { response: Option<StoredResponse> },
    Unknown,
}

impl Entry {
    pub(super) fn size(&self) -> usize {
        match &self.state {
            State::Completed { response: Some(r) } => r.size(),
            _ => 0,
        }
    }

    pub(super) fn to_record(&self, now: Instant) -> Record {
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
    pub(super) fn live(&mut self, key: &ScopedKey, now: Instant) -> Option<&mut Entry> {
        self.map.get_mut(key).filter(|e| e.expires_at > now)
    }

    pub(super) fn remove(&mut self, key: &ScopedKey, budgets: &Budgets) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        budgets.release(&entry);
        tally(&mut self.tenants, key.tenant(), -1, -signed(entry.size()));
        Some(entry)
    }

    /// Inserts a new key's entry and counts it for its tenant (its entry
    /// unit is the caller's to have reserved).
    pub(super) fn insert(&mut self, key: &ScopedKey, entry: Entry) {
        tally(&mut self.tenants, key.tenant(), 1, signed(entry.size()));
        self.expires(entry.expires_at);
        self.map.insert(*key, entry);
    }

    /// Which of `quota`'s limits a new key of `tenant` would pass, if any.
    pub(super) fn over_quota(&self, tenant: TenantId, quota: &TenantQuota) -> Option<QuotaLimit> {
        let usage = self.tenants.as_ref()?.get(&tenant).copied().unwrap_or_default();
        let at = |used: usize, limit: u64| u64::try_from(used).unwrap_or(u64::MAX) >= limit;
        if at(usage.keys, quota.max_keys) {
            Some(QuotaLimit::Keys)
        } else if at(usage.bytes, quota.max_bytes) {
            Some(QuotaLimit::Bytes)
        } else {
            None
        }
    }

    /// Drops expired records. A routine sweep keeps an in-flight record
    /// that lapsed less than `every` ago, so that its request's retry is
    /// still recognised as a takeover; a sweep for room (`every` zero)
    /// drops everything expired.
    pub(super) fn sweep(&mut self, now: Instant, every: Duration, budgets: &Budgets) {
        if self.earliest.is_none_or(|earliest| now < earliest) {
            return;
        }
        let before = self.map.len();
        self.earliest = None;
        let earliest = &mut self.earliest;
        let tenants = &mut self.tenants;
        self.map.retain(|key, e| {
            let lapsed_recently = matches!(e.state, State::InFlight { .. }) && e.expires_at + every > now;
            let keep = e.expires_at > now || lapsed_recently;
            if keep {
                *earliest = earlier(*earliest, e.expires_at);
            } else {
                budgets.release(e);
                tally(tenants, key.tenant(), -1, -signed(e.size()));
            }
            keep
        });
        tracing::debug!(swept = before - self.map.len(), "memory store sweep");
    }

    /// Notes that one of this shard's records now expires at `at`.
    pub(super) fn expires(&mut self, at: Instant) {
        self.earliest = earlier(self.earliest, at);
    }

    /// The live in-flight entry held under `fence`.
    pub(super) fn held(&mut self, key: &ScopedKey, fence: Fence, now: Instant) -> Option<&mut Entry> {
        self.live(key, now).filter(|e| matches!(e.state, State::InFlight { fence: f } if f == fence))
    }
}

pub(super) fn earlier(bound: Option<Instant>, at: Instant) -> Option<Instant> {
    Some(bound.map_or(at, |t| t.min(at)))
}

//! Recent outcomes: how many requests ended in each [`Disposition`] in
//! each of the last [`MINUTES`] wall-clock minutes, for the admin console.
//!
//! Prometheus counters answer "how many since the process started"; an
//! operator looking at a console wants "what happened in the last minutes"
//! without running a Prometheus. This is a fixed ring of one slot per
//! minute, each a counter per outcome: memory is bounded by construction
//! (`MINUTES × outcomes` counters, about 2.5 KiB), whatever the traffic.
//!
//! Recording is one atomic load and one atomic add; only the first request
//! of a new minute takes a lock, to clear the slot it reuses. A request
//! counted while another clears its slot may land in the new minute: the
//! figures are for reading, not for billing. The minutes are the
//! process's wall clock (`SystemTime`), per process: each gateway replica
//! counts its own requests.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Disposition;

/// Minutes kept, the current one included.
pub const MINUTES: usize = 16;

struct Slot {
    /// The minute (since the Unix epoch) the counts belong to.
    minute: AtomicU64,
    counts: [AtomicU64; Disposition::ALL.len()],
}

/// The ring of recent per-minute outcome counts.
pub struct Recent {
    slots: [Slot; MINUTES],
    rollover: Mutex<()>,
}

/// One minute's counts, oldest first in [`Recent::minutes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minute {
    /// The minute's start, in minutes since the Unix epoch.
    pub minute: u64,
    /// Requests per outcome, in the order of [`Disposition::ALL`].
    pub counts: [u64; Disposition::ALL.len()],
}

fn current_minute() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60)
}

impl Recent {
    /// An empty ring.
    pub fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| Slot {
                minute: AtomicU64::new(u64::MAX),
                counts: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
            rollover: Mutex::new(()),
        }
    }

    /// Counts one request that ended in `outcome`, now.
    pub fn record(&self, outcome: Disposition) {
        self.record_at(current_minute(), outcome);
    }

    fn record_at(&self, minute: u64, outcome: Disposition) {
        let slot = &self.slots[(minute % MINUTES as u64) as usize];
        if slot.minute.load(Ordering::Acquire) != minute {
            // A poisoned lock only means another thread panicked while clearing: clear again.
            let _guard = self.rollover.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if slot.minute.load(Ordering::Acquire) != minute {
                for count in &slot.counts {
                    count.store(0, Ordering::Relaxed);
                }
                slot.minute.store(minute, Ordering::Release);
            }
        }
        // `get`, not indexing: a disposition missing from `ALL` goes uncounted rather than panic.
        if let Some(count) = slot.counts.get(outcome as usize) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The last [`MINUTES`] minutes up to now, oldest first, every one
    /// present (zero counts for a minute without requests).
    pub fn minutes(&self) -> Vec<Minute> {
        self.minutes_at(current_minute())
    }

    fn minutes_at(&self, now: u64) -> Vec<Minute> {
        let first = now.saturating_sub(MINUTES as u64 - 1);
        (first..=now)
            .map(|minute| {
                let slot = &self.slots[(minute % MINUTES as u64) as usize];
                let mut counts = [0; Disposition::ALL.len()];
                if slot.minute.load(Ordering::Acquire) == minute {
                    for (out, count) in counts.iter_mut().zip(&slot.counts) {
                        *out = count.load(Ordering::Relaxed);
                    }
                }
                Minute { minute, counts }
            })
            .collect()
    }
}

impl Default for Recent {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(minute: &Minute, outcome: Disposition) -> u64 {
        minute.counts[outcome as usize]
    }

    #[test]
    fn requests_are_counted_in_their_minute_and_outcome() {
        let recent = Recent::new();
        recent.record_at(1000, Disposition::Replayed);
        recent.record_at(1000, Disposition::Replayed);
        recent.record_at(1001, Disposition::Conflict);
        let minutes = recent.minutes_at(1001);
        assert_eq!(minutes.len(), MINUTES);
        assert_eq!(minutes.first().map(|m| m.minute), Some(1001 - MINUTES as u64 + 1));
        let (before, now) = (&minutes[MINUTES - 2], &minutes[MINUTES - 1]);
        assert_eq!((before.minute, now.minute), (1000, 1001));
        assert_eq!(count(before, Disposition::Replayed), 2);
        assert_eq!(count(now, Disposition::Conflict), 1);
        assert_eq!(count(now, Disposition::Replayed), 0);
    }

    #[test]
    fn a_minute_older_than_the_ring_is_forgotten_when_its_slot_is_reused() {
        let recent = Recent::new();
        recent.record_at(1000, Disposition::Mismatch);
        assert_eq!(recent.minutes_at(1000 + MINUTES as u64 - 1)[0].counts[Disposition::Mismatch as usize], 1);
        assert!(recent.minutes_at(1000 + MINUTES as u64).iter().all(|m| m.counts.iter().all(|&c| c == 0)));
        recent.record_at(1000 + MINUTES as u64, Disposition::Held);
        let last = recent.minutes_at(1000 + MINUTES as u64).pop().unwrap();
        assert_eq!(count(&last, Disposition::Mismatch), 0, "the slot was cleared, not added to");
        assert_eq!(count(&last, Disposition::Held), 1);
    }

    #[test]
    fn all_lists_every_disposition_at_its_own_index() {
        use Disposition::*;
        // Exhaustive: a new disposition fails to compile here until it is added to `ALL`.
        let listed = |d: Disposition| match d {
            Passthrough | Forwarded | Released | Replayed | Conflict | Mismatch | MissingKey | InvalidKey
            | AmbiguousTenant | Unauthenticated | StoreError | FailOpen | UpstreamError | TimedOut | Unknown | Held
            | NotReplayable | BadBody | BadHead | Ambiguous | ConnectionBusy | TenantQuota | WebhookSignature
            | WebhookTimestamp | NoRoute => Disposition::ALL.get(d as usize) == Some(&d),
        };
        assert!(Disposition::ALL.iter().all(|&d| listed(d)));
        assert!(listed(NoRoute) && NoRoute as usize == Disposition::ALL.len() - 1);
    }

    #[test]
    fn every_outcome_has_its_own_counter() {
        let recent = Recent::new();
        for outcome in Disposition::ALL {
            recent.record_at(7, outcome);
        }
        let now = recent.minutes_at(7).pop().unwrap();
        assert!(now.counts.iter().all(|&c| c == 1), "{now:?}");
    }
}

//! A budget of entries or bytes shared by every shard of the memory store.
//!
//! Units are reserved *before* they are used and given back when the entry
//! that held them leaves its map, so `used` is exact whenever no insert is
//! half done. A reservation is one compare-and-swap that never lets `used`
//! pass `limit`: two racing inserts cannot both take the last unit. (A
//! `fetch_add` undone by `fetch_sub` on failure cannot overshoot for good
//! either, but until the failed add is undone the counter reads over the
//! limit, and a third caller could be refused while there is room.)

use std::sync::atomic::{AtomicUsize, Ordering};

/// A limit and the units reserved under it.
pub(super) struct Budget {
    limit: usize,
    used: AtomicUsize,
}

// `Relaxed` throughout: the counter guards no other memory (the shard
// mutexes do), and a compare-and-swap on one atomic is totally ordered
// whatever the ordering argument.
impl Budget {
    /// An empty budget of `limit` units.
    pub(super) fn new(limit: usize) -> Self {
        Self { limit, used: AtomicUsize::new(0) }
    }

    /// Takes `amount` units if they fit under the limit; `false` takes none.
    pub(super) fn try_reserve(&self, amount: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(amount).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Gives back units taken with [`Budget::try_reserve`].
    pub(super) fn release(&self, amount: usize) {
        let before =
            self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| Some(used.saturating_sub(amount)));
        // Saturating in release builds: an accounting bug must not wrap the
        // counter and refuse every key from then on.
        debug_assert!(before.is_ok_and(|used| used >= amount), "released more units than were reserved");
    }

    /// Units reserved now.
    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The most units that can be reserved at once.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_fits_under_the_limit_or_takes_nothing() {
        let budget = Budget::new(10);
        assert!(budget.try_reserve(7));
        assert!(!budget.try_reserve(4));
        assert_eq!(budget.used(), 7, "a refused reservation leaves nothing behind");
        assert!(budget.try_reserve(3));
        assert!(!budget.try_reserve(1));
        budget.release(5);
        assert!(budget.try_reserve(5));
        assert_eq!(budget.used(), 10);
        assert!(!budget.try_reserve(usize::MAX), "no overflow past the limit");
    }

    #[test]
    fn racing_reservations_never_pass_the_limit() {
        let budget = Budget::new(1000);
        let taken: usize = std::thread::scope(|scope| {
            let workers: Vec<_> =
                (0..4).map(|_| scope.spawn(|| (0..600).filter(|_| budget.try_reserve(1)).count())).collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(taken, 1000);
        assert_eq!(budget.used(), 1000);
    }
}

//! Holding a lease while work runs, and settling before it lapses.
//!
//! The gateway's attempts hold a lease on their key, the relay's publishes
//! on their row. Both follow one rule, written here once:
//!
//! - while the work runs, the lease is renewed every third of its length
//!   (a tenth, at least 50 ms, after a renewal that failed), so slow work is
//!   never mistaken for dead work; a renewal that finds the lease gone
//!   (fenced out) stops renewing, and the work finishes for its caller;
//! - the work's result is then settled under the lease, and a settlement
//!   that meets a failing database is tried again — pausing 50 ms, doubling
//!   to 250 ms, renewing in between — for as long as one more try can end
//!   before the lease lapses. Giving up earlier would leave the record to
//!   its lease, and the work would run a second time.
//!
//! [`Lease`] counts from the last time the store confirmed it, on tokio's
//! clock, so tests can drive it with `tokio::time::pause`.

use std::time::Duration;

use tokio::time::Instant;

/// A lease of `length`, last confirmed by the store at `confirmed_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    length: Duration,
    confirmed_at: Instant,
}

/// What one renewal found.
#[derive(Debug)]
pub enum Renewal<E> {
    /// The store confirmed the lease.
    Renewed,
    /// Another holder owns it now: renewing stops.
    Lost,
    /// The store could not be asked; the next try comes sooner.
    Failed(E),
}

/// A settlement that could not be made while the lease held.
#[derive(Debug)]
pub struct Abandoned<E> {
    /// The last error.
    pub error: E,
    /// Tries made.
    pub tries: u32,
}

/// The first pause between two tries to settle.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two tries to settle.
const MAX_PAUSE: Duration = Duration::from_millis(250);

impl Lease {
    /// A lease of `length` the store confirmed at `confirmed_at`.
    pub fn new(length: Duration, confirmed_at: Instant) -> Self {
        Self { length, confirmed_at }
    }

    /// When it lapses unless renewed.
    pub fn lapses_at(&self) -> Instant {
        self.confirmed_at + self.length
    }

    /// When the next renewal is due: a third of the way into the lease.
    fn next_renewal(&self) -> Instant {
        self.confirmed_at + self.length / 3
    }

    /// After a failed renewal, the next try: a tenth of the lease, at least 50 ms.
    fn after_failure(&self, now: Instant) -> Instant {
        now + (self.length / 10).max(Duration::from_millis(50))
    }

    /// Runs `work` while renewing the lease with `renew` (`Ok(true)`:
    /// renewed, `Ok(false)`: lost, `Err`: try again sooner); `observe` hears
    /// every renewal (to log and count). Returns what `work` returns.
    pub async fn renewing<T, E, R, RenewFut>(
        &mut self,
        work: impl Future<Output = T>,
        mut renew: R,
        mut observe: impl FnMut(&Renewal<E>),
    ) -> T
    where
        R: FnMut() -> RenewFut,
        RenewFut: Future<Output = Result<bool, E>>,
    {
        tokio::pin!(work);
        let mut held = true;
        let mut next = self.next_renewal();
        loop {
            let renewal = async {
                tokio::time::sleep_until(next).await;
                let asked = Instant::now();
                (asked, renew().await)
            };
            tokio::select! {
                output = &mut work => return output,
                (asked, renewed) = renewal, if held => {
                    let renewal = match renewed {
                        Ok(true) => {
                            self.confirmed_at = asked;
                            next = self.next_renewal();
                            Renewal::Renewed
                        }
                        Ok(false) => {
                            held = false;
                            Renewal::Lost
                        }
                        Err(e) => {
                            next = self.after_failure(Instant::now());
                            Renewal::Failed(e)
                        }
                    };
                    observe(&renewal);
                }
            }
        }
    }

    /// Tries `settle` until it succeeds, or until one more try (taking at
    /// most `one_try`) could not end before the lease lapses; between tries
    /// it pauses and renews the lease with `renew`. `failed` hears each
    /// failed try with its number.
    pub async fn settle<T, E, S, SettleFut, R, RenewFut, RE>(
        &mut self,
        one_try: Duration,
        mut settle: S,
        mut renew: R,
        mut failed: impl FnMut(&E, u32),
    ) -> Result<T, Abandoned<E>>
    where
        S: FnMut() -> SettleFut,
        SettleFut: Future<Output = Result<T, E>>,
        R: FnMut() -> RenewFut,
        RenewFut: Future<Output = Result<bool, RE>>,
    {
        let mut pause = FIRST_PAUSE;
        let mut tries = 0;
        loop {
            tries += 1;
            let error = match settle().await {
                Ok(settled) => return Ok(settled),
                Err(error) => error,
            };
            failed(&error, tries);
            let room = self.lapses_at().saturating_duration_since(Instant::now() + one_try);
            if room.is_zero() {
                return Err(Abandoned { error, tries });
            }
            // Short pauses: a store that blinks twice may be up for well
            // under a second in between, and that window must not be missed.
            tokio::time::sleep(pause.min(room)).await;
            pause = (pause * 2).min(MAX_PAUSE);
            let asked = Instant::now();
            if let Ok(true) = renew().await {
                self.confirmed_at = asked;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const LEASE: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn slow_work_keeps_its_lease_renewed_every_third_of_it() {
        let mut lease = Lease::new(LEASE, Instant::now());
        let renewals = Cell::new(0);
        let renew = || async {
            renewals.set(renewals.get() + 1);
            Ok::<_, ()>(true)
        };
        let work = tokio::time::sleep(Duration::from_millis(3500));
        lease.renewing(work, renew, |_| {}).await;
        assert_eq!(renewals.get(), 3, "at 1 s, 2 s and 3 s");
        assert_eq!(lease.lapses_at(), Instant::now() - Duration::from_millis(500) + LEASE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_stops_renewing_and_a_failed_renewal_is_retried_sooner() {
        let mut lease = Lease::new(LEASE, Instant::now());
        let asked = Cell::new(Vec::new());
        let started = Instant::now();
        let renew = || {
            let mut seen = asked.take();
            seen.push(started.elapsed());
            let answer = match seen.len() {
                1 => Err("blip"),
                2 => Ok(true),
                _ => Ok(false),
            };
            asked.set(seen);
            async move { answer }
        };
        let mut heard = Vec::new();
        lease.renewing(tokio::time::sleep(Duration::from_secs(10)), renew, |r| heard.push(format!("{r:?}"))).await;
        let asked = asked.take();
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(asked, vec![ms(1000), ms(1300), ms(2300)], "a tenth after the blip, a third after the renewal");
        assert_eq!(heard, ["Failed(\"blip\")", "Renewed", "Lost"], "and no renewal after the loss");
    }

    #[tokio::test(start_paused = true)]
    async fn a_settlement_is_retried_while_the_lease_holds_then_abandoned() {
        let mut lease = Lease::new(LEASE, Instant::now());
        let tries = Cell::new(0u32);
        let settle = || {
            tries.set(tries.get() + 1);
            async { Err::<(), _>("down") }
        };
        let refuse_renewal = || async { Err::<bool, ()>(()) };
        let abandoned = lease.settle(Duration::from_millis(500), settle, refuse_renewal, |_, _| {}).await.unwrap_err();
        assert_eq!(abandoned.tries, tries.get());
        assert!(Instant::now() + Duration::from_millis(500) >= lease.lapses_at(), "no room was left for another try");
        assert!(Instant::now() < lease.lapses_at(), "the last try ended before the lease lapsed");
        assert!(abandoned.tries > 5, "tried all along: {} tries", abandoned.tries);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settlement_that_succeeds_after_a_blip_renews_the_lease_in_between() {
        let mut lease = Lease::new(LEASE, Instant::now());
        let tries = Cell::new(0u32);
        let settle = || {
            tries.set(tries.get() + 1);
            let answer = if tries.get() < 3 { Err("blip") } else { Ok("settled") };
            async move { answer }
        };
        let renew = || async { Ok::<_, ()>(true) };
        let before = lease.lapses_at();
        assert_eq!(lease.settle(Duration::from_millis(500), settle, renew, |_, _| {}).await.unwrap(), "settled");
        assert_eq!(tries.get(), 3);
        assert_eq!(lease.lapses_at(), before + Duration::from_millis(50 + 100), "renewed after each pause");
    }
}

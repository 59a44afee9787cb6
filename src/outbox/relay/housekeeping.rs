//! Housekeeping beside the lanes, in a task of its own, each job on its
//! own schedule so that none waits behind a publish or behind another job:
//!
//! - the **reaper** returns expired leases every `reap_interval`;
//! - the **census** ([`crate::outbox::census`]) sets the backlog gauges
//!   and reports rows no lane will claim, every `poll_interval` but at
//!   most once per [`CENSUS_MIN_PAUSE`]. It counts the whole table, so on a
//!   large backlog it waits longer:
//!   after a run that took `t`, at least `CENSUS_DUTY × t`, which keeps it
//!   under a tenth of one connection's time;
//! - **history retention** runs at start and hourly.
//!
//! Rows for a destination this relay does not have (*unroutable*) show in
//! `idemgate_outbox_rows{state="unroutable"}` and the oldest-age gauge, and
//! in a warning naming the destination — once per destination per
//! [`UNROUTABLE_WARN_EVERY`], not on every census. Their names come from
//! enqueued data, so at most [`UNROUTABLE_EXPORTED`] of them (those waiting
//! longest) get gauges at a time, a name leaves the gauges when its rows
//! do, and `idemgate_outbox_unroutable_destinations` counts them all.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Relay;
use crate::outbox::publisher::Publisher;
use crate::outbox::{OutboxError, census, claim};

/// How many unroutable destinations get gauges at a time.
pub(super) const UNROUTABLE_EXPORTED: usize = 16;
/// How often one unroutable destination is warned about.
pub(super) const UNROUTABLE_WARN_EVERY: Duration = Duration::from_secs(300);
/// How often the history retention job runs.
const RETAIN_EVERY: Duration = Duration::from_secs(3600);
/// The census waits at least this many times as long as its last run took.
const CENSUS_DUTY: u32 = 10;
/// The census runs at most this often, however short `poll_interval` is: it
/// shares the pool with claims and lease renewals.
const CENSUS_MIN_PAUSE: Duration = Duration::from_secs(1);

/// What the census exported and warned about, between runs.
#[derive(Default)]
pub(super) struct CensusWatch(Mutex<Watched>);

#[derive(Default)]
struct Watched {
    /// Unroutable destinations that have gauges now.
    exported: BTreeSet<String>,
    /// When each unroutable destination was last warned about.
    warned: HashMap<String, Instant>,
    /// When the unlisted rest was last warned about.
    warned_unlisted: Option<Instant>,
}

/// The names of `present` to warn about at `now`: those not warned about
/// within `every`. Names no longer present are forgotten, so the map stays
/// as small as the listing.
fn due_warnings(warned: &mut HashMap<String, Instant>, present: &[&str], now: Instant, every: Duration) -> Vec<String> {
    warned.retain(|name, _| present.contains(&name.as_str()));
    let mut due = Vec::new();
    for name in present {
        if warned.get(*name).is_none_or(|at| now.duration_since(*at) >= every) {
            warned.insert((*name).to_owned(), now);
            due.push((*name).to_owned());
        }
    }
    due
}

fn seconds(age: Duration) -> i64 {
    i64::try_from(age.as_secs()).unwrap_or(i64::MAX)
}

/// `work`, unless `stop` comes first.
async fn until_stopped<T>(stop: &CancellationToken, work: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        value = work => Some(value),
        () = stop.cancelled() => None,
    }
}

/// Sleeps `pause`; `false` if `stop` came first.
async fn paused(stop: &CancellationToken, pause: Duration) -> bool {
    until_stopped(stop, tokio::time::sleep(pause)).await.is_some()
}

impl<P: Publisher> Relay<P> {
    /// The reaper, the census and retention, until `stop`.
    pub(super) async fn housekeeping(self, stop: CancellationToken) {
        tokio::join!(self.reaper(&stop), self.gauges(&stop), self.retention(&stop));
    }

    async fn reaper(&self, stop: &CancellationToken) {
        loop {
            match until_stopped(stop, self.reap()).await {
                None => return,
                Some(Ok(0)) => {}
                Some(Ok(n)) => tracing::info!(rows = n, "returned expired outbox leases"),
                Some(Err(e)) => tracing::warn!(error = %e, "outbox reaper failed"),
            }
            if !paused(stop, self.inner.settings.reap_interval).await {
                return;
            }
        }
    }

    async fn gauges(&self, stop: &CancellationToken) {
        loop {
            let started = Instant::now();
            match until_stopped(stop, self.census()).await {
                None => return,
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "outbox gauges not refreshed"),
            }
            let pause = self.inner.settings.poll_interval.max(CENSUS_MIN_PAUSE).max(started.elapsed() * CENSUS_DUTY);
            if !paused(stop, pause).await {
                return;
            }
        }
    }

    async fn retention(&self, stop: &CancellationToken) {
        loop {
            let retained = claim::maintain_history(&self.inner.db, self.inner.settings.history_retention);
            match until_stopped(stop, retained).await {
                None => return,
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "outbox history retention failed"),
            }
            if !paused(stop, RETAIN_EVERY).await {
                return;
            }
        }
    }

    /// One census: sets the gauges and warns about unroutable rows.
    pub(super) async fn census(&self) -> Result<(), OutboxError> {
        let census = census::census(&self.inner.db, &self.inner.destinations, UNROUTABLE_EXPORTED).await?;
        let m = &self.inner.metrics;
        for destination in &self.inner.destinations {
            let row = census.configured.iter().find(|b| &b.destination == destination);
            for (state, count) in [
                ("ready", row.map_or(0, |b| b.ready)),
                ("leased", row.map_or(0, |b| b.leased)),
                ("dead", row.map_or(0, |b| b.dead)),
            ] {
                m.outbox_rows.with_label_values(&[destination.as_str(), state]).set(count);
            }
            let age = row.map_or(Duration::ZERO, |b| b.oldest_ready_age);
            m.outbox_oldest_ready_age.with_label_values(&[destination.as_str()]).set(seconds(age));
        }
        let mut watched = self.inner.census.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let present: BTreeSet<String> = census.unroutable.iter().map(|b| b.destination.clone()).collect();
        for gone in watched.exported.difference(&present) {
            let _ = m.outbox_rows.remove_label_values(&[gone.as_str(), "unroutable"]);
            let _ = m.outbox_oldest_ready_age.remove_label_values(&[gone.as_str()]);
        }
        for b in &census.unroutable {
            m.outbox_rows.with_label_values(&[b.destination.as_str(), "unroutable"]).set(b.ready);
            m.outbox_oldest_ready_age.with_label_values(&[b.destination.as_str()]).set(seconds(b.oldest_ready_age));
        }
        watched.exported = present;
        m.outbox_unroutable_destinations.set(census.unroutable_destinations);

        let now = Instant::now();
        let names: Vec<&str> = census.unroutable.iter().map(|b| b.destination.as_str()).collect();
        for name in due_warnings(&mut watched.warned, &names, now, UNROUTABLE_WARN_EVERY) {
            let Some(b) = census.unroutable.iter().find(|b| b.destination == name) else { continue };
            // `?`: the name comes from enqueued data, so it is logged escaped.
            tracing::warn!(
                destination = ?b.destination,
                rows = b.ready,
                oldest_age_s = b.oldest_ready_age.as_secs(),
                "outbox rows wait for a destination this relay does not have; they keep their place (and hold their ordering keys) until a relay configured with it delivers them"
            );
        }
        let unlisted = census.unroutable_destinations - i64::try_from(names.len()).unwrap_or(i64::MAX);
        if unlisted <= 0 {
            watched.warned_unlisted = None;
        } else if watched.warned_unlisted.is_none_or(|at| now.duration_since(at) >= UNROUTABLE_WARN_EVERY) {
            watched.warned_unlisted = Some(now);
            tracing::warn!(
                destinations = unlisted,
                "more outbox destinations this relay does not have; see GET /admin/outbox/unroutable"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unroutable_destination_is_warned_about_once_per_period() {
        let mut warned = HashMap::new();
        let start = Instant::now();
        let every = Duration::from_secs(300);
        assert_eq!(due_warnings(&mut warned, &["sms"], start, every), ["sms"]);
        assert!(due_warnings(&mut warned, &["sms"], start + Duration::from_secs(1), every).is_empty());
        assert_eq!(due_warnings(&mut warned, &["sms", "fax"], start + Duration::from_secs(2), every), ["fax"]);
        assert_eq!(due_warnings(&mut warned, &["sms"], start + every, every), ["sms"]);
    }

    #[test]
    fn a_destination_whose_rows_left_is_forgotten_and_warned_about_again_when_they_return() {
        let mut warned = HashMap::new();
        let start = Instant::now();
        let every = Duration::from_secs(300);
        due_warnings(&mut warned, &["sms"], start, every);
        assert!(due_warnings(&mut warned, &[], start, every).is_empty());
        assert!(warned.is_empty());
        assert_eq!(due_warnings(&mut warned, &["sms"], start + Duration::from_secs(1), every), ["sms"]);
    }
}

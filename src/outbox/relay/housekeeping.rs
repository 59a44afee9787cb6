//! Housekeeping beside the lanes, in a task of its own, each job on its
//! own schedule so that none waits behind a publish or behind another job:
//!
//! - the **reaper** returns expired leases every `reap_interval`;
//! - the **census** ([`crate::outbox::census`]) sets the backlog gauges
//!   every `poll_interval`, but at most once per [`CENSUS_MIN_PAUSE`]. It
//!   counts the whole table, so on a large backlog it waits longer:
//!   after a run that took `t`, at least `CENSUS_DUTY × t`, which keeps it
//!   under a tenth of one connection's time;
//! - **history retention** runs at start and hourly.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Relay;
use crate::outbox::publisher::Publisher;
use crate::outbox::{OutboxError, census, claim};

/// How often the history retention job runs.
const RETAIN_EVERY: Duration = Duration::from_secs(3600);
/// The census waits at least this many times as long as its last run took.
const CENSUS_DUTY: u32 = 10;
/// The census runs at most this often, however short `poll_interval` is: it
/// shares the pool with claims and lease renewals.
const CENSUS_MIN_PAUSE: Duration = Duration::from_secs(1);

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

    /// One census: sets the backlog gauges.
    pub(super) async fn census(&self) -> Result<(), OutboxError> {
        let census = census::census(&self.inner.db, &self.inner.destinations).await?;
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
        Ok(())
    }
}

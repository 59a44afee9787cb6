//! The relay: claim due rows, publish them, record what happened.
//!
//! [`Relay::run`] is the service, built so that nothing one destination
//! does can hold up another ([`lanes`]):
//!
//! - every destination has a **lane** of its own: its own claims, at most
//!   `max_in_flight` of its rows in flight, an equal share of
//!   `max_in_flight_bytes`, and its own recording of deliveries. A lane
//!   claims again as soon as it has room, so a slow publish holds its own
//!   slot and nothing else (no step waits for the slowest row of a claim);
//! - **housekeeping** — the reaper every `reap_interval`, the backlog
//!   gauges and the unroutable census about every `poll_interval`, history
//!   retention at start and hourly — runs in a task of its own
//!   ([`housekeeping`]), never behind a publish;
//! - a `NOTIFY` ([`super::listen`]) wakes the lanes; polling always runs
//!   as well, so a lost notification only costs latency;
//! - on shutdown the lanes stop claiming and let what they hold finish
//!   (each publish is bounded by its destination's timeout; the whole drain
//!   by one `lease`, as a database that stops answering bounds nothing).
//!
//! [`Relay::try_execute_step`] is one step of the same lanes, for tests:
//! each lane takes one claim step — the one its loop in `run` repeats —
//! through the same publishes and the same recorder, and the step returns
//! once all it claimed is settled, so a test drives the relay without
//! sleeping and exercises the code production runs.
//!
//! One attempt at a row passes through one type per stage:
//! [`Delivery`] (what the publisher reports), [`super::retry::Next`]
//! (what the retry policy makes of it: complete, retry in, or bury),
//! `Fate` (how the attempt ended once the database has it: delivered,
//! retried, dead, lost, or an error; what the metrics count), and
//! [`Outcome`] (a step's tally of fates).
//!
//! [`start`] builds a relay from the config without touching the
//! database, and waits for the database (and checks its schema) in the
//! background, so `relay` and `serve --relay` start while it is down.
//!
//! Leases follow [`crate::lease`], as the gateway's do. A settlement
//! (complete, retry, bury) that fails on a database error is tried again —
//! 50 ms, doubling to 250 ms, renewing in between — while the lease holds
//! (a delivered row's lease, no longer renewed once its publish is over, is
//! the bound for its completion); after that the row waits out its lease
//! and is claimed again (published again, under its key).
//!
//! While a publish runs, its lease is renewed every third of `lease`, so a
//! slow destination is never mistaken for a dead relay. A renewal that finds
//! the claim gone (the lease ran out and was reaped) is counted as lost;
//! the publish is left to finish, and its settlement then changes nothing.
//!
//! Metrics (shared with the gateway under `serve --relay`): attempts by
//! destination and outcome, publish latency, enqueue-to-delivery latency
//! (database clock), lost leases, publishes in flight, and — from the
//! census — rows per destination and state (`unroutable` for rows of a
//! destination this relay does not have) and the oldest waiting row's age.
//!
//! A claimed row whose attempt count is already past `max_attempts` (its
//! earlier attempts ended in expired leases: a relay crashed, or the
//! message crashes relays) is buried without another publish.

mod housekeeping;
mod lanes;
mod settings;
pub mod start;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::claim::{self, Claimed};
use super::publisher::{Delivery, Publisher};
use super::retry::RetryPolicy;
use super::{Database, OutboxError};
use crate::lease::{Lease, Renewal, SettleBounds};
use crate::metrics::Metrics;

pub use settings::Settings;
pub use start::Readiness;

/// What one step did: the tally of its attempts' fates.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows delivered and recorded.
    pub delivered: usize,
    /// Rows scheduled for another attempt.
    pub retried: usize,
    /// Rows marked dead.
    pub dead: usize,
    /// Rows whose claim was lost before they were settled.
    pub lost: usize,
    /// Rows whose settlement failed (the lease will expire and they return).
    pub errors: usize,
}

/// How one attempt at a row ended, once the database has it (or could not
/// be told): what the metrics and an [`Outcome`] count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Delivered,
    Retried,
    Dead,
    Lost,
    Error,
}

impl Outcome {
    fn add(&mut self, fate: Fate) {
        match fate {
            Fate::Delivered => self.delivered += 1,
            Fate::Retried => self.retried += 1,
            Fate::Dead => self.dead += 1,
            Fate::Lost => self.lost += 1,
            Fate::Error => self.errors += 1,
        }
    }
}

impl std::ops::AddAssign for Outcome {
    fn add_assign(&mut self, other: Self) {
        self.claimed += other.claimed;
        self.delivered += other.delivered;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lost += other.lost;
        self.errors += other.errors;
    }
}

struct Inner<P> {
    db: Database,
    publisher: P,
    policies: BTreeMap<String, RetryPolicy>,
    destinations: Vec<String>,
    settings: Settings,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    census: housekeeping::CensusWatch,
}

/// A relay serving the destinations it has policies for. Cheap to clone.
pub struct Relay<P> {
    inner: Arc<Inner<P>>,
}

impl<P> Clone for Relay<P> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

impl<P: Publisher> Relay<P> {
    /// A relay that claims only rows of the destinations in `policies`.
    pub fn new(db: Database, publisher: P, policies: BTreeMap<String, RetryPolicy>, settings: Settings) -> Self {
        let destinations = policies.keys().cloned().collect();
        let inner = Inner {
            db,
            publisher,
            policies,
            destinations,
            settings,
            metrics: Arc::new(Metrics::new()),
            readiness: Arc::default(),
            census: housekeeping::CensusWatch::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Reports into `metrics` (call before the relay is cloned or run).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.metrics = metrics;
        }
        self
    }

    /// The metrics it reports into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The database it uses.
    pub fn database(&self) -> &Database {
        &self.inner.db
    }

    /// The destinations it serves.
    pub fn destinations(&self) -> &[String] {
        &self.inner.destinations
    }

    /// Whether it has reached its database and found the schema current.
    pub fn readiness(&self) -> &Arc<Readiness> {
        &self.inner.readiness
    }

    /// Sets the backlog gauges (and the unroutable ones) from the
    /// database, and warns about unroutable rows (see [`housekeeping`]).
    pub async fn refresh_gauges(&self) -> Result<(), OutboxError> {
        self.census().await
    }

    /// Returns expired leases to the queue.
    pub async fn reap(&self) -> Result<u64, OutboxError> {
        claim::reap_expired(&self.inner.db).await
    }

    /// Records the deliveries of published rows in one statement, under the
    /// earliest-lapsing of their leases. A failure is tried again while that
    /// lease holds: giving up means the rows wait out their leases and go
    /// out twice. (Their leases are no longer renewed: each was published
    /// and is only waiting for this statement.)
    async fn complete(&self, rows: &[Claimed], leases: impl IntoIterator<Item = Lease>) -> Vec<Fate> {
        let Some(mut lease) = leases.into_iter().min_by_key(Lease::lapses_at) else {
            return Vec::new();
        };
        let fences: Vec<_> = rows.iter().map(|r| r.fence).collect();
        let db = &self.inner.db;
        let record = |_| claim::complete_batch(db, &fences);
        let nothing_to_renew = || async { Ok::<_, OutboxError>(false) };
        let done = lease.settle(self.settle_bounds(), record, nothing_to_renew, ()).await.map_err(|a| a.error);
        let done: BTreeMap<i64, Duration> = match done {
            Ok(done) => done.into_iter().collect(),
            Err(e) => {
                tracing::warn!(rows = rows.len(), error = %e, "cannot record outbox deliveries; their leases will expire");
                return rows.iter().map(|row| self.record(row, Ok(Fate::Error))).collect();
            }
        };
        rows.iter()
            .map(|row| match done.get(&row.fence.id) {
                Some(waited) => {
                    let histogram = &self.inner.metrics.outbox_commit_to_delivery;
                    histogram.with_label_values(&[row.destination.as_str()]).observe(waited.as_secs_f64());
                    self.record(row, Ok(Fate::Delivered))
                }
                None => self.record(row, Ok(Fate::Lost)),
            })
            .collect()
    }

    /// Counts a settled attempt in the metrics (and logs a failed settlement).
    fn record(&self, row: &Claimed, settled: Result<Fate, OutboxError>) -> Fate {
        let outcome = match &settled {
            Ok(Fate::Delivered) => "delivered",
            Ok(Fate::Retried) => "retried",
            Ok(Fate::Dead) => "dead",
            Ok(Fate::Lost) => "lease_lost",
            Err(_) | Ok(Fate::Error) => "error",
        };
        self.inner.metrics.outbox_attempts.with_label_values(&[row.destination.as_str(), outcome]).inc();
        if matches!(settled, Ok(Fate::Lost)) {
            self.inner.metrics.outbox_lease_lost.inc();
        }
        match settled {
            Ok(settled) => settled,
            Err(e) => {
                tracing::warn!(id = row.fence.id, trace_id = row.trace_id(), error = %e, "cannot record an outbox attempt; its lease will expire");
                Fate::Error
            }
        }
    }

    /// Schedules a failed row's next attempt in `retry_in`, or (`None`) buries it.
    async fn settle_failure(
        &self,
        row: &Claimed,
        retry_in: Option<Duration>,
        reason: &str,
    ) -> Result<Fate, OutboxError> {
        let pool = &self.inner.db;
        let lost_unless = |ok: bool, settled: Fate| if ok { settled } else { Fate::Lost };
        match retry_in {
            Some(delay) => {
                tracing::debug!(id = row.fence.id, trace_id = row.trace_id(), ?delay, %reason, "outbox attempt failed; retrying");
                Ok(lost_unless(claim::retry(pool, row.fence, delay, reason).await?, Fate::Retried))
            }
            None => {
                tracing::warn!(id = row.fence.id, trace_id = row.trace_id(), destination = %row.destination, %reason, "outbox row is dead");
                Ok(lost_unless(claim::bury(pool, row.fence, reason).await?, Fate::Dead))
            }
        }
    }

    /// Renews `row`'s lease: `Ok(false)` once another claim owns the row.
    async fn renew(&self, row: &Claimed) -> Result<bool, OutboxError> {
        claim::renew(&self.inner.db, row.fence, self.inner.settings.lease).await
    }

    /// The room a settlement keeps before its lease lapses for one more try:
    /// a tenth of the lease (statements have no client-side timeout; a try
    /// that still overruns is fenced on `attempts` like any other).
    /// Settlements stop at the lapse: past it the reaper hands the row on.
    /// A statement has no client-side timeout here, so the bound on one try
    /// is not applied (see RELIABILITY.md, "Not yet measured").
    fn settle_bounds(&self) -> SettleBounds {
        SettleBounds { one_try: self.inner.settings.lease / 10, until: None }
    }

    /// Waits for a slot of `slots` and publishes, renewing the
    /// lease throughout; returns the attempt and the lease as last renewed.
    async fn publish_renewing(&self, row: &Claimed, slots: &Semaphore) -> (Delivery, Lease) {
        // Counted from now, not from the claim: the claim is moments old,
        // and renewing a third of the way in leaves ample room either way.
        let mut lease = Lease::new(self.inner.settings.lease, Instant::now());
        let publish = async {
            let _slot = slots.acquire().await.ok();
            let m = &self.inner.metrics;
            let in_flight = m.outbox_in_flight.with_label_values(&[row.destination.as_str()]);
            in_flight.inc();
            let started = Instant::now();
            let attempt = self.inner.publisher.publish(row).await;
            m.outbox_publish_latency
                .with_label_values(&[row.destination.as_str()])
                .observe(started.elapsed().as_secs_f64());
            in_flight.dec();
            attempt
        };
        let observe = |renewal: &Renewal<OutboxError>| match renewal {
            Renewal::Renewed => {}
            Renewal::Lost => {
                tracing::warn!(id = row.fence.id, trace_id = row.trace_id(), "outbox lease lost during a publish")
            }
            Renewal::Failed(e) => {
                tracing::warn!(id = row.fence.id, trace_id = row.trace_id(), error = %e, "cannot renew an outbox lease")
            }
        };
        let attempt = lease.renewing(publish, || self.renew(row), observe).await;
        (attempt, lease)
    }
}

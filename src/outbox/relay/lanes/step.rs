//! A lane's claim step and the work it starts: the step [`Relay::run`]'s
//! lanes repeat and [`Relay::try_execute_step`] takes once per lane, so the
//! code the tests drive is the code production runs.
//!
//! [`LaneTasks::claim`] is the step: one claim within the limits [`plan`]
//! gave, each row handed to a publish task of its own ([`Relay::deliver`]).
//! A failed attempt is settled by its task; a delivered row goes to the
//! lane's recorder ([`Relay::record_deliveries`]). [`LaneTasks::finish`]
//! waits until every row claimed is settled and returns the tally.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;

use super::{Lane, Plan, plan};
use crate::lease::Lease;
use crate::outbox::OutboxError;
use crate::outbox::claim::{self, Claimed, Limits, Payload};
use crate::outbox::publisher::Publisher;
use crate::outbox::relay::{Fate, Outcome, Relay};
use crate::outbox::retry::Next;

/// The most deliveries one recording statement writes.
const MAX_RECORDED_TOGETHER: usize = 1024;

/// A delivered row waiting for the recorder, holding its place among the
/// unsettled, under its lease.
struct Published {
    row: Claimed,
    lease: Lease,
    unsettled: OwnedSemaphorePermit,
}

/// A lane's work under way: the publishes its claims started, its
/// recorder, and the tally of what has settled.
pub(super) struct LaneTasks<P> {
    relay: Relay<P>,
    lane: Arc<Lane>,
    /// Each publish's fate, unless it went to the recorder.
    publishes: JoinSet<Option<Fate>>,
    delivered: mpsc::UnboundedSender<Published>,
    recorder: AbortOnDropHandle<Outcome>,
    outcome: Outcome,
}

impl<P: Publisher> LaneTasks<P> {
    /// Starts `lane`'s recorder; nothing is claimed yet.
    pub(super) fn start(relay: Relay<P>, lane: Arc<Lane>) -> Self {
        let (delivered, recorded) = mpsc::unbounded_channel();
        let recorder = AbortOnDropHandle::new(tokio::spawn(relay.clone().record_deliveries(lane.clone(), recorded)));
        Self { relay, lane, publishes: JoinSet::new(), delivered, recorder, outcome: Outcome::default() }
    }

    /// The step: claims within `limits` (from [`plan`]) and starts a
    /// publish for each row claimed. Returns how many rows that was, or
    /// `None` when the places `limits` asks for were not free (nothing was
    /// claimed, and nothing asked of the database).
    pub(super) async fn claim(&mut self, limits: Limits) -> Result<Option<usize>, OutboxError> {
        let lane = &self.lane;
        // Only the lane's own loop claims, so what `plan` saw free is still free.
        let Ok(mut places) = lane.unsettled.clone().try_acquire_many_owned(limits.rows) else { return Ok(None) };
        let inner = &self.relay.inner;
        let claimed = claim::claim_within(&inner.db, &lane.destination, limits, inner.settings.lease).await?;
        let count = claimed.len();
        self.outcome.claimed += count;
        for row in claimed {
            let Some(place) = places.split(1) else { break };
            let wanted = u32::try_from(row.payload.len()).unwrap_or(u32::MAX);
            let available = u32::try_from(lane.bytes.available_permits()).unwrap_or(u32::MAX);
            // The claim kept within the free bytes (or took one row alone): this never waits.
            let bytes = lane.bytes.clone().try_acquire_many_owned(wanted.min(available)).ok();
            let delivery = self.relay.clone().deliver(lane.clone(), row, place, bytes, self.delivered.clone());
            self.publishes.spawn(delivery);
        }
        Ok(Some(count))
    }

    /// Counts the publishes that have ended.
    pub(super) fn reap(&mut self) {
        while let Some(ended) = self.publishes.try_join_next() {
            self.count(ended);
        }
    }

    /// Waits until every row claimed is settled — its publish ended and
    /// its delivery recorded, or it was retried, buried or found lost —
    /// and returns what all the steps did.
    pub(super) async fn finish(mut self) -> Outcome {
        while let Some(ended) = self.publishes.join_next().await {
            self.count(ended);
        }
        drop(self.delivered);
        match self.recorder.await {
            Ok(recorded) => self.outcome += recorded,
            Err(e) => tracing::warn!(error = %e, "an outbox lane's recorder ended early; its rows' leases will expire"),
        }
        self.outcome
    }

    fn count(&mut self, ended: Result<Option<Fate>, tokio::task::JoinError>) {
        match ended {
            Ok(Some(fate)) => self.outcome.add(fate),
            Ok(None) => {} // the recorder counts it
            Err(_) => self.outcome.errors += 1,
        }
    }
}

impl<P: Publisher> Relay<P> {
    /// One step, as a test drives the relay: every lane takes one claim
    /// step — the one [`Self::run`]'s lanes repeat: at most `batch_size`
    /// rows and the lane's share of the byte budgets — and the step returns
    /// once everything claimed is settled, with the tally. Deliveries are
    /// recorded by each lane's recorder, as in production.
    ///
    /// Fails only if a claim does, once what the other lanes claimed has settled.
    pub async fn try_execute_step(&self) -> Result<Outcome, OutboxError> {
        let settings = self.inner.settings;
        let mut started = Vec::new();
        let mut failed = None;
        for lane in self.lanes() {
            let mut tasks = LaneTasks::start(self.clone(), lane.clone());
            // A new lane has all its room: its plan is a whole claim.
            let claimed = match plan(&settings, lane.room()) {
                Plan::Claim(limits) | Plan::Linger(limits) => tasks.claim(limits).await,
                Plan::Wait => Ok(None),
            };
            if let Err(e) = claimed {
                failed.get_or_insert(e);
            }
            started.push(tasks);
        }
        let mut outcome = Outcome::default();
        for tasks in started {
            outcome += tasks.finish().await;
        }
        failed.map_or(Ok(outcome), Err)
    }

    /// Publishes one claimed row (once a slot of its lane is free) and
    /// settles it, or hands it to the lane's recorder. `place` and `bytes`
    /// are its share of the lane. The attempt's fate, unless the recorder
    /// has the row.
    ///
    /// A claimed row whose attempt count is already past `max_attempts` is
    /// buried without another publish.
    async fn deliver(
        self,
        lane: Arc<Lane>,
        mut row: Claimed,
        place: OwnedSemaphorePermit,
        bytes: Option<OwnedSemaphorePermit>,
        recorder: mpsc::UnboundedSender<Published>,
    ) -> Option<Fate> {
        let settled = match self.inner.policies.get(&row.destination).copied() {
            None => Ok(Fate::Error), // unreachable: the claim filters by destination
            Some(policy) if row.attempt > policy.max_attempts => {
                let reason = "attempts exhausted: earlier attempts ended without a result (expired leases)";
                claim::bury(&self.inner.db, row.fence, reason).await.map(|ok| if ok { Fate::Dead } else { Fate::Lost })
            }
            Some(policy) => {
                // A lease lost mid-publish shows again in the fenced settlement.
                let (delivery, mut lease) = self.publish_renewing(&row, &lane.slots).await;
                let retry_in = match policy.decide(&delivery, row.attempt, rand::random()) {
                    Next::Complete => {
                        row.payload = Payload::default();
                        row.headers = Vec::new();
                        // The destination has answered and the payload is dropped: its bytes are free.
                        drop(bytes);
                        // Fails only once the recorder is gone (the relay was dropped): the lease then expires.
                        let _ = recorder.send(Published { row, lease, unsettled: place });
                        return None;
                    }
                    Next::RetryIn(delay) => Some(delay),
                    Next::Dead => None,
                };
                let reason = delivery.reason().unwrap_or_default();
                // A settlement that fails on a database hiccup is tried again
                // while the lease holds.
                let settle = |_| self.settle_failure(&row, retry_in, reason);
                lease.settle(self.settle_bounds(), settle, || self.renew(&row), ()).await.map_err(|a| a.error)
            }
        };
        let fate = self.record(&row, settled);
        // Settled: its place and bytes are free, and its key's next row may be due.
        drop((row, bytes, place));
        lane.wake.notify_one();
        Some(fate)
    }

    /// Records a lane's deliveries, as many together as have finished,
    /// until its lane is done; returns what became of them.
    async fn record_deliveries(self, lane: Arc<Lane>, mut recorded: mpsc::UnboundedReceiver<Published>) -> Outcome {
        let mut outcome = Outcome::default();
        let mut batch = Vec::new();
        while recorded.recv_many(&mut batch, MAX_RECORDED_TOGETHER).await > 0 {
            let leases: Vec<Lease> = batch.iter().map(|published| published.lease).collect();
            let (rows, places): (Vec<Claimed>, Vec<OwnedSemaphorePermit>) =
                batch.drain(..).map(|published| (published.row, published.unsettled)).unzip();
            for fate in self.complete(&rows, leases).await {
                outcome.add(fate);
            }
            // Only now are they settled: the rows left the outbox (or their claims were found lost).
            drop(places);
            lane.wake.notify_one();
        }
        outcome
    }
}

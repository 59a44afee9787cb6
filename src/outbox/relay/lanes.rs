//! [`Relay::run`]: one lane per destination, so a slow or failing
//! destination never delays another.
//!
//! A lane is a claim loop with budgets of its own:
//!
//! - `max_in_flight` **slots**: a publish to the destination holds one
//!   while it runs (a claimed row waits for a free slot with its lease
//!   renewed, as during the publish itself);
//! - `max_in_flight + batch_size` **places** for rows claimed and not yet
//!   settled (waiting for a slot, publishing, or waiting for the recorder):
//!   a full set of publishes plus one claim's worth waiting for slots, so
//!   the slots never run dry while finished rows wait to be recorded. That
//!   is also the most rows of a destination that a relay which crashes
//!   leaves to their leases (and so publishes twice);
//! - an equal share of `max_in_flight_bytes`: payload bytes held from the
//!   claim until the publish is over and the payload dropped.
//!
//! It claims whenever something may be due and it has room, up to
//! `batch_size` rows and `max_batch_bytes`, never more than it has places
//! and bytes for, and hands each row to a task of its own. So a publish
//! that takes 3 s holds one slot of its own destination for 3 s, and
//! nothing else. A lane whose rows are all settling claims again only once
//! half its places are free or [`REFILL_LINGER`] has passed, so a busy
//! destination is claimed for in batches (a claim is a commit), while a
//! quiet one claims at once.
//!
//! A `NOTIFY` wakes the lane of the destination its payload names, or
//! every lane when it names none (today's `enqueue` sends an empty one).
//! Each settlement wakes its lane too (a place is free; an ordering key's
//! next row may be due).
//!
//! Delivered rows go to the lane's recorder, which writes all that have
//! finished since its last statement in one [`claim::complete_batch`]
//! (group commit: the busier the lane, the bigger the batch, with no
//! timer), while the lane goes on claiming and publishing.
//!
//! Order and fencing are the claim's, unchanged: a row of an ordering key
//! is claimable only once no earlier row of its key is left in the outbox
//! (whichever destination that row is for), and every settlement is fenced
//! on the claim's `attempts`.
//!
//! A row larger than the lane's whole byte share is claimed alone, when
//! the lane holds no other payload; until then, the lane claims nothing
//! past it (due order is kept), so it is never starved by smaller rows.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{Relay, Settings, Step, claim};
use crate::lease::Lease;
use crate::outbox::OutboxError;
use crate::outbox::claim::{Claimed, Limits, Payload};
use crate::outbox::publisher::Publisher;
use crate::postgres::Endpoint;

/// The most deliveries one recording statement writes.
const MAX_RECORDED_TOGETHER: usize = 1024;
/// The most a failing claim is logged: once, then at most this often.
const CLAIM_ERROR_LOG_EVERY: Duration = Duration::from_secs(30);
/// How long a lane with a few places free (and other rows still settling)
/// waits for more before it claims for those few.
const REFILL_LINGER: Duration = Duration::from_millis(2);

/// One destination's claim loop and budgets.
struct Lane {
    /// The destination, as [`claim::claim_within`] takes it.
    destination: [String; 1],
    /// One permit per publish running: `max_in_flight`.
    slots: Semaphore,
    /// One permit per row claimed and not yet settled: `max_in_flight + batch_size`.
    unsettled: Arc<Semaphore>,
    places: usize,
    /// Payload bytes claimed and not yet published: its share of `max_in_flight_bytes`.
    bytes: Arc<Semaphore>,
    byte_share: usize,
    /// Publishes ended, rows settled, `NOTIFY`s: something may have become claimable.
    wake: Notify,
}

/// A delivered row waiting for the recorder, holding its place among the
/// unsettled, under its lease.
struct Published {
    row: Claimed,
    lease: Lease,
    unsettled: OwnedSemaphorePermit,
}

/// What a lane has free right now.
#[derive(Debug, Clone, Copy)]
struct Room {
    /// Places free.
    places: usize,
    /// Rows claimed and not yet settled.
    unsettled: usize,
    bytes: usize,
    byte_share: usize,
}

/// What a lane does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Claim within these limits now.
    Claim(Limits),
    /// Claim within these, unless more room comes within [`REFILL_LINGER`].
    Linger(Limits),
    /// Nothing can be claimed before a row settles or a publish ends.
    Wait,
}

/// The pure core of a lane: what to claim with `room`.
fn plan(settings: &Settings, room: Room) -> Plan {
    if room.places == 0 || room.bytes == 0 {
        return Plan::Wait;
    }
    let batch = settings.batch_size.max(1);
    let limits = Limits {
        rows: u32::try_from(room.places).unwrap_or(u32::MAX).min(batch),
        bytes: u64::try_from(room.bytes).unwrap_or(u64::MAX).min(settings.max_batch_bytes),
        alone: room.bytes >= room.byte_share,
    };
    let refill = (batch / 2).max(1);
    if room.unsettled > 0 && limits.rows < refill { Plan::Linger(limits) } else { Plan::Claim(limits) }
}

/// Each lane's share of the byte budget: equal, at least one byte.
fn byte_share(total: u64, lanes: usize) -> usize {
    let share = total / u64::try_from(lanes.max(1)).unwrap_or(u64::MAX);
    usize::try_from(share).unwrap_or(usize::MAX).clamp(1, Semaphore::MAX_PERMITS)
}

impl Lane {
    fn new(destination: &str, settings: &Settings, byte_share: usize) -> Self {
        let max_in_flight = settings.max_in_flight.max(1) as usize;
        let places = max_in_flight.saturating_add(settings.batch_size.max(1) as usize);
        Self {
            destination: [destination.to_owned()],
            slots: Semaphore::new(max_in_flight),
            unsettled: Arc::new(Semaphore::new(places)),
            places,
            bytes: Arc::new(Semaphore::new(byte_share)),
            byte_share,
            wake: Notify::new(),
        }
    }

    fn room(&self) -> Room {
        let places = self.unsettled.available_permits();
        Room {
            places,
            unsettled: self.places.saturating_sub(places),
            bytes: self.bytes.available_permits(),
            byte_share: self.byte_share,
        }
    }
}

/// Rate-limits the log of a claim that keeps failing (the database is away).
#[derive(Default)]
struct ClaimErrors {
    since: Option<Instant>,
    logged: Option<Instant>,
    failures: u64,
}

impl ClaimErrors {
    fn failed(&mut self, destination: &str, error: &OutboxError) {
        let now = Instant::now();
        self.failures += 1;
        self.since.get_or_insert(now);
        if self.logged.is_none_or(|at| now.duration_since(at) >= CLAIM_ERROR_LOG_EVERY) {
            tracing::warn!(destination, failures = self.failures, error = %error, "outbox claim failed; retrying every poll interval");
            self.logged = Some(now);
        }
    }

    fn succeeded(&mut self, destination: &str) {
        if let Some(since) = self.since.take() {
            let down = since.elapsed();
            tracing::info!(destination, failures = self.failures, ?down, "outbox claims work again");
        }
        *self = Self::default();
    }
}

impl<P: Publisher> Relay<P> {
    /// Runs until `stop` is cancelled. `listen` is the database to LISTEN
    /// on (`None`: polling only).
    ///
    /// Once `stop` is cancelled, the lanes stop claiming and what they hold
    /// may finish for at most one `lease`: a database that stopped answering
    /// (frozen, or gone without closing the connection) would otherwise hold
    /// the shutdown forever, since statements have no client-side timeout.
    /// Rows cut short stay leased; they return when their leases expire.
    /// Dropping this future (an aborted task) stops everything it started.
    pub async fn run(self, listen: Option<Endpoint>, stop: CancellationToken) {
        let settings = self.inner.settings;
        let share = byte_share(settings.max_in_flight_bytes, self.inner.destinations.len());
        let lanes: Vec<Arc<Lane>> = self
            .inner
            .destinations
            .iter()
            .map(|destination| Arc::new(Lane::new(destination, &settings, share)))
            .collect();
        let listener = listen.map(|endpoint| {
            let notified = wake_for(lanes.clone());
            AbortOnDropHandle::new(tokio::spawn(crate::outbox::listen::listen_with(endpoint, notified, stop.clone())))
        });
        let housekeeping = AbortOnDropHandle::new(tokio::spawn(self.clone().housekeeping(stop.clone())));
        let mut running = JoinSet::new();
        for lane in lanes {
            running.spawn(self.clone().drive(lane, stop.clone()));
        }
        // A relay with no destinations (only housekeeping: the reaper, the
        // gauges, retention) runs until it is stopped, like any other.
        let idle_until_stopped = running.is_empty();
        let all = async {
            while running.join_next().await.is_some() {}
            if idle_until_stopped {
                stop.cancelled().await;
            }
        };
        tokio::pin!(all);
        tokio::select! {
            () = &mut all => {}
            () = stop.cancelled() => {
                if tokio::time::timeout(settings.lease, &mut all).await.is_err() {
                    tracing::warn!("outbox relay stopped before its last publishes were recorded (the database or a destination did not answer within one lease); their rows return when their leases expire");
                }
            }
        }
        // Housekeeping has nothing to finish (every job is idempotent): it simply stops.
        drop(housekeeping);
        if let Some(listener) = listener {
            let _ = listener.await;
        }
    }

    /// One lane's claim loop, until `stop`; then it waits for what it holds.
    async fn drive(self, lane: Arc<Lane>, stop: CancellationToken) {
        let settings = self.inner.settings;
        let poll = settings.poll_interval;
        let (delivered, recorded) = mpsc::unbounded_channel();
        let recorder = AbortOnDropHandle::new(tokio::spawn(self.clone().record_deliveries(lane.clone(), recorded)));
        let mut publishes = JoinSet::new();
        let mut errors = ClaimErrors::default();
        let name = lane.destination[0].as_str();
        let mut lingering_since = None;
        while !stop.is_cancelled() {
            while publishes.try_join_next().is_some() {}
            let limits = match plan(&settings, lane.room()) {
                Plan::Wait => {
                    lingering_since = None;
                    idle(&lane.wake, &stop, Instant::now() + poll).await;
                    continue;
                }
                Plan::Linger(limits) => {
                    let since = *lingering_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < REFILL_LINGER {
                        idle(&lane.wake, &stop, since + REFILL_LINGER).await;
                        continue;
                    }
                    limits
                }
                Plan::Claim(limits) => limits,
            };
            lingering_since = None;
            // Only this loop takes places, so what `plan` saw free is still free.
            let Ok(mut places) = lane.unsettled.clone().try_acquire_many_owned(limits.rows) else { continue };
            let claimed = match claim::claim_within(&self.inner.db, &lane.destination, limits, settings.lease).await {
                Ok(claimed) => {
                    errors.succeeded(name);
                    claimed
                }
                Err(e) => {
                    errors.failed(name, &e);
                    drop(places);
                    idle(&lane.wake, &stop, Instant::now() + poll).await;
                    continue;
                }
            };
            // Full: more may be due at once. Otherwise wait for a reason to look again.
            let full = claimed.len() >= limits.rows as usize;
            for row in claimed {
                let Some(place) = places.split(1) else { break };
                let wanted = u32::try_from(row.payload.len()).unwrap_or(u32::MAX);
                let available = u32::try_from(lane.bytes.available_permits()).unwrap_or(u32::MAX);
                // The claim kept within the free bytes (or took one row alone): this never waits.
                let bytes = lane.bytes.clone().try_acquire_many_owned(wanted.min(available)).ok();
                publishes.spawn(self.clone().deliver(lane.clone(), row, place, bytes, delivered.clone()));
            }
            drop(places);
            if !full {
                idle(&lane.wake, &stop, Instant::now() + poll).await;
            }
        }
        while publishes.join_next().await.is_some() {}
        drop(delivered);
        let _ = recorder.await;
    }

    /// Publishes one claimed row (once a slot is free) and settles it, or
    /// hands it to the recorder. `place` and `bytes` are its share of the lane.
    async fn deliver(
        self,
        lane: Arc<Lane>,
        row: Claimed,
        place: OwnedSemaphorePermit,
        bytes: Option<OwnedSemaphorePermit>,
        delivered: mpsc::UnboundedSender<Published>,
    ) {
        let step = self.attempt(row, Some(&lane.slots)).await;
        // The destination has answered (or the row is settled): its bytes are free.
        drop(bytes);
        match step {
            Step::Published(mut row, lease) => {
                row.payload = Payload::default();
                row.headers = Vec::new();
                // Fails only once the recorder is gone (the relay was dropped): the lease then expires.
                let _ = delivered.send(Published { row, lease, unsettled: place });
            }
            Step::Settled(_) => {
                drop(place);
                lane.wake.notify_one();
            }
        }
    }

    /// Records a lane's deliveries, as many together as have finished, until its lane is done.
    async fn record_deliveries(self, lane: Arc<Lane>, mut recorded: mpsc::UnboundedReceiver<Published>) {
        let mut batch = Vec::new();
        while recorded.recv_many(&mut batch, MAX_RECORDED_TOGETHER).await > 0 {
            let leases: Vec<Lease> = batch.iter().map(|published| published.lease).collect();
            let (rows, places): (Vec<Claimed>, Vec<OwnedSemaphorePermit>) =
                batch.drain(..).map(|published| (published.row, published.unsettled)).unzip();
            self.complete(&rows, leases).await;
            // Only now are they settled: the rows left the outbox (or their claims were found lost).
            drop(places);
            lane.wake.notify_one();
        }
    }
}

/// What a `NOTIFY` wakes: the lane of the destination its payload names,
/// or every lane when it names none of them (an empty payload, a redrive,
/// a reconnect). Each lane keeps one wake-up.
fn wake_for(lanes: Vec<Arc<Lane>>) -> impl Fn(&str) + Send + Sync {
    move |payload| match lanes.iter().find(|lane| lane.destination[0] == payload) {
        Some(lane) => lane.wake.notify_one(),
        None => lanes.iter().for_each(|lane| lane.wake.notify_one()),
    }
}

/// Waits for a wake-up, `until`, or `stop`, whichever comes first.
async fn idle(wake: &Notify, stop: &CancellationToken, until: Instant) {
    tokio::select! {
        _ = wake.notified() => {}
        _ = tokio::time::sleep_until(until) => {}
        _ = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests;

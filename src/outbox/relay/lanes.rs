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
//!   claim until the publish is over (a delivered row's payload is dropped
//!   then; a failed one's bytes are held until its retry or burial is
//!   recorded).
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
//! finished since its last statement in one [`complete_batch`](crate::outbox::claim::complete_batch)
//! (group commit: the busier the lane, the bigger the batch, with no
//! timer), while the lane goes on claiming and publishing.
//!
//! What the loop repeats — one claim and a publish task per row, recorded
//! by the lane's recorder (started once per lane) — is the claim step of
//! [`step`]; [`Relay::try_execute_step`] takes that same step once per lane
//! and waits for it to settle, which is how the tests drive the relay.
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

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{Relay, Settings};
use crate::outbox::OutboxError;
use crate::outbox::claim::Limits;
use crate::outbox::publisher::Publisher;
use crate::postgres::Endpoint;
use step::LaneTasks;

mod step;

/// The most a failing claim is logged: once, then at most this often.
const CLAIM_ERROR_LOG_EVERY: Duration = Duration::from_secs(30);
/// How long a lane with a few places free (and other rows still settling)
/// waits for more before it claims for those few.
const REFILL_LINGER: Duration = Duration::from_millis(2);

/// One destination's claim loop and budgets.
struct Lane {
    /// The destination, as [`claim_within`](crate::outbox::claim::claim_within) takes it.
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
        let lanes = self.lanes();
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

    /// A lane for each destination, sharing the byte budget equally.
    fn lanes(&self) -> Vec<Arc<Lane>> {
        let settings = self.inner.settings;
        let share = byte_share(settings.max_in_flight_bytes, self.inner.destinations.len());
        self.inner.destinations.iter().map(|destination| Arc::new(Lane::new(destination, &settings, share))).collect()
    }

    /// One lane's claim loop, until `stop`; then it waits for what it holds.
    async fn drive(self, lane: Arc<Lane>, stop: CancellationToken) {
        let settings = self.inner.settings;
        let poll = settings.poll_interval;
        let mut tasks = LaneTasks::start(self, lane.clone());
        let mut errors = ClaimErrors::default();
        let name = lane.destination[0].as_str();
        let mut lingering_since = None;
        while !stop.is_cancelled() {
            tasks.reap();
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
            match tasks.claim(limits).await {
                // Full: more may be due at once. Otherwise wait for a reason to look again.
                // The places were not free after all: plan again.
                Ok(None) => continue,
                Ok(Some(claimed)) if claimed >= limits.rows as usize => errors.succeeded(name),
                Ok(Some(_)) => {
                    errors.succeeded(name);
                    idle(&lane.wake, &stop, Instant::now() + poll).await;
                }
                Err(e) => {
                    errors.failed(name, &e);
                    idle(&lane.wake, &stop, Instant::now() + poll).await;
                }
            }
        }
        tasks.finish().await;
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

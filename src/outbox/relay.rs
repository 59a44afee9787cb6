//! The relay: claim due rows, publish them, record what happened.
//!
//! [`Relay::try_execute_batch`] is one step — claim up to `batch_size`
//! rows, publish them concurrently, record the deliveries together in one
//! statement (still fenced row by row) and settle each failure by a fenced
//! statement of its own — so tests drive the relay without sleeping. [`Relay::run`]
//! is the loop around it:
//!
//! - after a step that claimed anything it goes again at once (more may be
//!   due, and a settled head frees its ordering key's next row); after an
//!   empty step it waits for a `NOTIFY` ([`super::listen`]) or
//!   `poll_interval`, whichever comes first. Polling always runs, so a lost notification only costs latency;
//! - every `reap_interval` it returns expired leases to the queue
//!   ([`claim::reap_expired`]); at start and hourly it runs the history
//!   retention job;
//! - `workers` step loops run side by side (the others without the
//!   housekeeping), each like a relay of its own, so one step publishes
//!   while another waits on the database;
//! - on shutdown it stops claiming, lets the running batch finish (each
//!   publish is bounded by its destination's timeout; the whole step by one
//!   `lease`, as a database that stops answering bounds nothing) and returns.
//!
//! A settlement (complete, retry, bury) that fails on a database error is
//! tried twice more within about half a second; after that the row waits
//! out its lease and is claimed again (published again, under its key).
//!
//! While a publish runs, its lease is renewed every third of `lease`, so a
//! slow destination is never mistaken for a dead relay. A renewal that finds
//! the claim gone (the lease ran out and was reaped) is counted as lost;
//! the publish is left to finish, and its settlement then changes nothing.
//!
//! Metrics (shared with the gateway under `serve --relay`): attempts by
//! destination and outcome, publish latency, enqueue-to-delivery latency
//! (database clock), lost leases, and — refreshed every [`GAUGES_EVERY`] —
//! rows per destination and state and the oldest waiting row's age.
//!
//! A claimed row whose attempt count is already past `max_attempts` (its
//! earlier attempts ended in expired leases: a relay crashed, or the
//! message crashes relays) is buried without another publish.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::claim::{self, Claimed};
use super::publisher::{Attempt, HttpPublisher, Publisher};
use super::retry::{Class, Next, RetryPolicy};
use super::{Database, Endpoint, ErrorChain, OutboxError, Schema, migrate};
use crate::config::{Config, RelayConfig};
use crate::metrics::Metrics;

/// How often the history retention job runs.
const MAINTAIN_EVERY: Duration = Duration::from_secs(3600);
/// The longest a delivered row waits for others of its batch before the
/// deliveries are recorded together (see [`Relay::try_execute_batch`]).
pub const COMPLETE_LINGER: Duration = Duration::from_millis(5);
/// Pauses before the further tries of a settlement that failed.
const SETTLE_RETRIES: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(500)];
/// How often the backlog gauges are refreshed: the query counts the whole
/// outbox table, so not on every poll.
pub const GAUGES_EVERY: Duration = Duration::from_secs(15);

/// The knobs of one relay, from `[relay]`.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Lease per claim.
    pub lease: Duration,
    /// Rows per step.
    pub batch_size: u32,
    /// Step loops running side by side in [`Relay::run`] (at least 1).
    pub workers: u32,
    /// Wait between steps when idle and not notified.
    pub poll_interval: Duration,
    /// Wait between reaper runs.
    pub reap_interval: Duration,
    /// History retention.
    pub history_retention: Duration,
}

impl From<&RelayConfig> for Settings {
    fn from(c: &RelayConfig) -> Self {
        Self {
            lease: c.lease.0,
            batch_size: c.batch_size,
            workers: c.workers,
            poll_interval: c.poll_interval.0,
            reap_interval: c.reap_interval.0,
            history_retention: c.history_retention.0,
        }
    }
}

/// What one step did.
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

enum Settled {
    Delivered,
    Retried,
    Dead,
    Lost,
    Error,
}

/// Where one row's publish left it.
enum Step {
    /// Delivered, waiting to be recorded with the rest of its batch.
    Published(Claimed),
    /// Settled on its own (retried, dead, lost, or an error).
    Settled(Settled),
}

impl Outcome {
    fn add(&mut self, settled: Settled) {
        match settled {
            Settled::Delivered => self.delivered += 1,
            Settled::Retried => self.retried += 1,
            Settled::Dead => self.dead += 1,
            Settled::Lost => self.lost += 1,
            Settled::Error => self.errors += 1,
        }
    }

    fn add_all(&mut self, settled: Vec<Settled>) {
        for s in settled {
            self.add(s);
        }
    }
}

struct Inner<P> {
    db: Database,
    publisher: P,
    policies: BTreeMap<String, RetryPolicy>,
    destinations: Vec<String>,
    settings: Settings,
    metrics: Arc<Metrics>,
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
        let metrics = Arc::new(Metrics::new());
        Self { inner: Arc::new(Inner { db, publisher, policies, destinations, settings, metrics }) }
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

    /// Sets the backlog gauges from the database.
    pub async fn refresh_gauges(&self) -> Result<(), OutboxError> {
        let backlog = claim::backlog(&self.inner.db).await?;
        let m = &self.inner.metrics;
        for destination in &self.inner.destinations {
            let row = backlog.iter().find(|b| &b.destination == destination);
            for (state, count) in [
                ("ready", row.map_or(0, |b| b.ready)),
                ("leased", row.map_or(0, |b| b.leased)),
                ("dead", row.map_or(0, |b| b.dead)),
            ] {
                m.outbox_rows.with_label_values(&[destination.as_str(), state]).set(count);
            }
            let age = row.map_or(0, |b| b.oldest_ready_age.as_secs());
            m.outbox_oldest_ready_age
                .with_label_values(&[destination.as_str()])
                .set(i64::try_from(age).unwrap_or(i64::MAX));
        }
        Ok(())
    }

    /// The database it uses.
    pub fn database(&self) -> &Database {
        &self.inner.db
    }

    /// One step: claim, publish concurrently, settle. Fails only if the claim does.
    ///
    /// Deliveries are recorded together: as publishes finish, their rows
    /// wait (still leased) for the others, and one statement completes them
    /// all ([`claim::complete_batch`], one commit instead of one per row).
    /// A straggler does not hold the rest: [`COMPLETE_LINGER`] after the
    /// first of them finished, what has finished is recorded. Failures are
    /// settled one by one as they happen; they are the rare path.
    pub async fn try_execute_batch(&self) -> Result<Outcome, OutboxError> {
        let s = &self.inner.settings;
        let rows = claim::claim_batch(&self.inner.db, &self.inner.destinations, s.batch_size, s.lease).await?;
        let mut outcome = Outcome { claimed: rows.len(), ..Outcome::default() };
        let mut tasks = tokio::task::JoinSet::new();
        for row in rows {
            let relay = self.clone();
            tasks.spawn(async move { relay.attempt(row).await });
        }
        let mut published = Vec::new();
        // When the first row now waiting for its completion was published:
        // no row waits longer than COMPLETE_LINGER (its lease is no longer
        // renewed once its publish is over).
        let mut waiting_since = Instant::now();
        loop {
            let joined = if published.is_empty() {
                tasks.join_next().await
            } else {
                match tokio::time::timeout_at(waiting_since + COMPLETE_LINGER, tasks.join_next()).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        outcome.add_all(self.complete(std::mem::take(&mut published)).await);
                        continue;
                    }
                }
            };
            match joined {
                Some(Ok(Step::Published(row))) => {
                    if published.is_empty() {
                        waiting_since = Instant::now();
                    }
                    published.push(row);
                }
                Some(Ok(Step::Settled(settled))) => outcome.add(settled),
                Some(Err(_)) => outcome.errors += 1,
                None => break,
            }
        }
        outcome.add_all(self.complete(published).await);
        Ok(outcome)
    }

    /// Returns expired leases to the queue.
    pub async fn reap(&self) -> Result<u64, OutboxError> {
        claim::reap_expired(&self.inner.db).await
    }

    /// Publishes one row; settles it unless it was delivered (that waits for [`Self::complete`]).
    async fn attempt(&self, row: Claimed) -> Step {
        let pool = &self.inner.db;
        let Some(policy) = self.inner.policies.get(&row.destination).copied() else {
            return Step::Settled(Settled::Error); // unreachable: the claim filters by destination
        };
        let started = Instant::now();
        let settled = if row.attempt > policy.max_attempts {
            let reason = "attempts exhausted: earlier attempts ended without a result (expired leases)";
            claim::bury(pool, row.fence, reason).await.map(|ok| if ok { Settled::Dead } else { Settled::Lost })
        } else {
            // A lease lost mid-publish shows again in the fenced settlement.
            let attempt = self.publish_renewing(&row).await;
            let m = &self.inner.metrics;
            m.outbox_publish_latency
                .with_label_values(&[row.destination.as_str()])
                .observe(started.elapsed().as_secs_f64());
            let Attempt::Failed { class, retry_after, reason } = attempt else {
                return Step::Published(row);
            };
            // A settlement that fails on a database hiccup is tried again a
            // few times (the lease still holds).
            let mut settled = self.settle_failure(&row, policy, class, retry_after, &reason).await;
            for pause in SETTLE_RETRIES {
                if settled.is_ok() {
                    break;
                }
                tokio::time::sleep(pause).await;
                settled = self.settle_failure(&row, policy, class, retry_after, &reason).await;
            }
            settled
        };
        Step::Settled(self.record(&row, settled))
    }

    /// Records the deliveries of published rows in one statement. A
    /// failure is tried again a few times (the leases still hold): giving
    /// up means the rows wait out their leases and go out twice.
    async fn complete(&self, rows: Vec<Claimed>) -> Vec<Settled> {
        if rows.is_empty() {
            return Vec::new();
        }
        let fences: Vec<_> = rows.iter().map(|r| r.fence).collect();
        let mut done = claim::complete_batch(&self.inner.db, &fences).await;
        for pause in SETTLE_RETRIES {
            if done.is_ok() {
                break;
            }
            tokio::time::sleep(pause).await;
            done = claim::complete_batch(&self.inner.db, &fences).await;
        }
        let done: BTreeMap<i64, Duration> = match done {
            Ok(done) => done.into_iter().collect(),
            Err(e) => {
                tracing::warn!(rows = rows.len(), error = %e, "cannot record outbox deliveries; their leases will expire");
                return rows.iter().map(|row| self.record(row, Ok(Settled::Error))).collect();
            }
        };
        rows.iter()
            .map(|row| match done.get(&row.fence.id) {
                Some(waited) => {
                    let histogram = &self.inner.metrics.outbox_commit_to_delivery;
                    histogram.with_label_values(&[row.destination.as_str()]).observe(waited.as_secs_f64());
                    self.record(row, Ok(Settled::Delivered))
                }
                None => self.record(row, Ok(Settled::Lost)),
            })
            .collect()
    }

    /// Counts a settled attempt in the metrics (and logs a failed settlement).
    fn record(&self, row: &Claimed, settled: Result<Settled, OutboxError>) -> Settled {
        let outcome = match &settled {
            Ok(Settled::Delivered) => "delivered",
            Ok(Settled::Retried) => "retried",
            Ok(Settled::Dead) => "dead",
            Ok(Settled::Lost) => "lease_lost",
            Err(_) | Ok(Settled::Error) => "error",
        };
        self.inner.metrics.outbox_attempts.with_label_values(&[row.destination.as_str(), outcome]).inc();
        if matches!(settled, Ok(Settled::Lost)) {
            self.inner.metrics.outbox_lease_lost.inc();
        }
        match settled {
            Ok(settled) => settled,
            Err(e) => {
                tracing::warn!(id = row.fence.id, error = %e, "cannot record an outbox attempt; its lease will expire");
                Settled::Error
            }
        }
    }

    async fn settle_failure(
        &self,
        row: &Claimed,
        policy: RetryPolicy,
        class: Class,
        retry_after: Option<Duration>,
        reason: &str,
    ) -> Result<Settled, OutboxError> {
        let pool = &self.inner.db;
        let lost_unless = |ok: bool, settled: Settled| if ok { settled } else { Settled::Lost };
        let unit: f64 = rand::random();
        match policy.after_failure(class, row.attempt, retry_after, unit) {
            Next::RetryIn(delay) => {
                tracing::debug!(id = row.fence.id, ?delay, %reason, "outbox attempt failed; retrying");
                Ok(lost_unless(claim::retry(pool, row.fence, delay, reason).await?, Settled::Retried))
            }
            Next::Dead => {
                tracing::warn!(id = row.fence.id, destination = %row.destination, %reason, "outbox row is dead");
                Ok(lost_unless(claim::bury(pool, row.fence, reason).await?, Settled::Dead))
            }
        }
    }

    /// Publishes while renewing the lease.
    async fn publish_renewing(&self, row: &Claimed) -> Attempt {
        let lease = self.inner.settings.lease;
        let every = lease / 3;
        let publish = self.inner.publisher.publish(row);
        tokio::pin!(publish);
        let mut lost = false;
        loop {
            tokio::select! {
                attempt = &mut publish => return attempt,
                _ = tokio::time::sleep(every), if !lost => {
                    match claim::renew(&self.inner.db, row.fence, lease).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(id = row.fence.id, "outbox lease lost during a publish");
                            lost = true;
                        }
                        Err(e) => tracing::warn!(id = row.fence.id, error = %e, "cannot renew an outbox lease"),
                    }
                }
            }
        }
    }

    /// Runs until `stop` is cancelled. `listen` is the database to LISTEN
    /// on (`None`: polling only).
    ///
    /// Once `stop` is cancelled, the running step may finish for at most
    /// one `lease`: a database that stopped answering (frozen, or gone
    /// without closing the connection) would otherwise hold the shutdown
    /// forever, since statements have no client-side timeout. A step cut
    /// short leaves its rows leased; they return when their leases expire.
    pub async fn run(self, listen: Option<Endpoint>, stop: CancellationToken) {
        let wake = Arc::new(Notify::new());
        // Dropping this future (an aborted task) must not leave the listener behind.
        let listener = listen.map(|endpoint| {
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(super::listen::listen(
                endpoint,
                wake.clone(),
                stop.clone(),
            )))
        });
        let work = self.work(&wake, &stop);
        tokio::pin!(work);
        tokio::select! {
            () = &mut work => {}
            () = stop.cancelled() => {
                if tokio::time::timeout(self.inner.settings.lease, &mut work).await.is_err() {
                    tracing::warn!("outbox relay stopped before its last step finished (the database or a destination did not answer within one lease); its rows return when their leases expire");
                }
            }
        }
        if let Some(listener) = listener {
            let _ = listener.await;
        }
    }

    /// The loop of [`Self::run`]: steps, reaps, retention and gauges until
    /// `stop`, beside `workers - 1` plain step loops (dropped with it).
    async fn work(&self, wake: &Arc<Notify>, stop: &CancellationToken) {
        let s = self.inner.settings;
        // The other step loops (`workers` - 1): while one step waits on the
        // database, another publishes. Each is like one more relay: SKIP
        // LOCKED gives them disjoint rows, and a claim takes a key's row only
        // once no earlier row of that key is left, so per-key order holds.
        let helpers: Vec<_> = (1..s.workers)
            .map(|_| {
                let steps = self.clone().steps(wake.clone(), stop.clone());
                tokio_util::task::AbortOnDropHandle::new(tokio::spawn(steps))
            })
            .collect();
        let mut next_reap = Instant::now();
        let mut next_maintenance = Instant::now();
        let mut next_gauges = Instant::now();
        while !stop.is_cancelled() {
            if Instant::now() >= next_maintenance {
                if let Err(e) = claim::maintain_history(&self.inner.db, s.history_retention).await {
                    tracing::warn!(error = %e, "outbox history retention failed");
                }
                next_maintenance = Instant::now() + MAINTAIN_EVERY;
            }
            if Instant::now() >= next_reap {
                match self.reap().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(rows = n, "returned expired outbox leases"),
                    Err(e) => tracing::warn!(error = %e, "outbox reaper failed"),
                }
                next_reap = Instant::now() + s.reap_interval;
            }
            if Instant::now() >= next_gauges {
                if let Err(e) = self.refresh_gauges().await {
                    tracing::debug!(error = %e, "outbox gauges not refreshed");
                }
                next_gauges = Instant::now() + GAUGES_EVERY;
            }
            // Go again at once after any work: a full batch means more is
            // due, and a settled head lets its ordering key's next row go.
            if !self.step().await {
                idle(wake, stop, (Instant::now() + s.poll_interval).min(next_reap)).await;
            }
        }
        for helper in helpers {
            let _ = helper.await;
        }
    }

    /// A step loop without the housekeeping (reaper, retention, gauges)
    /// that [`Self::run`]'s own loop does: steps until `stop`, idling
    /// like it after a step that found nothing.
    async fn steps(self, wake: Arc<Notify>, stop: CancellationToken) {
        let poll = self.inner.settings.poll_interval;
        while !stop.is_cancelled() {
            if !self.step().await {
                idle(&wake, &stop, Instant::now() + poll).await;
            }
        }
    }

    /// One claim-publish-settle step; `true` when it claimed anything.
    async fn step(&self) -> bool {
        match self.try_execute_batch().await {
            Ok(outcome) => outcome.claimed > 0,
            Err(e) => {
                tracing::warn!(error = %e, "outbox claim failed");
                false
            }
        }
    }
}

/// Waits for a NOTIFY wake-up, `until`, or `stop`, whichever comes first.
async fn idle(wake: &Notify, stop: &CancellationToken, until: Instant) {
    tokio::select! {
        _ = wake.notified() => {}
        _ = tokio::time::sleep_until(until) => {}
        _ = stop.cancelled() => {}
    }
}

/// Builds the HTTP relay a config describes: checks the schema version first.
pub async fn from_config(config: &Config) -> Result<(Relay<HttpPublisher>, Option<Endpoint>), String> {
    let url = config.relay.database_url.as_ref().ok_or("the relay needs relay.database_url or --database-url")?;
    if config.destinations.is_empty() {
        return Err("the relay needs at least one [destinations.<name>] in the config file".into());
    }
    let schema = Schema::new(&config.relay.schema).map_err(|e| e.to_string())?;
    // Parsed once: a bad sslmode or an unreadable sslrootcert stops the start here.
    let endpoint = Endpoint::parse(url.expose()).map_err(|e| e.to_string())?;
    let db = Database::open(super::relay_sessions(endpoint.clone()), config.relay.pool_size, schema)
        .map_err(|e| e.to_string())?;
    let client =
        db.pool.get().await.map_err(|e| format!("cannot connect to {}: {}", url.redacted(), ErrorChain(&e)))?;
    migrate::require_current(&client, &db.schema).await.map_err(|e| e.to_string())?;
    drop(client);
    let publisher = HttpPublisher::new(&config.destinations).map_err(|e| e.to_string())?;
    let policies = config.destinations.iter().map(|(name, d)| (name.clone(), d.retry_policy())).collect();
    let listen = config.relay.listen.then_some(endpoint);
    Ok((Relay::new(db, publisher, policies, Settings::from(&config.relay)), listen))
}

/// `idemgate relay`: runs the configured relay until `shutdown` resolves,
/// with its admin listener (probes, metrics, dead rows) on `admin_listen`.
pub async fn run_from_config(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let (relay, listen) = from_config(config).await?;
    let access = crate::admin::AdminAccess::from_config(&config.admin)?;
    let listener = crate::gateway::server::bind(config.admin_listen).await?;
    let admin = crate::admin::relay::RelayAdmin::new(relay.database().clone(), relay.metrics().clone(), access);
    // The admin listener outlives the relay's drain, so probes answer until the end.
    let admin_stop = CancellationToken::new();
    let admin_task =
        tokio::spawn(crate::admin::relay::serve(listener, Arc::new(admin), admin_stop.clone().cancelled_owned()));
    tracing::info!(destinations = config.destinations.len(), admin = %config.admin_listen, "idemgate relay running");
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(listen, stop.clone()));
    shutdown.await;
    tracing::info!("relay stopping: finishing the running batch");
    stop.cancel();
    let finished = running.await.map_err(|e| e.to_string());
    admin_stop.cancel();
    let _ = admin_task.await;
    finished
}

//! Where records live: one [`Store`] trait, several backends.
//!
//! Every backend implements the same small contract, and every backend runs
//! the same conformance suite (`tests/stores/conformance.rs`):
//!
//! - [`Store::try_begin`] is **one atomic operation**: it creates an
//!   in-flight record when there is none (or takes over one whose lease has
//!   run out, with the same fingerprint) and otherwise reports the record
//!   as it stands. Two concurrent calls for one key never both acquire.
//! - [`Store::renew`], [`Store::complete`] and [`Store::release`] are
//!   **fenced**: they change the record only while it is in flight under
//!   the caller's [`Fence`], and report whether they did. `renew` and
//!   `release` need the lease live; a release that finds no record is a
//!   no-op. `complete` does not ([`Store::complete`]): a completion that
//!   comes after its lease lapsed (the store was down while it was being
//!   settled) still lands when nobody took over, because a takeover
//!   writes its own fence.
//! - An in-flight record expires when its lease ends; a completed or
//!   unknown one `ttl` after completion. An expired record is the same as no record.
//! - With a `tenant_quota` ([`AnyStore::with_quota`]), `try_begin` on a key
//!   whose tenant ([`ScopedKey::tenant`]) holds `max_keys` live records,
//!   or `max_bytes` of stored responses, answers [`Begin::OverQuota`] and
//!   writes nothing — in the same atomic step as the acquire, so two
//!   concurrent first requests cannot both take a tenant's last key.
//!   Only a begin that would create a record is refused: a key with a live
//!   record is decided as without a quota, and `complete` is never refused
//!   (a completion may take the tenant's bytes past `max_bytes`). Records
//!   that expire, are released or purged give their share back. One
//!   difference between backends: memory and Redis count a record until
//!   they drop it (a lapsed attempt a while after its lease), so the
//!   takeover of a lapsed attempt reuses its place; Postgres counts live
//!   rows only, so there a takeover is checked like a new key.
//! - Time is the store's own clock (Redis `TIME`, Postgres `now()`), so
//!   gateways with skewed clocks still agree on leases.
//! - A backend does not time its operations: the caller bounds each one,
//!   once and end to end (reconnects, retries and `WAIT` included), by
//!   `gateway.store_timeout` (the gateway's guard and its admin API). A
//!   URL's `timeout=` bounds only connecting, where no caller is waiting
//!   (and, on a Redis Cluster, one node's reply). See `docs/stores.md`.
//!
//! Backends: [`memory::MemoryStore`] (embedded, one process),
//! [`redis::RedisStore`] (Redis, Redis behind Sentinel, and Redis Cluster) and
//! [`postgres::PostgresStore`]. [`AnyStore`] picks one from a URL.

pub mod codec;
pub mod memory;
pub mod postgres;
mod record_codec;
pub mod redis;
pub mod sealing;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{StoreKind, TenantQuota};
use crate::idempotency::{Completion, Fence, Fingerprint, Record, ScopedKey};
use sealing::Sealer;

/// Runs one store operation within `limit`; one that does not finish in
/// time is [`StoreError::Timeout`]. The stores do not time their own
/// operations: each caller bounds each one once, end to end, with this
/// (`gateway.store_timeout`; see `docs/stores.md`, "Timeouts").
pub async fn bounded<T>(
    limit: Duration,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, operation).await.unwrap_or(Err(StoreError::Timeout))
}

/// The result of [`Store::try_begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The caller now holds the key under its fence and must forward.
    Acquired {
        /// `true` when an expired in-flight record was taken over.
        took_over: bool,
    },
    /// The key is held or completed; the caller applies the decision table.
    Existing(Record),
    /// The key is new and its tenant already holds what `tenant_quota`
    /// allows: nothing was written. Not a [`StoreError`]: those mean "the
    /// store is down", and a fail-open gateway forwards past them.
    OverQuota(QuotaLimit),
}

/// Which of a tenant's limits refused a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaLimit {
    /// `max_keys`: the tenant holds that many live records.
    Keys,
    /// `max_bytes`: the tenant's stored responses hold that many bytes.
    Bytes,
}

impl QuotaLimit {
    /// `keys` or `bytes`, for metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keys => "keys",
            Self::Bytes => "bytes",
        }
    }
}

/// Why a store operation failed. Every variant means "the outcome is
/// unknown or refused"; callers treat all of them as the store being down.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or answered with an error.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The operation did not finish within the store timeout.
    #[error("store operation timed out")]
    Timeout,
    /// The embedded store holds as many live records as it is allowed to.
    #[error("store is full: {0}")]
    Full(&'static str),
    /// A record could not be decoded (written by an incompatible version?).
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    /// The store URL is not usable.
    #[error("invalid store URL: {0}")]
    InvalidUrl(String),
    /// The primary made the write, but fewer replicas than `wait_replicas`
    /// acknowledged it within `wait_timeout`: a failover now may lose it.
    #[error(
        "only {acknowledged} of {wanted} replicas acknowledged the write within {timeout:?} (wait_replicas): \
         check that the replicas are connected and keeping up (INFO replication)"
    )]
    Unreplicated {
        /// Replicas that acknowledged it.
        acknowledged: i64,
        /// Replicas asked for.
        wanted: u32,
        /// How long the store waited for them.
        timeout: Duration,
    },
}

/// A place to keep records. See the module docs for the contract.
pub trait Store: Send + Sync + 'static {
    /// Atomically acquires the key or reports its record.
    fn try_begin(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Extends the lease of the caller's in-flight attempt.
    fn renew(
        &self,
        key: &ScopedKey,
        fence: Fence,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Ends the caller's attempt: completed with its response, completed
    /// without one (too large to keep), or held as unknown. The record is
    /// then kept for `ttl`. Precisely, by what the store holds for `key`:
    ///
    /// - in flight under `fence`, its lease live **or lapsed**: completed,
    ///   `true`;
    /// - nothing (the lapsed record expired, as Redis expires it, or an
    ///   operator purged it), or a completed or unknown record past its
    ///   `ttl`: a completed record is created with `fingerprint`, `true`.
    ///   Nobody took over (a takeover writes a new fence), and the upstream
    ///   acted, so the record saying so is correct;
    /// - in flight under another fence, lease live or lapsed: `false` (a
    ///   lapsed one only while the store still holds it: Redis drops it a
    ///   lease after the lapse, and then the case above applies);
    /// - completed or unknown and live: never overwritten, `false` (Redis
    ///   answers `true` to a repeat under the same fence when it only waits
    ///   for replicas again, see [`redis::RedisStore`]).
    fn complete(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes the caller's in-flight record so a retry runs again.
    fn release(&self, key: &ScopedKey, fence: Fence) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads a record without changing it (admin API).
    fn get(&self, key: &ScopedKey) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Deletes a record whatever its state (admin API); `true` if one existed.
    fn purge(&self, key: &ScopedKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Checks that the store answers (readiness).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The backend chosen by the store URL's scheme.
pub enum AnyStore {
    /// `memory://`: one per process, whichever gateways share it.
    Memory(Arc<memory::MemoryStore>),
    /// `redis://`, `rediss://`, `redis+cluster://`, `redis+sentinel://`
    Redis(Box<redis::RedisStore>),
    /// `postgres://`, `postgresql://`
    Postgres(postgres::PostgresStore),
}

impl AnyStore {
    /// Opens the store a URL names: Postgres connects (and migrates) now,
    /// Redis only checks the URL and connects once it can. With a sealer,
    /// networked stores keep responses encrypted at rest.
    pub async fn open(url: &str, sealer: Option<Arc<Sealer>>) -> Result<Self, StoreError> {
        match StoreKind::of(url) {
            Some(StoreKind::Memory) => Ok(Self::Memory(Arc::new(memory::MemoryStore::from_url(url)?))),
            Some(StoreKind::Redis) => Ok(Self::Redis(Box::new(redis::RedisStore::open(url).await?.sealed(sealer)))),
            Some(StoreKind::Postgres) => Ok(Self::Postgres(postgres::PostgresStore::open(url).await?.sealed(sealer))),
            None => Err(unsupported(url)),
        }
    }

    /// Enforces `quota` on every tenant from now on (`None`: no quota).
    /// Set before the store serves: on a Redis Cluster it decides where a
    /// tenant's records live ([`redis::RedisStore::with_quota`]).
    pub fn with_quota(self, quota: Option<TenantQuota>) -> Self {
        match self {
            Self::Memory(s) => Self::Memory(Arc::new(s.with_quota(quota))),
            Self::Redis(s) => Self::Redis(Box::new(s.with_quota(quota))),
            Self::Postgres(s) => Self::Postgres(s.with_quota(quota)),
        }
    }

    /// The same store for another gateway of this process (one per core,
    /// `crate::app::cores`), `url` being the one it was opened with: the
    /// memory store and the Postgres pool are shared; a Redis store gets a
    /// connection of its own, driven by the core that uses it, with this
    /// one's sealing keys and quota ([`redis::RedisStore::sibling`]).
    pub async fn sibling(&self, url: &str) -> Result<Self, StoreError> {
        match self {
            Self::Memory(s) => Ok(Self::Memory(s.clone())),
            Self::Postgres(s) => Ok(Self::Postgres(s.clone())),
            Self::Redis(s) => Ok(Self::Redis(Box::new(s.sibling(url).await?))),
        }
    }

    /// Checks a store URL as [`AnyStore::open`] reads it (scheme, options,
    /// address), without connecting: `check-config` refuses what `open`
    /// would, with the same message.
    pub fn check_url(url: &str) -> Result<(), StoreError> {
        match StoreKind::of(url) {
            Some(StoreKind::Memory) => memory::MemoryStore::from_url(url).map(drop),
            Some(StoreKind::Redis) => redis::check_url(url),
            Some(StoreKind::Postgres) => postgres::check_url(url),
            None => Err(unsupported(url)),
        }
    }

    /// What `check-config` warns of in a store URL that `open` accepts:
    /// a `timeout=` that no longer bounds operations, and Redis durability
    /// settings the topology or the timeouts cannot meet.
    pub fn warnings(url: &str, store_timeout: Duration, lease: Duration) -> Vec<String> {
        let kind = StoreKind::of(url);
        let mut warnings = Vec::new();
        if matches!(kind, Some(StoreKind::Redis | StoreKind::Postgres)) && url_options(url).any(|(n, _)| n == "timeout")
        {
            warnings.push(format!(
                "store: the URL's timeout= bounds only connecting; each store operation is bounded by \
                 gateway.store_timeout = {}",
                crate::config::ConfigDuration(store_timeout)
            ));
        }
        if matches!(kind, Some(StoreKind::Redis)) {
            warnings.extend(redis::durability_warnings(url, store_timeout, lease));
        }
        warnings
    }

    /// A short name of the backend, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(_) => "redis",
            Self::Postgres(_) => "postgres",
        }
    }
}

fn unsupported(url: &str) -> StoreError {
    let scheme = url.split("://").next().unwrap_or("");
    StoreError::InvalidUrl(format!("unsupported scheme {scheme:?}"))
}

// The networked backends' futures are boxed: a Postgres or Redis call's
// state machine runs to kilobytes, and unboxed it would size (and be copied
// with) every future that awaits the store, memory store included.
macro_rules! delegate {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($store) => $call.await,
            AnyStore::Redis($store) => Box::pin($call).await,
            AnyStore::Postgres($store) => Box::pin($call).await,
        }
    };
}

impl Store for AnyStore {
    async fn try_begin(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        delegate!(self, s => s.try_begin(key, fingerprint, fence, lease))
    }
    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        delegate!(self, s => s.renew(key, fence, lease))
    }
    async fn complete(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        delegate!(self, s => s.complete(key, fingerprint, fence, completion, ttl))
    }
    async fn release(&self, key: &ScopedKey, fence: Fence) -> Result<bool, StoreError> {
        delegate!(self, s => s.release(key, fence))
    }
    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        delegate!(self, s => s.get(key))
    }
    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        delegate!(self, s => s.purge(key))
    }
    async fn ping(&self) -> Result<(), StoreError> {
        delegate!(self, s => s.ping())
    }
}

/// Reads `name=value` pairs from a URL's query (store options).
pub(crate) fn url_options(url: &str) -> impl Iterator<Item = (&str, &str)> {
    url.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

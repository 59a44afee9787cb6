//! Redis and Redis Cluster backend.
//!
//! A record is one hash at `<prefix>{<hex of the scoped key>}`: `st` (`i`
//! in flight, `c` completed, `u` outcome unknown), `fp` (fingerprint), `fence`, `until` (lease
//! end, ms, by Redis's clock) and `resp` (the encoded, maybe sealed
//! response, absent when it was too large to keep). The fields are checked,
//! and the response sealed and opened, by the record codec the Postgres
//! store uses too (`record_codec`). Redis expires records by itself: a completed
//! record `ttl` after completion, an in-flight one two lease lengths after
//! its last renewal (past `until` it already counts as absent; the second
//! length only lets a same-fingerprint begin be reported as a takeover,
//! and a late completion under its fence find its record). A completion
//! that finds no record at all creates it (see [`Store::complete`]).
//!
//! Each transition is one Lua script over that one key, so it is atomic and
//! costs one round trip; the replay path is a single `EVALSHA`. The key is
//! hash-tagged (`{…}`) so that any future second key of the same record
//! lands in the same Cluster slot.
//!
//! **Tenant quota** ([`RedisStore::with_quota`]). Each tenant has two more
//! keys, `<prefix>{t<tenant hex>}k` (a sorted set of its record keys
//! scored by when Redis expires each) and `…}b` (its records' stored
//! bytes, their sum in field `*`), which the quota variants of the writing
//! scripts (`scripts`) update in the same script as the record: counting
//! the tenant's live records (`ZCOUNT` above now) and inserting the new
//! one is one atomic step. Expired members are pruned a bounded number at
//! a time by the begins of the tenant's new keys. A Lua script may only
//! touch keys of one slot on a Cluster, so there a tenant's records are
//! filed under its tag too, `<prefix>{t<tenant hex>}r<record hex>`: one
//! tenant's records live on one master (the measurement that chose this
//! over a quota with a bounded overshoot is in `docs/stores.md`).
//! Without a quota, nothing of this exists and nothing is paid for it.
//!
//! The store starts whether or not Redis answers: `open` checks the URL at
//! once but connects lazily, with the redis crate's own reconnecting
//! connections (`ConnectionManager`, the pending `ClusterConnection`), so a
//! gateway that starts at the same moment as its Redis heals by itself.
//! Until a connection is made every operation fails with
//! [`StoreError::Unavailable`] (or, at the caller's `gateway.store_timeout`,
//! [`StoreError::Timeout`]), which the gateway turns into its fail mode,
//! and `/readyz` into "not ready". The store does not time its operations
//! itself: the caller bounds each one once, end to end. On a Cluster, [`Store::ping`] (readiness) holds only
//! while every slot has a master and every master answers (`readiness`).
//!
//! URLs: `redis://host:port/db`, `rediss://host:port/db` (TLS, rustls),
//! `redis+cluster://host1:port1,host2:port2`, `rediss+cluster://…`, and
//! `redis+sentinel://s1:p1,s2:p2/SERVICE[/db]` / `rediss+sentinel://…`, a
//! primary found and followed through Sentinels (`sentinel`).
//! Options in the query: `prefix=` (default `idemgate:`), `timeout=` for
//! connecting (and, on a Cluster, one node's reply; default `2s`), `ca_file=` (PEM; with TLS, trust exactly these
//! CAs instead of the bundled Mozilla roots), `wait_replicas=N` and
//! `wait_timeout=D` (`durability`), `sentinel_password=` (`options`).

mod connection;
mod durability;
mod options;
mod readiness;
mod reply;
mod scripts;
mod sentinel;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterConfig;
use redis::io::tcp::TcpSettings;
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, Script, Value};

use super::record_codec::RecordCodec;
use super::sealing::Sealer;
use super::{Begin, QuotaLimit, Store, StoreError};
use crate::config::TenantQuota;
use crate::idempotency::hash::push_hex;
use crate::idempotency::{Completion, Fence, Fingerprint, Record, ScopedKey};
use connection::Connection;
use options::{Durability, Options, Topology};
use scripts::Scripts;
use sentinel::SentinelConnection;

pub use durability::durability_warnings;

/// Checks a store URL as [`RedisStore::open`] reads it, without
/// connecting: its options, and each data node's address as the redis
/// crate will read it.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    let address = |url: &String| {
        url.as_str().into_connection_info().map(drop).map_err(|e| {
            let shown = crate::config::ServiceUrl::new(url).redacted();
            StoreError::InvalidUrl(format!(
                "{shown} is not a Redis address ({e}); write it like redis://127.0.0.1:6379/0"
            ))
        })
    };
    match Options::parse(url)?.topology {
        Topology::Single(url) => address(&url),
        Topology::Cluster(urls) => urls.iter().try_for_each(address),
        Topology::Sentinel(_) => Ok(()),
    }
}

/// See the module docs.
pub struct RedisStore {
    codec: RecordCodec,
    connection: Connection,
    scripts: Scripts,
    prefix: String,
    durability: Option<Durability>,
    quota: Option<TenantQuota>,
}

impl RedisStore {
    /// Opens a store on the server or cluster a URL names. A URL or option
    /// that cannot work fails at once; a server that does not answer only
    /// logs a warning (see the module docs).
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let Options { topology, prefix, timeout, certificates, durability } = Options::parse(url)?;
        let invalid = |e: redis::RedisError| StoreError::InvalidUrl(e.to_string());
        let connection = match topology {
            Topology::Cluster(urls) => {
                let mut builder = redis::cluster::ClusterClient::builder(urls).tcp_settings(no_delay()).retries(2);
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                let client = builder.build().map_err(invalid)?;
                // The pending connection takes its timeouts from this config (a
                // builder's response timeout would be reset to none). The
                // response timeout lets the cluster client give up on one node
                // and refresh its slots within an operation; the operation as
                // a whole is bounded by its caller.
                let config = ClusterConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
                Connection::Cluster(client.get_pending_async_connection_with_config(config))
            }
            Topology::Sentinel(target) => {
                Connection::Sentinel(SentinelConnection::new(&target, certificates, timeout).map_err(invalid)?)
            }
            Topology::Single(url) => {
                let info = url.into_connection_info().map_err(invalid)?.set_tcp_settings(no_delay());
                let client = match certificates {
                    Some(certificates) => redis::Client::build_with_tls(info, certificates).map_err(invalid)?,
                    None => redis::Client::open(info).map_err(invalid)?,
                };
                // No response timeout in the client: the caller bounds every
                // operation once (`gateway.store_timeout`), and a second timer
                // per call only costs. One try
                // per connect attempt: while Redis is down, each failed call
                // starts the next attempt (one at a time, shared by concurrent
                // calls), so a call fails at once instead of waiting out a
                // backoff, and the first call after Redis returns connects.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(0);
                Connection::Single(ConnectionManager::new_lazy_with_config(client, config).map_err(invalid)?)
            }
        };
        let codec = RecordCodec::new("redis record");
        let store = Self { codec, connection, scripts: Scripts::new(false), prefix, durability, quota: None };
        // One attempt now, so an outage at start is logged where it is seen;
        // a failed attempt also starts the connection's own reconnect. No
        // caller bounds this call, so `timeout=` does: a frozen server
        // must not hold up the start.
        let ping = super::bounded(timeout, store.ping()).await;
        if let Err(e) = ping {
            let url = crate::config::ServiceUrl::new(url).redacted();
            tracing::warn!(store = %url, error = %e, "redis store not ready at start; trying again with each operation");
        } else if let Some(durability) = store.durability {
            let _ = tokio::time::timeout(timeout, store.warn_if_too_few_replicas(durability, url)).await;
        }
        Ok(store)
    }

    /// Enforces `quota` per tenant from now on (see the module docs).
    pub fn with_quota(mut self, quota: Option<TenantQuota>) -> Self {
        self.quota = quota;
        self.scripts = Scripts::new(quota.is_some());
        self
    }

    /// Another store on the same Redis with a connection of its own (one
    /// per core, driven by the core that uses it), sealing with this one's
    /// keys and keeping its quota: the key file is not read again, so every
    /// core seals alike.
    pub async fn sibling(&self, url: &str) -> Result<Self, StoreError> {
        Ok(Self::open(url).await?.sealed(self.codec.sealer()).with_quota(self.quota))
    }

    /// Seals stored responses with these keys from now on.
    pub fn sealed(mut self, sealer: Option<Arc<Sealer>>) -> Self {
        self.codec = self.codec.sealed(sealer);
        self
    }

    /// The record in a script's reply ([`reply`]).
    fn record(&self, key: &ScopedKey, reply: Value) -> Result<Record, StoreError> {
        self.codec.decode(key, reply::stored_fields(&self.codec, reply)?)
    }

    fn redis_key(&self, key: &ScopedKey) -> String {
        if self.tenant_slots() {
            return self.tenant_key(key, 'r', true);
        }
        let mut redis_key = String::with_capacity(self.prefix.len() + 2 * key.as_bytes().len() + 2);
        redis_key.push_str(&self.prefix);
        redis_key.push('{');
        push_hex(key.as_bytes(), &mut redis_key);
        redis_key.push('}');
        redis_key
    }

    /// On a Cluster with a quota, a tenant's records and its counts share
    /// one slot (see the module docs).
    fn tenant_slots(&self) -> bool {
        self.quota.is_some() && matches!(self.connection, Connection::Cluster(_))
    }

    /// `<prefix>{t<tenant hex>}<kind>`, with the record's hex after it for
    /// a record: the tenant's sorted set (`k`), its bytes (`b`), or a
    /// record filed by tenant (`r…`).
    fn tenant_key(&self, key: &ScopedKey, kind: char, record: bool) -> String {
        let mut redis_key = String::with_capacity(self.prefix.len() + 100);
        redis_key.push_str(&self.prefix);
        redis_key.push_str("{t");
        push_hex(&key.tenant().0, &mut redis_key);
        redis_key.push('}');
        redis_key.push(kind);
        if record {
            push_hex(key.as_bytes(), &mut redis_key);
        }
        redis_key
    }

    /// `EVALSHA` of `script` on `key`; callers add the arguments.
    fn evalsha(&self, script: &Script, key: &ScopedKey) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(self.redis_key(key));
        cmd
    }

    /// `EVALSHA` of a quota script on `key` and its tenant's two keys.
    fn evalsha_in_quota(&self, script: &Script, key: &ScopedKey) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(3).arg(self.redis_key(key));
        cmd.arg(self.tenant_key(key, 'k', false)).arg(self.tenant_key(key, 'b', false));
        cmd
    }

    /// Runs a script call made by [`Self::evalsha`], loading the script on
    /// a node that does not have it yet.
    async fn run<T: FromRedisValue>(&self, script: &Script, cmd: Cmd) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.answered(async {
            let mut loaded = false;
            loop {
                let result = match cmd.query_async(&mut connection).await {
                    Err(e) if connection.never_sent(&e) => cmd.query_async(&mut connection).await,
                    result => result,
                };
                match result {
                    Err(e) if !loaded && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                        script.load_async(&mut connection).await?;
                        loaded = true;
                    }
                    result => return result,
                }
            }
        })
        .await
    }

    /// A write script call, then `WAIT` when the URL asks for replicas
    /// (`durability`): the reply, and whether enough replicas acknowledged.
    async fn run_write(&self, script: &Script, cmd: Cmd) -> Result<(Value, Replicated), StoreError> {
        let Some(wanted) = self.durability else {
            return self.run::<Value>(script, cmd).await.map(|reply| (reply, Replicated::NotAsked));
        };
        let mut connection = self.connection.clone();
        let (reply, acknowledged) =
            self.answered(durability::write_then_wait(&mut connection, script, &cmd, wanted)).await?;
        let replicated = match acknowledged >= i64::from(wanted.replicas) {
            true => Replicated::Yes,
            false => Replicated::Short(durability::unreplicated(acknowledged, wanted)),
        };
        Ok((reply, replicated))
    }

    async fn command<T: FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.answered(async {
            match cmd.query_async(&mut connection).await {
                Err(e) if connection.never_sent(&e) => cmd.query_async(&mut connection).await,
                result => result,
            }
        })
        .await
    }

    /// One Redis call, its error as the store's. Not timed here: the
    /// caller bounds each store operation once, end to end, retries and
    /// reconnects included (`gateway.store_timeout`, see `docs/stores.md`).
    async fn answered<T, E: std::error::Error + Send + Sync + 'static>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, StoreError> {
        call.await.map_err(|e| StoreError::Unavailable(Box::new(e)))
    }
}

/// Whether a write reached the replicas the URL asks for.
enum Replicated {
    /// No `wait_replicas`: the primary's word is enough.
    NotAsked,
    /// As many as asked acknowledged it.
    Yes,
    /// Fewer did, in `wait_timeout`: this error says how many.
    Short(StoreError),
}

/// `TCP_NODELAY` on every Redis socket (the redis crate leaves Nagle on).
/// All requests share one multiplexed connection, so with Nagle a script
/// sent while another one's reply is outstanding waits for a delayed ACK:
/// measured, that was most of the Redis store's latency under load.
fn no_delay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Store for RedisStore {
    async fn try_begin(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let (script, mut cmd) = match (&self.scripts.in_quota, &self.quota) {
            (Some(scripts), Some(_)) => (&scripts.begin, self.evalsha_in_quota(&scripts.begin, key)),
            _ => (&self.scripts.begin, self.evalsha(&self.scripts.begin, key)),
        };
        cmd.arg(&fingerprint.0[..]).arg(fence.0).arg(millis(lease)).arg(millis(lease).saturating_mul(2));
        if let Some(quota) = &self.quota {
            cmd.arg(quota.max_keys).arg(quota.max_bytes);
        }
        let (reply, replicated) = self.run_write(script, cmd).await?;
        let took_over = match &reply {
            Value::SimpleString(s) if s == "acquired" => false,
            Value::BulkString(s) if s == b"acquired" => false,
            Value::SimpleString(s) if s == "taken_over" => true,
            Value::BulkString(s) if s == b"taken_over" => true,
            // Refused, nothing written: nothing to wait for either.
            Value::BulkString(s) if s == b"quota_keys" => return Ok(Begin::OverQuota(QuotaLimit::Keys)),
            Value::BulkString(s) if s == b"quota_bytes" => return Ok(Begin::OverQuota(QuotaLimit::Bytes)),
            // Only read: nothing of this call's to wait for.
            _ => return self.record(key, reply).map(Begin::Existing),
        };
        if let Replicated::Short(error) = replicated {
            // Not forwarded, so nothing may hold the key: a failover now
            // could lose this record, and the request must not run with a
            // record that may vanish under it.
            if let Err(e) = self.release(key, fence).await {
                tracing::warn!(error = %e, "cannot release a begin the replicas did not acknowledge; it lapses with its lease");
            }
            return Err(error);
        }
        Ok(Begin::Acquired { took_over })
    }

    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        let (script, mut cmd) = match &self.scripts.in_quota {
            Some(scripts) => (&scripts.renew, self.evalsha_in_quota(&scripts.renew, key)),
            None => (&self.scripts.renew, self.evalsha(&self.scripts.renew, key)),
        };
        cmd.arg(fence.0).arg(millis(lease)).arg(millis(lease).saturating_mul(2));
        self.run::<i64>(script, cmd).await.map(|n| n == 1)
    }

    /// With `wait_replicas`, a complete the same attempt already made
    /// (its `WAIT` fell short, and the gateway tries again) only waits for
    /// the replicas again, and reports `true` once they hold it.
    async fn complete(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let written = self.codec.encode(key, completion)?;
        let (script, mut cmd) = match &self.scripts.in_quota {
            Some(scripts) => (&scripts.complete, self.evalsha_in_quota(&scripts.complete, key)),
            None => (&self.scripts.complete, self.evalsha(&self.scripts.complete, key)),
        };
        cmd.arg(fence.0).arg(millis(ttl)).arg(&[written.state][..]).arg(&fingerprint.0[..]);
        if let Some(response) = written.response {
            cmd.arg(response);
        }
        let (reply, replicated) = self.run_write(script, cmd).await?;
        let outcome = i64::from_redis_value(reply).map_err(|_| self.codec.corrupt("complete answered otherwise"))?;
        match (outcome, replicated) {
            (0, _) | (2, Replicated::NotAsked) => Ok(false),
            (_, Replicated::Short(error)) => Err(error),
            _ => Ok(true),
        }
    }

    async fn release(&self, key: &ScopedKey, fence: Fence) -> Result<bool, StoreError> {
        let (script, mut cmd) = match &self.scripts.in_quota {
            Some(scripts) => (&scripts.release, self.evalsha_in_quota(&scripts.release, key)),
            None => (&self.scripts.release, self.evalsha(&self.scripts.release, key)),
        };
        cmd.arg(fence.0);
        self.run::<i64>(script, cmd).await.map(|n| n == 1)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        match self.run::<Value>(&self.scripts.get, self.evalsha(&self.scripts.get, key)).await? {
            Value::Nil => Ok(None),
            other => self.record(key, other).map(Some),
        }
    }

    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        if let Some(scripts) = &self.scripts.in_quota {
            let cmd = self.evalsha_in_quota(&scripts.purge, key);
            return self.run::<i64>(&scripts.purge, cmd).await.map(|n| n == 1);
        }
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.redis_key(key));
        self.command::<i64>(cmd).await.map(|n| n == 1)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match &self.connection {
            Connection::Single(_) | Connection::Sentinel(_) => {
                self.command::<String>(redis::cmd("PING")).await.map(drop)
            }
            // Not the crate's own PING to all masters: it answers with one dead.
            Connection::Cluster(cluster) => self.answered(readiness::every_master_answers(&mut cluster.clone())).await,
        }
    }
}

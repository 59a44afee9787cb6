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
//! length only lets a same-fingerprint begin be reported as a takeover).
//!
//! Each transition is one Lua script over that one key, so it is atomic and
//! costs one round trip; the replay path is a single `EVALSHA`. The key is
//! hash-tagged (`{…}`) so that any future second key of the same record
//! lands in the same Cluster slot.
//!
//! The store starts whether or not Redis answers: `open` checks the URL at
//! once but connects lazily, with the redis crate's own reconnecting
//! connections (`ConnectionManager`, the pending `ClusterConnection`), so a
//! gateway that starts at the same moment as its Redis heals by itself.
//! Until a connection is made every operation fails with
//! [`StoreError::Unavailable`] (or [`StoreError::Timeout`]) within the store
//! timeout, which the gateway turns into its fail mode, and `/readyz`
//! into "not ready". On a Cluster, [`Store::ping`] (readiness) holds only
//! while every slot has a master and every master answers (`readiness`).
//!
//! URLs: `redis://host:port/db`, `rediss://host:port/db` (TLS, rustls),
//! `redis+cluster://host1:port1,host2:port2` and `rediss+cluster://…`.
//! Options in the query: `prefix=` (default `idemgate:`), `timeout=` per
//! operation (default `2s`), `ca_file=` (PEM; with TLS, trust exactly these
//! CAs instead of the bundled Mozilla roots).

mod readiness;
mod reply;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterConfig;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{FromRedisValue, IntoConnectionInfo, TlsCertificates, Value};

use super::record_codec::RecordCodec;
use super::sealing::Sealer;
use super::{Begin, Store, StoreError, url_options};
use crate::config::ConfigDuration;
use crate::idempotency::hash::push_hex;
use crate::idempotency::{Completion, Fence, Fingerprint, Record, ScopedKey};
use scripts::Scripts;

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

// One connection type for scripts and plain commands alike.
impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl Connection {
    /// Whether a call failed because the connect attempt it waited for was
    /// refused, so the command never left and is safe to send once more.
    /// The connection manager keeps a failed attempt until a call sees it
    /// and only then starts the next; sending again waits for that one, so
    /// the first call after Redis returns succeeds instead of reporting the
    /// outage that has just ended. (A cluster connection retries by itself,
    /// and its refusals may follow a command that did reach a node.)
    fn never_sent(&self, error: &redis::RedisError) -> bool {
        matches!(self, Self::Single(_)) && error.is_connection_refusal()
    }
}

/// What a store URL says, read without connecting: the same reading
/// serves `open` and the config check (`AnyStore::check_url`).
struct Settings {
    prefix: String,
    timeout: Duration,
    certificates: Option<TlsCertificates>,
    target: Target,
}

/// The server, or the cluster's seed nodes.
enum Target {
    Single(Box<redis::ConnectionInfo>),
    Cluster(Vec<redis::ConnectionInfo>),
}

impl Settings {
    fn parse(url: &str) -> Result<Self, StoreError> {
        let base = url.split_once('?').map_or(url, |(base, _)| base);
        let mut prefix = "idemgate:".to_string();
        let mut timeout = Duration::from_secs(2);
        let mut certificates = None;
        let mut passthrough = Vec::new();
        for (name, value) in url_options(url) {
            match name {
                "prefix" if !value.contains(['{', '}']) => prefix = value.to_string(),
                "prefix" => return Err(StoreError::InvalidUrl("prefix must not contain '{' or '}'".into())),
                "timeout" => timeout = value.parse::<ConfigDuration>().map_err(StoreError::InvalidUrl)?.0,
                "ca_file" => {
                    let pem = std::fs::read(value)
                        .map_err(|e| StoreError::InvalidUrl(format!("cannot read ca_file {value}: {e}")))?;
                    certificates = Some(TlsCertificates { client_tls: None, root_cert: Some(pem) });
                }
                _ => passthrough.push(format!("{name}={value}")),
            }
        }
        let suffix = if passthrough.is_empty() { String::new() } else { format!("?{}", passthrough.join("&")) };
        let parse = |url: String| {
            url.as_str().into_connection_info().map_err(|e| {
                let shown = crate::config::ServiceUrl::new(&url).redacted();
                StoreError::InvalidUrl(format!(
                    "{shown} is not a Redis address ({e}); write it like redis://127.0.0.1:6379/0"
                ))
            })
        };
        let cluster = base.strip_prefix("redis+cluster://").map(|n| ("redis", n));
        let cluster = cluster.or_else(|| base.strip_prefix("rediss+cluster://").map(|n| ("rediss", n)));
        let target = match cluster {
            Some((scheme, nodes)) => {
                let (userinfo, hosts) = nodes.rsplit_once('@').unwrap_or(("", nodes));
                let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
                let nodes = hosts
                    .trim_end_matches('/')
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(|h| parse(format!("{scheme}://{at}{h}{suffix}")))
                    .collect::<Result<Vec<_>, _>>()?;
                if nodes.is_empty() {
                    return Err(StoreError::InvalidUrl("a cluster URL needs at least one host:port".into()));
                }
                Target::Cluster(nodes)
            }
            None => Target::Single(Box::new(parse(format!("{base}{suffix}"))?)),
        };
        Ok(Self { prefix, timeout, certificates, target })
    }
}

/// Checks a store URL as [`RedisStore::open`] reads it, without connecting.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    Settings::parse(url).map(drop)
}

/// See the module docs.
pub struct RedisStore {
    codec: RecordCodec,
    connection: Connection,
    scripts: Scripts,
    prefix: String,
    timeout: Duration,
}

impl RedisStore {
    /// Opens a store on the server or cluster a URL names. A URL or option
    /// that cannot work fails at once; a server that does not answer only
    /// logs a warning (see the module docs).
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let Settings { prefix, timeout, certificates, target } = Settings::parse(url)?;
        let invalid = |e: redis::RedisError| StoreError::InvalidUrl(e.to_string());
        let connection = match target {
            Target::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClient::builder(nodes).tcp_settings(no_delay()).retries(2);
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                let client = builder.build().map_err(invalid)?;
                // The pending connection takes its timeouts from this config (a
                // builder's response timeout would be reset to none).
                let config = ClusterConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
                Connection::Cluster(client.get_pending_async_connection_with_config(config))
            }
            Target::Single(info) => {
                let info = (*info).set_tcp_settings(no_delay());
                let client = match certificates {
                    Some(certificates) => redis::Client::build_with_tls(info, certificates).map_err(invalid)?,
                    None => redis::Client::open(info).map_err(invalid)?,
                };
                // No response timeout in the client: every call is bounded once,
                // in `bounded`, and a second timer per call only costs. One try
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
        let store =
            Self { codec: RecordCodec::new("redis record"), connection, scripts: Scripts::new(), prefix, timeout };
        // One attempt now, so an outage at start is logged where it is seen;
        // a failed attempt also starts the connection's own reconnect.
        if let Err(e) = store.ping().await {
            let url = crate::config::ServiceUrl::new(url).redacted();
            tracing::warn!(store = %url, error = %e, "redis store not ready at start; trying again with each operation");
        }
        Ok(store)
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
        let mut redis_key = String::with_capacity(self.prefix.len() + 2 * key.as_bytes().len() + 2);
        redis_key.push_str(&self.prefix);
        redis_key.push('{');
        push_hex(key.as_bytes(), &mut redis_key);
        redis_key.push('}');
        redis_key
    }

    async fn run<T: FromRedisValue>(&self, invocation: redis::ScriptInvocation<'_>) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.within_timeout(async {
            match invocation.invoke_async(&mut connection).await {
                Err(e) if connection.never_sent(&e) => invocation.invoke_async(&mut connection).await,
                result => result,
            }
        })
        .await
    }

    async fn command<T: FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.within_timeout(async {
            match cmd.query_async(&mut connection).await {
                Err(e) if connection.never_sent(&e) => cmd.query_async(&mut connection).await,
                result => result,
            }
        })
        .await
    }

    /// One Redis call under the store timeout.
    async fn within_timeout<T, E: std::error::Error + Send + Sync + 'static>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| StoreError::Unavailable(Box::new(e))),
            Err(_) => Err(StoreError::Timeout),
        }
    }
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
        let mut invocation = self.scripts.begin.key(self.redis_key(key));
        invocation.arg(&fingerprint.0[..]).arg(fence.0).arg(millis(lease)).arg(millis(lease).saturating_mul(2));
        match self.run::<Value>(invocation).await? {
            Value::SimpleString(s) if s == "acquired" => Ok(Begin::Acquired { took_over: false }),
            Value::BulkString(s) if s == b"acquired" => Ok(Begin::Acquired { took_over: false }),
            Value::SimpleString(s) if s == "taken_over" => Ok(Begin::Acquired { took_over: true }),
            Value::BulkString(s) if s == b"taken_over" => Ok(Begin::Acquired { took_over: true }),
            other => self.record(key, other).map(Begin::Existing),
        }
    }

    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.renew.key(self.redis_key(key));
        invocation.arg(fence.0).arg(millis(lease)).arg(millis(lease).saturating_mul(2));
        self.run::<i64>(invocation).await.map(|n| n == 1)
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        fence: Fence,
        completion: Completion<'_>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let written = self.codec.encode(key, completion)?;
        let mut invocation = self.scripts.complete.key(self.redis_key(key));
        invocation.arg(fence.0).arg(millis(ttl)).arg(&[written.state][..]);
        if let Some(response) = written.response {
            invocation.arg(response);
        }
        self.run::<i64>(invocation).await.map(|n| n == 1)
    }

    async fn release(&self, key: &ScopedKey, fence: Fence) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.release.key(self.redis_key(key));
        invocation.arg(fence.0);
        self.run::<i64>(invocation).await.map(|n| n == 1)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        match self.run::<Value>(self.scripts.get.key(self.redis_key(key))).await? {
            Value::Nil => Ok(None),
            other => self.record(key, other).map(Some),
        }
    }

    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.redis_key(key));
        self.command::<i64>(cmd).await.map(|n| n == 1)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match &self.connection {
            Connection::Single(_) => self.command::<String>(redis::cmd("PING")).await.map(drop),
            // Not the crate's own PING to all masters: it answers with one dead.
            Connection::Cluster(cluster) => {
                self.within_timeout(readiness::every_master_answers(&mut cluster.clone())).await
            }
        }
    }
}

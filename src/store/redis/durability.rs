//! `wait_replicas`: a write that counts only once replicas hold it.
//!
//! Redis acknowledges a write when the primary has it; a failover to a
//! replica that had not received it yet loses it, and with it the record
//! that stops a retry from running the request a second time. With
//! `wait_replicas=N` the store sends each `begin` and `complete` script
//! with a `WAIT N wait_timeout` behind it, in one pipeline: one round trip,
//! and one connection, so the `WAIT` counts the replicas of the node that
//! ran the script (it waits for everything that connection wrote until
//! then). Fewer than N in time is [`StoreError::Unreplicated`]; the store
//! releases an acquired `begin` itself, and the gateway retries a
//! `complete` (see `gateway::guard`).
//!
//! `WAIT` blocks the connection it is sent on until it returns, so every
//! call behind it on the shared connection waits too, reads included:
//! with the replicas gone, each write waits out `wait_timeout` in turn
//! (measured in RELIABILITY.md). A write and its `WAIT` must share a
//! connection, so only a connection per write in flight would avoid it.
//!
//! At start the store warns of each primary (a Cluster's masters each)
//! with fewer replicas connected than asked; `check-config`, which does
//! not connect, warns of what the URL alone shows
//! ([`durability_warnings`]).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, Value};

use super::options::{Durability, Options, Topology};
use super::{Connection, RedisStore, millis, readiness};
use crate::config::ServiceUrl;
use crate::store::StoreError;

/// Runs `write` (an `EVALSHA` of `script`) and then `WAIT`, in one
/// pipeline; returns the script's reply and how many replicas acknowledged.
pub(super) async fn write_then_wait(
    connection: &mut impl ConnectionLike,
    script: &Script,
    write: &Cmd,
    durability: Durability,
) -> RedisResult<(Value, i64)> {
    let mut pipeline = redis::pipe();
    pipeline.add_command(write.clone()).cmd("WAIT").arg(durability.replicas).arg(millis(durability.timeout));
    let mut loaded = false;
    loop {
        let sent = async {
            let replies: Vec<Value> = pipeline.query_async(connection).await?;
            let [reply, acknowledged] = <[Value; 2]>::try_from(replies).map_err(|_| {
                redis::RedisError::from((ErrorKind::UnexpectedReturnType, "a pipeline of two, answered otherwise"))
            })?;
            Ok::<_, redis::RedisError>((reply.extract_error()?, i64::from_redis_value(acknowledged)?))
        };
        match sent.await {
            // A node that does not have the script yet (new, restarted or
            // promoted): load it and send again, once.
            Err(e) if !loaded && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(connection).await?;
                loaded = true;
            }
            result => return result,
        }
    }
}

/// The error for a write that fewer replicas than asked acknowledged.
pub(super) fn unreplicated(acknowledged: i64, durability: Durability) -> StoreError {
    StoreError::Unreplicated { acknowledged, wanted: durability.replicas, timeout: durability.timeout }
}

impl RedisStore {
    /// Logs, at start, every primary (the one, or each Cluster master the
    /// slot map names) with fewer replicas connected than `wait_replicas`
    /// asks: until they connect, every new key it would hold is refused.
    /// A primary that cannot be asked is not warned of here: `open` has
    /// already logged that the store is not ready.
    pub(super) async fn warn_if_too_few_replicas(&self, durability: Durability, url: &str) {
        let primaries = match &self.connection {
            Connection::Cluster(cluster) => {
                let asked = self.answered(readiness::replication_of_masters(&mut cluster.clone())).await;
                let Ok(masters) = asked else { return };
                masters.into_iter().map(|(address, info)| (Some(address), info)).collect()
            }
            Connection::Single(_) | Connection::Sentinel(_) => {
                let mut info = redis::cmd("INFO");
                info.arg("replication");
                let Ok(info) = self.command::<String>(info).await else { return };
                vec![(None, info)]
            }
        };
        let url = ServiceUrl::new(url).redacted();
        let wanted = durability.replicas;
        for (master, info) in primaries {
            let Some(connected) = connected_replicas(&info).filter(|n| *n < wanted) else { continue };
            match master {
                None => tracing::warn!(store = %url, connected, wait_replicas = wanted,
                    "the Redis primary has fewer replicas connected than wait_replicas asks: \
                     every new key is refused (503) until they connect"),
                Some(master) => tracing::warn!(store = %url, %master, connected, wait_replicas = wanted,
                    "a Redis Cluster master has fewer replicas connected than wait_replicas asks: \
                     every new key in its slots is refused (503) until they connect"),
            }
        }
    }
}

/// `connected_slaves` of an `INFO replication` reply.
fn connected_replicas(info: &str) -> Option<u32> {
    info.lines().find_map(|l| l.strip_prefix("connected_slaves:")?.trim().parse().ok())
}

/// What `check-config` warns of in a Redis store URL: a durability
/// setting the topology or the timeouts cannot meet, or a topology with
/// replicas that runs without one. An unusable URL is `open`'s error, not
/// a warning.
pub fn durability_warnings(url: &str, store_timeout: Duration, lease: Duration) -> Vec<String> {
    let Ok(options) = Options::parse(url) else { return Vec::new() };
    let mut warnings = Vec::new();
    match (options.durability, &options.topology) {
        (None, Topology::Sentinel(_) | Topology::Cluster(_)) => warnings.push(
            "store: a Redis failover loses writes its replicas had not received, and with a record lost a retry \
             runs its request a second time; add ?wait_replicas=1 (see RELIABILITY.md)"
                .to_string(),
        ),
        (None, Topology::Single(_)) => {}
        (Some(durability), _) => {
            if durability.timeout >= store_timeout {
                warnings.push(format!(
                    "store: wait_timeout = {:?} is not shorter than the store timeout (gateway.store_timeout = \
                     {store_timeout:?}): a write the replicas do not acknowledge times out instead of being refused; \
                     lower wait_timeout",
                    durability.timeout
                ));
            }
            if durability.timeout * 4 > lease {
                warnings.push(format!(
                    "store: wait_timeout = {:?} leaves a complete few retries within gateway.lease = {lease:?}",
                    durability.timeout
                ));
            }
        }
    }
    warnings
}

//! Redis and Redis Cluster backend.
//!
//! A record is one hash at `<prefix>{<hex of the scoped key>}`: `st` (`i`
//! in flight, `c` completed), `fp` (fingerprint), `fence`, and `resp` (the
//! encoded response, absent when it was too large to keep). The key's Redis
//! TTL *is* the lease while in flight and the retention once completed, so
//! Redis expires records by itself and a lapsed lease is simply no record.
//!
//! Each transition is one Lua script over that one key, so it is atomic and
//! costs one round trip; the replay path is a single `EVALSHA`. The key is
//! hash-tagged (`{…}`) so that any future second key of the same record
//! lands in the same Cluster slot.
//!
//! URLs: `redis://host:port/db`, `rediss://…` (TLS needs a rustls build of
//! the redis crate: not compiled in yet), and
//! `redis+cluster://host1:port1,host2:port2`. Options in the query:
//! `prefix=` (default `idemgate:`), `timeout=` per operation
//! (default `2s`).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{FromRedisValue, IntoConnectionInfo, RedisResult, Script, Value};

use super::{Begin, Store, StoreError, codec, url_options};
use crate::config::ConfigDuration;
use crate::idempotency::{Fence, Fingerprint, Record, ScopedKey, StoredResponse};

const BEGIN: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'resp')
if not r[1] then
  redis.call('HSET', KEYS[1], 'st', 'i', 'fp', ARGV[1], 'fence', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 'acquired'
end
return {r[1], r[2], r[3] or '', r[4] or false, redis.call('PTTL', KEYS[1])}
";

const GET: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'resp')
if not r[1] then return false end
return {r[1], r[2], r[3] or '', r[4] or false, redis.call('PTTL', KEYS[1])}
";

// The fenced transitions share one guard: the record is in flight under ARGV[1].
const RENEW: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

const COMPLETE: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'st', 'c')
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'resp', ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

const RELEASE: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

struct Scripts {
    begin: Script,
    get: Script,
    renew: Script,
    complete: Script,
    release: Script,
}

/// See the module docs.
pub struct RedisStore {
    connection: Connection,
    scripts: Scripts,
    prefix: String,
    timeout: Duration,
}

impl RedisStore {
    /// Connects to the server or cluster a URL names.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut prefix = "idemgate:".to_string();
        let mut timeout = Duration::from_secs(2);
        let mut passthrough = Vec::new();
        for (name, value) in url_options(url) {
            match name {
                "prefix" if !value.contains(['{', '}']) => prefix = value.to_string(),
                "prefix" => return Err(StoreError::InvalidUrl("prefix must not contain '{' or '}'".into())),
                "timeout" => timeout = value.parse::<ConfigDuration>().map_err(StoreError::InvalidUrl)?.0,
                _ => passthrough.push(format!("{name}={value}")),
            }
        }
        let _ = query;
        let suffix = if passthrough.is_empty() { String::new() } else { format!("?{}", passthrough.join("&")) };
        let unavailable = |e: redis::RedisError| StoreError::Unavailable(Box::new(e));
        let connection = if let Some(nodes) = base.strip_prefix("redis+cluster://") {
            let (userinfo, hosts) = nodes.rsplit_once('@').map_or(("", nodes), |(u, h)| (u, h));
            let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
            let hosts = hosts.trim_end_matches('/');
            let urls: Vec<String> =
                hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("redis://{at}{h}{suffix}")).collect();
            if urls.is_empty() {
                return Err(StoreError::InvalidUrl("redis+cluster:// needs at least one host:port".into()));
            }
            let client = redis::cluster::ClusterClient::builder(urls)
                .tcp_settings(no_delay())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(2)
                .build()
                .map_err(|e| StoreError::InvalidUrl(e.to_string()))?;
            Connection::Cluster(client.get_async_connection().await.map_err(unavailable)?)
        } else {
            let info = format!("{base}{suffix}")
                .into_connection_info()
                .map_err(|e| StoreError::InvalidUrl(e.to_string()))?
                .set_tcp_settings(no_delay());
            let client = redis::Client::open(info).map_err(|e| StoreError::InvalidUrl(e.to_string()))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            Connection::Single(ConnectionManager::new_with_config(client, config).await.map_err(unavailable)?)
        };
        Ok(Self {
            connection,
            scripts: Scripts {
                begin: Script::new(BEGIN),
                get: Script::new(GET),
                renew: Script::new(RENEW),
                complete: Script::new(COMPLETE),
                release: Script::new(RELEASE),
            },
            prefix,
            timeout,
        })
    }

    fn redis_key(&self, key: &ScopedKey) -> String {
        format!("{}{{{}}}", self.prefix, key.to_hex())
    }

    async fn run<T: FromRedisValue>(&self, invocation: redis::ScriptInvocation<'_>) -> Result<T, StoreError> {
        let call = async {
            match &self.connection {
                Connection::Single(c) => invoke(invocation, &mut c.clone()).await,
                Connection::Cluster(c) => invoke(invocation, &mut c.clone()).await,
            }
        };
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

async fn invoke<T: FromRedisValue>(
    invocation: redis::ScriptInvocation<'_>,
    connection: &mut impl ConnectionLike,
) -> RedisResult<T> {
    invocation.invoke_async(connection).await
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Reads the `{st, fp, fence, resp, pttl}` array the scripts return.
fn parse_record(value: Value) -> Result<Record, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("redis record: {what}"));
    let Value::Array(fields) = value else {
        return Err(corrupt("not an array"));
    };
    let [st, fp, fence, resp, pttl] = <[Value; 5]>::try_from(fields).map_err(|_| corrupt("wrong field count"))?;
    let bytes = |v: Value| -> Result<Vec<u8>, StoreError> {
        Vec::<u8>::from_redis_value(v).map_err(|_| corrupt("field is not a string"))
    };
    let fingerprint = Fingerprint(bytes(fp)?.try_into().map_err(|_| corrupt("fingerprint is not 32 bytes"))?);
    match bytes(st)?.as_slice() {
        b"i" => {
            let fence = String::from_utf8(bytes(fence)?)
                .ok()
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| corrupt("bad fence"))?;
            let pttl = i64::from_redis_value(pttl).map_err(|_| corrupt("bad ttl"))?;
            Ok(Record::InFlight {
                fingerprint,
                fence: Fence(fence),
                lease_remaining: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
            })
        }
        b"c" => {
            let response = match resp {
                Value::Nil => None,
                other => Some(codec::decode(bytes(other)?)?),
            };
            Ok(Record::Completed { fingerprint, response })
        }
        _ => Err(corrupt("unknown state")),
    }
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
        invocation.arg(&fingerprint.0[..]).arg(fence.0).arg(millis(lease));
        match self.run::<Value>(invocation).await? {
            Value::SimpleString(s) if s == "acquired" => Ok(Begin::Acquired { took_over: false }),
            Value::BulkString(s) if s == b"acquired" => Ok(Begin::Acquired { took_over: false }),
            other => parse_record(other).map(Begin::Existing),
        }
    }

    async fn renew(&self, key: &ScopedKey, fence: Fence, lease: Duration) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.renew.key(self.redis_key(key));
        invocation.arg(fence.0).arg(millis(lease));
        self.run::<i64>(invocation).await.map(|n| n == 1)
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        fence: Fence,
        response: Option<&StoredResponse>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.complete.key(self.redis_key(key));
        invocation.arg(fence.0).arg(millis(ttl));
        match response {
            Some(response) => invocation.arg("1").arg(codec::encode(response)),
            None => invocation.arg("0").arg(""),
        };
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
            other => parse_record(other).map(Some),
        }
    }

    async fn purge(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.redis_key(key));
        let call = async {
            match &self.connection {
                Connection::Single(c) => cmd.query_async::<i64>(&mut c.clone()).await,
                Connection::Cluster(c) => cmd.query_async::<i64>(&mut c.clone()).await,
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map(|n| n == 1).map_err(|e| StoreError::Unavailable(Box::new(e))),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("PING");
        let call = async {
            match &self.connection {
                Connection::Single(c) => cmd.query_async::<String>(&mut c.clone()).await,
                Connection::Cluster(c) => cmd.query_async::<String>(&mut c.clone()).await,
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map(drop).map_err(|e| StoreError::Unavailable(Box::new(e))),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

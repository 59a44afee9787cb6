//! A primary found through Redis Sentinel, and followed across failovers.
//!
//! The redis crate's Sentinel client answers "which node is the primary
//! now": it asks the Sentinels in turn and checks the node it is told of
//! with `ROLE`, so it never hands out a replica. But a connection made from
//! that answer stays with that node — the crate's `ConnectionManager`
//! reconnects to the same address, which after a failover is a replica, or
//! a restarted, empty server. So this wrapper holds one multiplexed
//! connection to the primary and asks the Sentinels again as soon as that
//! connection fails or its node refuses a write (`READONLY`: demoted).
//!
//! A command that met `READONLY` was not run, and one whose connection was
//! refused never left, so those are sent once more to the primary found
//! anew; after any other failure the command may have run, and the caller
//! decides (the gateway's settle loop retries, under the lease). A pipeline
//! goes whole over one connection, so a `WAIT` sent behind a write counts
//! the replicas of that write's node and no other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ErrorKind, IntoConnectionInfo, RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};

use super::no_delay;
use super::options::SentinelTarget;

/// See the module docs. Clones share the connection and the Sentinels.
#[derive(Clone)]
pub(super) struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// Asked one caller at a time: a failover seen by many calls at once
    /// sends the Sentinels one round of questions, not one per call.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<Primary>>,
    generation: AtomicU64,
    config: AsyncConnectionConfig,
    db: i64,
}

/// The connection to the primary as last found, numbered so that a failure
/// on an older one does not drop a newer one.
#[derive(Clone)]
struct Primary {
    generation: u64,
    connection: MultiplexedConnection,
}

impl SentinelConnection {
    /// Checks the Sentinel addresses; connects only when first used.
    pub(super) fn new(
        target: &SentinelTarget,
        certificates: Option<TlsCertificates>,
        timeout: Duration,
    ) -> RedisResult<Self> {
        let sentinels = target
            .sentinels
            .iter()
            .map(|url| url.as_str().into_connection_info().map(|info| info.addr().clone()))
            .collect::<RedisResult<Vec<_>>>()?;
        let mut builder = SentinelClientBuilder::new(sentinels, &target.service, SentinelServerType::Master)?
            .set_client_to_redis_db(target.db)
            .set_client_to_redis_tcp_settings(no_delay())
            .set_client_to_sentinel_tcp_settings(no_delay());
        if let Some(username) = &target.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &target.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(password) = &target.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if target.tls {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certificates) = certificates {
                builder = builder
                    .set_client_to_redis_certificates(certificates.clone())
                    .set_client_to_sentinel_certificates(certificates);
            }
        }
        // No response timeout: the caller bounds every store operation
        // once, end to end (`gateway.store_timeout`, `store::bounded`).
        let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(None);
        let shared = Shared {
            sentinels: tokio::sync::Mutex::new(builder.build()?),
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            config,
            db: target.db,
        };
        Ok(Self { shared: Arc::new(shared) })
    }

    fn current(&self) -> Option<Primary> {
        self.shared.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The connection to the primary, found through the Sentinels when
    /// there is none.
    async fn primary(&self) -> RedisResult<Primary> {
        if let Some(primary) = self.current() {
            return Ok(primary);
        }
        let mut sentinels = self.shared.sentinels.lock().await;
        // Another call may have found it while this one waited.
        if let Some(primary) = self.current() {
            return Ok(primary);
        }
        let client = sentinels.async_get_client().await?;
        let connection = client.get_multiplexed_async_connection_with_config(&self.shared.config).await?;
        let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let primary = Primary { generation, connection };
        *self.shared.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(primary.clone());
        tracing::debug!(generation, "connected to the primary the Sentinels name");
        Ok(primary)
    }

    /// After a call on `primary` that failed, or whose node answered with
    /// an error: forget the connection unless the error was the command's
    /// own (a script's), and say whether the command is safe to send again
    /// (it cannot have run).
    fn failed(&self, primary: &Primary, failure: Failure<'_>) -> bool {
        let (broken, resend) = match failure {
            Failure::Connection(error) => (true, error.is_connection_refusal()),
            Failure::Reply(ServerErrorKind::ReadOnly) => (true, true),
            Failure::Reply(ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading) => (true, false),
            Failure::Reply(_) => (false, false),
        };
        if broken {
            let mut current = self.shared.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|c| c.generation == primary.generation) {
                *current = None;
                tracing::info!(error = ?failure, "the Redis primary failed or was demoted; asking the Sentinels again");
            }
        }
        resend
    }

    /// Sends a command or a pipeline on the primary's connection, and once
    /// more on a newly found primary when it cannot have run.
    async fn send(&self, packed: Packed<'_>) -> RedisResult<Vec<Value>> {
        let mut resent = false;
        loop {
            let mut primary = self.primary().await?;
            let result = match packed {
                Packed::Command(cmd) => primary.connection.req_packed_command(cmd).await.map(|reply| vec![reply]),
                Packed::Pipeline(pipeline, offset, count) => {
                    primary.connection.req_packed_commands(pipeline, offset, count).await
                }
            };
            let failure = match &result {
                Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => None,
                Err(error) => Some(Failure::Connection(error)),
                Ok(replies) => replies.iter().find_map(error_kind).map(Failure::Reply),
            };
            match failure {
                Some(failure) if self.failed(&primary, failure) && !resent => resent = true,
                _ => return result,
            }
        }
    }
}

/// A request as the connection sends it.
#[derive(Clone, Copy)]
enum Packed<'a> {
    Command(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline, usize, usize),
}

/// What went wrong with one call.
#[derive(Debug, Clone, Copy)]
enum Failure<'a> {
    /// The connection failed (or could not be made).
    Connection(&'a redis::RedisError),
    /// The node answered with this error.
    Reply(ServerErrorKind),
}

fn error_kind(value: &Value) -> Option<ServerErrorKind> {
    match value {
        Value::ServerError(error) => error.kind(),
        _ => None,
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move { Ok(self.send(Packed::Command(cmd)).await?.pop().unwrap_or(Value::Nil)) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(self.send(Packed::Pipeline(pipeline, offset, count)))
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}

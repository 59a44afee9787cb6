//! The one connection type the Redis store sends scripts and plain
//! commands on, whatever the deployment: a single node (through the redis
//! crate's connection manager), a Cluster, or the primary Sentinel names.

use redis::Value;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;

use super::sentinel::SentinelConnection;

/// A connection to a single Redis, a Cluster, or the primary Sentinel names.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

// One connection type for scripts and plain commands alike.
impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel(c) => c.req_packed_command(cmd),
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
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Sentinel(c) => c.get_db(),
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
    /// and its refusals may follow a command that did reach a node; the
    /// Sentinel connection sends again itself, to the primary found anew.)
    pub(super) fn never_sent(&self, error: &redis::RedisError) -> bool {
        matches!(self, Self::Single(_)) && error.is_connection_refusal()
    }
}

//! Readiness of a Redis Cluster: every slot has a master, and every master
//! answers. The same walk over the masters reads each one's `INFO
//! replication` for the start-up `wait_replicas` check (`durability`).
//!
//! A `PING` through the redis crate already goes to all masters, but that
//! fan-out leaves out a master it holds no connection to and sends a failed
//! master's share to any other node, so with one master dead (a third of
//! the keys failing) it still answers `PONG`. Instead, readiness reads the
//! slot map from one node (`CLUSTER SLOTS`, which the crate itself reads),
//! requires it to cover every slot, and pings each master by address,
//! which the crate never sends elsewhere. A master the crate holds no
//! connection to (restarted, or added since it last read the slot map)
//! makes it reconnect and read the map again, so readiness heals by itself.
//!
//! A master whose endpoint the reply leaves empty (a node that does not
//! know its own address, or `cluster-preferred-endpoint-type
//! unknown-endpoint`) cannot be named, so it is covered by the slot check
//! alone; a `?` endpoint (unknown hostname) is not ready, since no client
//! can reach the keys behind it.

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, RedisError, Value};

/// Slots in a Redis Cluster.
const SLOTS: i64 = 16384;

/// Why a cluster is not ready.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unready {
    /// The slot map could not be read.
    #[error("cannot read the cluster slot map")]
    SlotMap(#[source] RedisError),
    /// The slot map is not what `CLUSTER SLOTS` returns.
    #[error("unexpected CLUSTER SLOTS reply: {0}")]
    Malformed(&'static str),
    /// Some slots have no master: their keys cannot be stored.
    #[error("cluster slots {from}..={to} have no master")]
    Unserved {
        /// First slot without a master.
        from: i64,
        /// Last slot of that gap.
        to: i64,
    },
    /// A master's endpoint is unknown (`?`): no client can reach it.
    #[error("a cluster master has an unknown endpoint")]
    UnknownEndpoint,
    /// A master did not answer its `PING`.
    #[error("cluster master {address} does not answer")]
    Silent {
        /// `host:port` of the master.
        address: String,
        /// What the connection reported.
        #[source]
        source: RedisError,
    },
}

/// How a `CLUSTER SLOTS` reply names a master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// An address the redis crate connects to by name.
    At {
        /// Host or IP, as the cluster announces it.
        host: String,
        /// Client port.
        port: u16,
    },
    /// An empty, `NULL` or wildcard endpoint: reached through whichever
    /// node answered, so it cannot be pinged by address.
    Unnamed,
}

/// Checks that every slot has a master and every named master answers,
/// one `CLUSTER SLOTS` and then one `PING` per master (the caller bounds
/// the whole check by the store timeout).
pub(super) async fn every_master_answers(connection: &mut ClusterConnection) -> Result<(), Unready> {
    for master in slot_map_masters(connection).await? {
        let Endpoint::At { host, port } = master else { continue };
        ask_master(connection, host, port, redis::cmd("PING")).await?;
    }
    Ok(())
}

/// `INFO replication` of every master the slot map names, with its
/// `host:port`: one `CLUSTER SLOTS`, then one call per master.
pub(super) async fn replication_of_masters(
    connection: &mut ClusterConnection,
) -> Result<Vec<(String, String)>, Unready> {
    let mut infos = Vec::new();
    for master in slot_map_masters(connection).await? {
        let Endpoint::At { host, port } = master else { continue };
        let address = format!("{host}:{port}");
        let reply = ask_master(connection, host, port, redis::cmd("INFO").arg("replication").clone()).await?;
        let info = String::from_redis_value(reply).map_err(|_| Unready::Malformed("INFO answered otherwise"))?;
        infos.push((address, info));
    }
    Ok(infos)
}

/// The masters of the slot map one node answers with ([`masters`]).
async fn slot_map_masters(connection: &mut ClusterConnection) -> Result<Vec<Endpoint>, Unready> {
    let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
    let reply = connection
        .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), random)
        .await
        .and_then(Value::extract_error)
        .map_err(Unready::SlotMap)?;
    masters(reply)
}

/// One command to the master at `host:port`, which the crate never sends
/// elsewhere.
async fn ask_master(connection: &mut ClusterConnection, host: String, port: u16, cmd: Cmd) -> Result<Value, Unready> {
    let address = format!("{host}:{port}");
    let by_address = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
    connection
        .route_command(cmd, by_address)
        .await
        .and_then(Value::extract_error)
        .map_err(|source| Unready::Silent { address, source })
}

/// The masters a `CLUSTER SLOTS` reply names, each once, after checking
/// that its slot ranges cover every slot. Each range is `[from, to,
/// master, replica…]`, a node `[endpoint, port, id, …]`.
pub(super) fn masters(reply: Value) -> Result<Vec<Endpoint>, Unready> {
    let Value::Array(ranges) = reply else { return Err(Unready::Malformed("not an array")) };
    let mut covered = Vec::with_capacity(ranges.len());
    let mut masters = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else { return Err(Unready::Malformed("a slot range is not an array")) };
        let mut fields = fields.into_iter();
        let (Some(Value::Int(from)), Some(Value::Int(to)), Some(master)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(Unready::Malformed("a slot range lacks its bounds or its master"));
        };
        if !(0 <= from && from <= to && to < SLOTS) {
            return Err(Unready::Malformed("a slot range is out of bounds"));
        }
        covered.push((from, to));
        let master = endpoint(master)?;
        if !masters.contains(&master) {
            masters.push(master);
        }
    }
    covered.sort_unstable();
    let mut next = 0;
    for (from, to) in covered {
        if from > next {
            return Err(Unready::Unserved { from: next, to: from - 1 });
        }
        next = next.max(to + 1);
    }
    if next < SLOTS {
        return Err(Unready::Unserved { from: next, to: SLOTS - 1 });
    }
    Ok(masters)
}

fn endpoint(node: Value) -> Result<Endpoint, Unready> {
    let Value::Array(fields) = node else { return Err(Unready::Malformed("a node is not an array")) };
    let mut fields = fields.into_iter();
    let (Some(host), Some(Value::Int(port))) = (fields.next(), fields.next()) else {
        return Err(Unready::Malformed("a node lacks its endpoint or port"));
    };
    let port = u16::try_from(port).map_err(|_| Unready::Malformed("a node's port is out of range"))?;
    let host = match host {
        Value::Nil => return Ok(Endpoint::Unnamed),
        Value::BulkString(bytes) => {
            String::from_utf8(bytes).map_err(|_| Unready::Malformed("a node's endpoint is not UTF-8"))?
        }
        Value::SimpleString(text) => text,
        _ => return Err(Unready::Malformed("a node's endpoint is not a string")),
    };
    match host.as_str() {
        "" | "0.0.0.0" | "::" => Ok(Endpoint::Unnamed),
        "?" => Err(Unready::UnknownEndpoint),
        _ => Ok(Endpoint::At { host, port }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: Option<&str>, port: i64) -> Value {
        let host = host.map_or(Value::Nil, |h| Value::BulkString(h.as_bytes().to_vec()));
        Value::Array(vec![host, Value::Int(port), Value::BulkString(b"id".to_vec())])
    }

    fn range(from: i64, to: i64, master: Value) -> Value {
        Value::Array(vec![Value::Int(from), Value::Int(to), master, node(Some("10.0.0.9"), 7009)])
    }

    fn at(host: &str, port: u16) -> Endpoint {
        Endpoint::At { host: host.into(), port }
    }

    #[test]
    fn three_masters_covering_every_slot_are_each_named_once() {
        let reply = Value::Array(vec![
            range(10923, 16383, node(Some("10.0.0.3"), 7003)),
            range(0, 5000, node(Some("10.0.0.1"), 7001)),
            range(5461, 10922, node(Some("10.0.0.2"), 7002)),
            range(5001, 5460, node(Some("10.0.0.1"), 7001)),
        ]);
        let masters = masters(reply).expect("every slot is covered");
        assert_eq!(masters, [at("10.0.0.3", 7003), at("10.0.0.1", 7001), at("10.0.0.2", 7002)]);
    }

    #[test]
    fn a_gap_in_the_slot_map_names_the_unserved_slots() {
        let reply = Value::Array(vec![range(0, 5460, node(Some("a"), 1)), range(10923, 16383, node(Some("c"), 3))]);
        assert!(matches!(masters(reply), Err(Unready::Unserved { from: 5461, to: 10922 })));
        let tail = Value::Array(vec![range(0, 16000, node(Some("a"), 1))]);
        assert!(matches!(masters(tail), Err(Unready::Unserved { from: 16001, to: 16383 })));
        assert!(matches!(masters(Value::Array(vec![])), Err(Unready::Unserved { from: 0, to: 16383 })));
    }

    #[test]
    fn overlapping_ranges_still_count_as_covered() {
        let reply = Value::Array(vec![range(0, 9000, node(Some("a"), 1)), range(8000, 16383, node(Some("b"), 2))]);
        assert_eq!(masters(reply).expect("covered"), [at("a", 1), at("b", 2)]);
    }

    #[test]
    fn empty_null_and_wildcard_endpoints_are_unnamed_and_a_question_mark_is_not_ready() {
        for host in [None, Some(""), Some("0.0.0.0"), Some("::")] {
            let reply = Value::Array(vec![range(0, 16383, node(host, 7000))]);
            assert_eq!(masters(reply).expect("covered"), [Endpoint::Unnamed], "{host:?}");
        }
        let reply = Value::Array(vec![range(0, 16383, node(Some("?"), 7000))]);
        assert!(matches!(masters(reply), Err(Unready::UnknownEndpoint)));
    }

    #[test]
    fn a_reply_of_another_shape_is_malformed_not_ready() {
        let out_of_bounds = Value::Array(vec![range(0, 16384, node(Some("a"), 1))]);
        let bad_port = Value::Array(vec![range(0, 16383, node(Some("a"), 70000))]);
        let no_master = Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(16383)])]);
        for reply in [Value::Nil, out_of_bounds, bad_port, no_master, Value::Array(vec![Value::Int(1)])] {
            assert!(matches!(masters(reply.clone()), Err(Unready::Malformed(_))), "{reply:?}");
        }
    }
}

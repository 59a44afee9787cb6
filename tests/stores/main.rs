//! The stores: one behavioural contract for every backend, and the Redis
//! deployments (replicas, Sentinel, Cluster) through failovers.
//!
//! One test binary, one module per guarantee:
//!
//! - [`conformance`]: every backend answers every case of the store
//!   contract alike;
//! - [`redis_replicas`]: `wait_replicas` counts a write only once a replica
//!   holds it;
//! - [`redis_failover`]: a Sentinel failover under load repeats no effect;
//! - [`redis_cluster_failover`]: a Cluster master killed under load repeats
//!   no effect.

#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod redis_cluster_failover;
mod redis_failover;
mod redis_replicas;

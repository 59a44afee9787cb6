//! Failovers on a Redis Cluster with a replica per master, counted at the
//! upstream: three times a master is SIGKILLed while keyed requests stream
//! in, each time after its replica fell behind; the replica takes over its
//! slots and the gateway follows the new slot map without a restart. The
//! client model and the figures are `support::failover_load`'s: with
//! `wait_replicas=1` no key runs twice and every re-send is a replay;
//! without it, the re-sends of keys whose records were lost run again.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use idemgate::config::ConfigDuration;
use support::failover_load::{Figures, keys_through_failovers};
use support::gateway::{TestGateway, config};
use support::redis_cluster_replicas::ReplicatedCluster;
use support::redis_server::unique_prefix;
use support::upstream::Upstream;

const FAILOVERS: usize = 3;

async fn failovers_under_load(options: &str) -> Figures {
    let mut cluster = tokio::task::spawn_blocking(ReplicatedCluster::start).await.expect("start the cluster");
    let upstream = Upstream::start().await;
    let store = cluster.url(&format!("prefix={}&{options}", unique_prefix()));
    let mut config = config(&upstream.url(), &store);
    config.gateway.lease = ConfigDuration(Duration::from_secs(10));
    let gateway = Arc::new(TestGateway::start(config).await);
    let mut killed = Vec::new();
    let fail_over = async |_round| {
        // A different shard each time: a master not killed before.
        let master = tokio::task::block_in_place(|| cluster.a_master(&killed));
        let replica = tokio::task::block_in_place(|| cluster.replica_of(master));
        cluster.fall_behind(replica);
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::task::block_in_place(|| {
            cluster.kill(master);
            cluster.catch_up(replica);
            cluster.wait_until_promoted(replica);
            cluster.restart(master);
        });
        killed.extend([master, replica]);
    };
    keys_through_failovers(gateway, &upstream, FAILOVERS, fail_over).await
}

#[tokio::test(flavor = "multi_thread")]
async fn with_wait_replicas_no_key_runs_twice_across_cluster_failovers_to_replicas_that_fell_behind() {
    let figures = failovers_under_load("wait_replicas=1").await;
    eprintln!("cluster, wait_replicas=1, {FAILOVERS} failovers: {figures:?}");
    assert_eq!(figures.second_executions, 0, "{figures:?}");
    assert_eq!(figures.resends_replayed, figures.keys, "every re-send is a replay: {figures:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_wait_replicas_a_cluster_failover_to_a_replica_that_fell_behind_runs_keys_twice() {
    let figures = failovers_under_load("").await;
    eprintln!("cluster, no wait_replicas, {FAILOVERS} failovers: {figures:?}");
    assert!(figures.second_executions > 0, "the lost writes let re-sends run again: {figures:?}");
}

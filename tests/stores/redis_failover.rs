//! Failovers under load, counted at the upstream: a primary, a replica and
//! three Sentinels (`redis+sentinel://`), the primary SIGKILLed three
//! times while keyed requests stream in, and each time the replica that is
//! promoted had fallen behind first (cut off its primary while writes went
//! on).
//!
//! The client model: each key is retried with the same body until it gets
//! a 2xx; once the failovers are over, every key that got one is sent once
//! more, as a client whose answer was lost would. With `wait_replicas=1`
//! no key runs twice and every re-send is a replay. Without it, the writes
//! the promoted replica never received are lost, and the re-sends of
//! those keys run again: the test counts them, and requires some.
//!
//! The same once over TLS only (`rediss+sentinel://`, every node and
//! Sentinel on a TLS port alone, certificates from a CA of the test's own
//! given as `ca_file=`).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use idemgate::config::ConfigDuration;
use support::failover_load::{Figures, keys_through_failovers};
use support::gateway::{TestGateway, config};
use support::redis_replicas::{DATA_PASSWORD, Replicated, query};
use support::redis_server::unique_prefix;
use support::upstream::Upstream;

const FAILOVERS: usize = 3;

/// One failover test at a time: each runs five Redis processes and a
/// stream of requests, and a Sentinel starved of CPU for its
/// down-after period takes a busy primary for dead and fails over on its
/// own (seen with the three tests at once on a loaded 2-core machine).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Keys stream in while the primary is killed [`FAILOVERS`] times, each
/// time after its replica fell behind.
async fn failovers_under_load(options: &str) -> Figures {
    let redis = tokio::task::spawn_blocking(Replicated::start_with_sentinels).await.expect("start redis");
    failovers_of(redis, FAILOVERS, options).await.0
}

/// Keys stream in through `redis`'s Sentinels while its primary is
/// killed `rounds` times; the figures, and the node that is primary at
/// the end.
async fn failovers_of(mut redis: Replicated, rounds: usize, options: &str) -> (Figures, Replicated, usize) {
    let upstream = Upstream::start().await;
    let store = redis.sentinel_url(&format!("prefix={}&{options}", unique_prefix()));
    let mut config = config(&upstream.url(), &store);
    // Longer than a failover and a resync: a complete retried across one
    // keeps its lease.
    config.gateway.lease = ConfigDuration(Duration::from_secs(10));
    let gateway = Arc::new(TestGateway::start(config).await);
    let mut primary = 0;
    let fail_over = async |_round| {
        let replica = 1 - primary;
        // A window in which the replica falls behind while the primary
        // goes on acknowledging.
        redis.fall_behind(replica);
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::task::block_in_place(|| {
            redis.kill(primary);
            redis.catch_up(replica);
            redis.wait_until_sentinels_name(replica);
            redis.restart_as_replica(primary, replica);
        });
        primary = replica;
    };
    let figures = keys_through_failovers(gateway, &upstream, rounds, fail_over).await;
    (figures, redis, primary)
}

#[tokio::test(flavor = "multi_thread")]
async fn with_wait_replicas_no_key_runs_twice_across_failovers_to_replicas_that_fell_behind() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let figures = failovers_under_load("wait_replicas=1").await;
    eprintln!("sentinel, wait_replicas=1, {FAILOVERS} failovers: {figures:?}");
    assert_eq!(figures.second_executions, 0, "{figures:?}");
    assert_eq!(figures.resends_replayed, figures.keys, "every re-send is a replay: {figures:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_wait_replicas_a_failover_to_a_replica_that_fell_behind_runs_keys_twice() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let figures = failovers_under_load("").await;
    eprintln!("sentinel, no wait_replicas, {FAILOVERS} failovers: {figures:?}");
    assert!(figures.second_executions > 0, "the lost writes let re-sends run again: {figures:?}");
    assert!(figures.resends_replayed < figures.keys, "{figures:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn over_tls_only_a_failover_is_followed_and_with_wait_replicas_no_key_runs_twice() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = tokio::task::spawn_blocking(Replicated::start_tls_with_sentinels).await.expect("start redis");
    for port in [redis.port(0), redis.port(1), redis.sentinel_port(0)] {
        let plain = query(port, Some(DATA_PASSWORD), &["PING"]);
        assert!(plain.is_err(), "port {port} answered a plaintext client: {plain:?}");
    }
    let (figures, redis, primary) = failovers_of(redis, 1, "wait_replicas=1").await;
    eprintln!("sentinel over TLS, wait_replicas=1, 1 failover: {figures:?}");
    assert_eq!(primary, 1, "the replica was promoted");
    assert_eq!(figures.second_executions, 0, "{figures:?}");
    assert_eq!(figures.resends_replayed, figures.keys, "every re-send is a replay: {figures:?}");
    let held = tokio::task::block_in_place(|| redis.keys(primary));
    assert_eq!(usize::try_from(held).unwrap(), figures.keys, "the promoted node holds every key's record");
}

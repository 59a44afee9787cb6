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

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idemgate::config::ConfigDuration;
use support::gateway::{Reply, TestGateway, config};
use support::redis_replicas::Replicated;
use support::redis_server::unique_prefix;
use support::upstream::Upstream;

const CHARGE: &str = r#"{"amount": 500, "currency": "eur"}"#;
const FAILOVERS: usize = 3;
const CLIENTS: usize = 4;

/// What one run measured.
#[derive(Debug)]
struct Figures {
    keys: usize,
    second_executions: u64,
    resends_replayed: usize,
}

/// Keys stream in from [`CLIENTS`] clients while the primary is killed
/// [`FAILOVERS`] times, each time after its replica fell behind.
async fn failovers_under_load(options: &str) -> Figures {
    let mut redis = tokio::task::spawn_blocking(Replicated::start_with_sentinels).await.expect("start redis");
    let upstream = Upstream::start().await;
    let store = redis.sentinel_url(&format!("prefix={}&{options}", unique_prefix()));
    let mut config = config(&upstream.url(), &store);
    // Longer than a failover and a resync: a complete retried across one
    // keeps its lease.
    config.gateway.lease = ConfigDuration(Duration::from_secs(10));
    let gateway = Arc::new(TestGateway::start(config).await);

    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (gateway, done, answered) = (gateway.clone(), done.clone(), answered.clone());
            tokio::spawn(async move {
                let mut keys = Vec::new();
                while !done.load(Ordering::SeqCst) {
                    let key = format!("c{client}-k{}", keys.len());
                    retry_until_2xx(&gateway, &key).await;
                    answered.fetch_add(1, Ordering::SeqCst);
                    keys.push(key);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                keys
            })
        })
        .collect();

    let mut primary = 0;
    for _ in 0..FAILOVERS {
        let replica = 1 - primary;
        // Some traffic first, then a window in which the replica falls
        // behind while the primary goes on acknowledging.
        wait_for_answers(&answered, 20).await;
        redis.fall_behind(replica);
        tokio::time::sleep(Duration::from_millis(400)).await;
        redis = tokio::task::spawn_blocking(move || {
            redis.kill(primary);
            redis.catch_up(replica);
            redis.wait_until_sentinels_name(replica);
            redis.restart_as_replica(primary, replica);
            redis.wait_until_sentinels_know_everyone(primary);
            redis
        })
        .await
        .expect("fail over");
        primary = replica;
    }
    wait_for_answers(&answered, 20).await;
    done.store(true, Ordering::SeqCst);
    let mut keys = Vec::new();
    for client in clients {
        keys.extend(client.await.expect("a client's task"));
    }

    let mut resends_replayed = 0;
    for key in &keys {
        resends_replayed += usize::from(retry_until_2xx(&gateway, key).await.replayed());
    }
    let second_executions = keys.iter().map(|k| upstream.count_for(k).saturating_sub(1)).sum();
    drop(redis);
    Figures { keys: keys.len(), second_executions, resends_replayed }
}

/// The client model: the same request until it gets a 2xx (a key whose
/// record was lost in flight waits out its lease, `409`, then runs again).
async fn retry_until_2xx(gateway: &TestGateway, key: &str) -> Reply {
    for _ in 0..2000 {
        let reply = gateway.post("/charge").key(key).json(CHARGE).send().await;
        if (200..300).contains(&reply.status) {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{key} never got a 2xx");
}

/// Waits until `more` keys beyond the present count have had their 2xx.
async fn wait_for_answers(answered: &AtomicU64, more: u64) {
    let target = answered.load(Ordering::SeqCst) + more;
    while answered.load(Ordering::SeqCst) < target {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_wait_replicas_no_key_runs_twice_across_failovers_to_replicas_that_fell_behind() {
    let figures = failovers_under_load("wait_replicas=1").await;
    eprintln!("sentinel, wait_replicas=1, {FAILOVERS} failovers: {figures:?}");
    assert_eq!(figures.second_executions, 0, "{figures:?}");
    assert_eq!(figures.resends_replayed, figures.keys, "every re-send is a replay: {figures:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_wait_replicas_a_failover_to_a_replica_that_fell_behind_runs_keys_twice() {
    let figures = failovers_under_load("").await;
    eprintln!("sentinel, no wait_replicas, {FAILOVERS} failovers: {figures:?}");
    assert!(figures.second_executions > 0, "the lost writes let re-sends run again: {figures:?}");
    assert!(figures.resends_replayed < figures.keys, "{figures:?}");
}

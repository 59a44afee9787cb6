//! The client model of the failover tests, and what it measures.
//!
//! [`CLIENTS`] clients send keyed requests without pause; each key is
//! retried with the same body until it gets a 2xx (a key whose record was
//! lost in flight waits out its lease on `409`, then runs again). Between
//! failovers the test lets at least [`BETWEEN`] keys get their answer.
//! Once the failovers are over, every key that got a 2xx is sent once
//! more, as a client whose answer was lost would, and the upstream's
//! counts say how many keys ran more than once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::gateway::{Reply, TestGateway};
use super::upstream::Upstream;

pub const CHARGE: &str = r#"{"amount": 500, "currency": "eur"}"#;
pub const CLIENTS: usize = 4;
/// Keys answered before each failover, and after the last.
pub const BETWEEN: u64 = 20;

/// What one run measured.
#[derive(Debug)]
pub struct Figures {
    /// Keys that got a 2xx.
    pub keys: usize,
    /// Executions beyond the first, summed over the keys.
    pub second_executions: u64,
    /// Re-sends answered with a replay.
    pub resends_replayed: usize,
}

/// Streams keys through `gateway` while `fail_over(round)` runs for each
/// of `rounds` rounds, then re-sends every key.
pub async fn keys_through_failovers<F: AsyncFnMut(usize)>(
    gateway: Arc<TestGateway>,
    upstream: &Upstream,
    rounds: usize,
    mut fail_over: F,
) -> Figures {
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
    for round in 0..rounds {
        wait_for_answers(&answered, BETWEEN).await;
        fail_over(round).await;
    }
    wait_for_answers(&answered, BETWEEN).await;
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
    Figures { keys: keys.len(), second_executions, resends_replayed }
}

/// The same request until it gets a 2xx.
pub async fn retry_until_2xx(gateway: &TestGateway, key: &str) -> Reply {
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

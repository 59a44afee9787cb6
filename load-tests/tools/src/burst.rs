//! P5's client: for each of `--keys` keys, `--rounds` rounds of
//! `--concurrency` requests sent at once (released together by a barrier,
//! each on its own connection). Reports status counts and replays; the
//! harness compares them with the counting upstream's tally.
//!
//! Flags: `--target 127.0.0.1:PORT`, `--keys 20`, `--concurrency 64`,
//! `--rounds 3`, `--prefix NONCE`, `--timeout-ms 30000` (whole run).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Barrier;

use crate::Args;
use crate::client::{Connection, Shape};

pub fn main(args: &Args) -> Result<(), String> {
    let target = args.loopback("target")?;
    let keys = args.num("keys", 20)?;
    let concurrency = args.num("concurrency", 64)? as usize;
    let rounds = args.num("rounds", 3)?;
    let prefix = args.str("prefix", "p5");
    let timeout = Duration::from_millis(args.num("timeout-ms", 30_000)?);
    let shape =
        Shape { method: http::Method::POST, path: "/v1/charges".into(), body: Bytes::from_static(b"{\"amount\":500}") };
    crate::runtime(2)?.block_on(async move {
        let mut connections = Vec::with_capacity(concurrency);
        for _ in 0..concurrency {
            connections.push(Connection::open(target).await?);
        }
        let run = async {
            let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
            let (mut replays, mut errors) = (0u64, 0u64);
            for k in 0..keys {
                let key = format!("{prefix}-{k}");
                for _ in 0..rounds {
                    let barrier = Arc::new(Barrier::new(concurrency));
                    let mut tasks = Vec::with_capacity(concurrency);
                    for mut connection in connections.drain(..) {
                        let (barrier, key, shape) = (barrier.clone(), key.clone(), shape.clone());
                        tasks.push(tokio::spawn(async move {
                            barrier.wait().await;
                            let answer = connection.send(&shape, Some(&key)).await;
                            (connection, answer)
                        }));
                    }
                    for task in tasks {
                        let (connection, answer) = task.await.map_err(|e| e.to_string())?;
                        connections.push(connection);
                        match answer {
                            Ok(answer) => {
                                *statuses.entry(answer.status.as_u16()).or_default() += 1;
                                replays += u64::from(answer.replayed);
                            }
                            Err(e) => {
                                errors += 1;
                                eprintln!("lt burst: {e}");
                            }
                        }
                    }
                }
            }
            Ok::<_, String>((statuses, replays, errors))
        };
        let (statuses, replays, errors) =
            tokio::time::timeout(timeout, run).await.map_err(|_| "timed out".to_string())??;
        let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("\"{s}\":{n}")).collect();
        println!(
            "{{\"keys\":{keys},\"rounds\":{rounds},\"concurrency\":{concurrency},\"requests\":{},\"status\":{{{}}},\"replays\":{replays},\"errors\":{errors}}}",
            keys * rounds * concurrency as u64,
            statuses.join(",")
        );
        Ok(())
    })
}

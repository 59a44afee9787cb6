//! An open-loop load generator at a fixed rate (P6).
//!
//! A pacer thread releases request `i` at `start + i / rate` (a plain OS
//! thread with `nanosleep`, finer than the async timer's millisecond
//! wheel); `--connections` workers each take the next released request and
//! send it on their own keep-alive connection. Latency runs from the
//! *scheduled* time to the end of the response body, so a request that had
//! to wait for a free connection counts its wait: a stalled server cannot
//! hide behind a generator that slowed down with it.
//!
//! Flags: `--target 127.0.0.1:PORT`, `--rate 2000`, `--duration-ms 10000`,
//! `--warmup-ms 1000` (sent, not measured), `--connections 64`,
//! `--method POST|GET`, `--path /v1/charges`, `--body JSON`,
//! `--keys unique|none`, `--prefix NONCE`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Mutex, mpsc};

use crate::Args;
use crate::client::{Connection, Shape};

pub fn main(args: &Args) -> Result<(), String> {
    let target = args.loopback("target")?;
    let rate = args.num("rate", 2000)?.max(1);
    let duration = Duration::from_millis(args.num("duration-ms", 10_000)?);
    let warmup = Duration::from_millis(args.num("warmup-ms", 1_000)?);
    let connections = args.num("connections", 64)?.max(1) as usize;
    let method = http::Method::from_bytes(args.str("method", "POST").as_bytes()).map_err(|e| e.to_string())?;
    let shape = Shape {
        method,
        path: args.str("path", "/v1/charges"),
        body: Bytes::from(args.str("body", "{\"amount\":500}")),
    };
    let unique = args.str("keys", "unique") == "unique";
    let prefix = args.str("prefix", "p6");
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let warm = (warmup.as_nanos() / interval.as_nanos()) as u64;
    let total = warm + (duration.as_nanos() / interval.as_nanos()) as u64;

    let runtime = crate::runtime(1)?;
    let (tx, rx) = mpsc::unbounded_channel::<(u64, Instant)>();
    let rx = Arc::new(Mutex::new(rx));
    let mut pool = Vec::with_capacity(connections);
    for _ in 0..connections {
        pool.push(runtime.block_on(Connection::open(target))?);
    }
    let start = Instant::now() + Duration::from_millis(20);
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let at = start + interval * i as u32;
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if tx.send((i, at)).is_err() {
                break;
            }
        }
    });
    let results = runtime.block_on(async {
        let mut workers = Vec::with_capacity(connections);
        for (w, mut connection) in pool.into_iter().enumerate() {
            let (rx, shape, prefix) = (rx.clone(), shape.clone(), prefix.clone());
            workers.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let (mut errors, mut non_2xx) = (0u64, 0u64);
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some((i, scheduled)) = next else { break };
                    let key = unique.then(|| format!("{prefix}-{w}-{i}"));
                    let answer = connection.send(&shape, key.as_deref()).await;
                    if i < warm {
                        continue;
                    }
                    match answer {
                        Ok(a) if a.status.is_success() => latencies.push(scheduled.elapsed().as_micros() as u64),
                        Ok(_) => non_2xx += 1,
                        Err(_) => errors += 1,
                    }
                }
                (latencies, errors, non_2xx)
            }));
        }
        let mut all = Vec::new();
        let (mut errors, mut non_2xx) = (0, 0);
        for worker in workers {
            let (latencies, e, n) = worker.await.map_err(|e| e.to_string())?;
            all.extend(latencies);
            errors += e;
            non_2xx += n;
        }
        Ok::<_, String>((all, errors, non_2xx))
    });
    let _ = pacer.join();
    let (mut latencies, errors, non_2xx) = results?;
    let ok = latencies.len();
    println!(
        "{{\"rate\":{rate},\"duration_s\":{},\"sent\":{},\"ok\":{ok},\"non_2xx\":{non_2xx},\"errors\":{errors},{}}}",
        duration.as_secs_f64(),
        total - warm,
        crate::percentiles(&mut latencies)
    );
    Ok(())
}

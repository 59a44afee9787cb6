//! A closed-loop generator of signed webhook deliveries (W1).
//!
//! wrk cannot compute an HMAC per request, and first deliveries need a
//! new event id, so a new body and a new signature, on every request.
//! Each of `--connections` workers sends, on its own keep-alive
//! connection, one Stripe-style delivery after another until the time is
//! up: a `--body-bytes` JSON event whose `id` is unique (`--keys unique`)
//! or walks `--space` ids per worker (`--keys cycle`: after a first pass,
//! every delivery is a redelivery), signed as Stripe does
//! (`Stripe-Signature: t=<now>,v1=hex(HMAC-SHA256(secret, "t.body"))`).
//! The same deliveries, signature included, go to the route that
//! verifies and to the one that does not, so the generator's own cost is
//! the same on both sides of the ratio.
//!
//! Flags: `--target 127.0.0.1:PORT`, `--path /webhooks/verified`,
//! `--duration-ms 8000`, `--connections 32`, `--threads 1`,
//! `--secret whsec_…`, `--body-bytes 2048`, `--keys unique|cycle`,
//! `--space 100`, `--prefix NONCE`. Prints wrk's figures as JSON:
//! requests, duration, errors by kind, non-2xx, latency percentiles.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ring::hmac;

use crate::Args;
use crate::client::Connection;

pub fn main(args: &Args) -> Result<(), String> {
    let target = args.loopback("target")?;
    let path = args.str("path", "/webhooks/verified");
    let duration = Duration::from_millis(args.num("duration-ms", 8_000)?);
    let connections = args.num("connections", 32)?.max(1) as usize;
    let threads = args.num("threads", 1)?.max(1) as usize;
    let key = hmac::Key::new(hmac::HMAC_SHA256, args.str("secret", "whsec_load_test").as_bytes());
    let body_bytes = args.num("body-bytes", 2048)? as usize;
    let cycle = match args.str("keys", "unique").as_str() {
        "unique" => None,
        "cycle" => Some(args.num("space", 100)?.max(1)),
        other => return Err(format!("--keys {other:?}: unique or cycle")),
    };
    let prefix = args.str("prefix", "w1");

    let runtime = crate::runtime(threads)?;
    let started = Instant::now();
    let deadline = started + duration;
    let results = runtime.block_on(async {
        let mut workers = Vec::with_capacity(connections);
        for w in 0..connections {
            let mut connection = Connection::open(target).await?;
            let (key, path, prefix) = (key.clone(), path.clone(), prefix.clone());
            workers.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let (mut errors, mut non_2xx) = (0u64, 0u64);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let id = format!("evt_{prefix}_{w}_{}", cycle.map_or(n, |space| n % space));
                    n += 1;
                    let body = event(&id, body_bytes);
                    let signature = sign(&key, &body);
                    let sent = Instant::now();
                    match connection.send_signed(&path, &signature, Bytes::from(body)).await {
                        Ok(status) if status.is_success() => latencies.push(sent.elapsed().as_micros() as u64),
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
    let elapsed = started.elapsed();
    let (mut latencies, errors, non_2xx) = results?;
    let requests = latencies.len() as u64 + errors + non_2xx;
    println!(
        "{{\"requests\":{requests},\"duration_us\":{},\"connect_errors\":0,\"read_errors\":{errors},\
         \"write_errors\":0,\"status_errors\":{non_2xx},\"timeouts\":0,{}}}",
        elapsed.as_micros(),
        crate::percentiles(&mut latencies)
    );
    Ok(())
}

/// A Stripe-style event of `size` bytes (at least its fields), its `id` first.
fn event(id: &str, size: usize) -> String {
    let head = format!(
        r#"{{"id":"{id}","object":"event","type":"payment_intent.succeeded","pending_webhooks":1,"data":{{"object":{{"padding":""#
    );
    let tail = r#""}}}"#;
    let padding = size.saturating_sub(head.len() + tail.len());
    let mut body = String::with_capacity(head.len() + padding + tail.len());
    body.push_str(&head);
    body.extend(std::iter::repeat_n('x', padding));
    body.push_str(tail);
    body
}

/// `t=<now>,v1=<hex>`, as Stripe signs.
fn sign(key: &hmac::Key, body: &str) -> String {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut context = hmac::Context::with_key(key);
    context.update(t.to_string().as_bytes());
    context.update(b".");
    context.update(body.as_bytes());
    let tag = context.sign();
    let mut signature = format!("t={t},v1=");
    for byte in tag.as_ref() {
        signature.push_str(&format!("{byte:02x}"));
    }
    signature
}

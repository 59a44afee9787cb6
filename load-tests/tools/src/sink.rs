//! A delivery sink for the outbox scenarios (P7, P8, R1): answers every
//! `POST` with `200 ok` — at once, or after `--delay-ms` (R1's slow
//! destination) — and records its `Idempotency-Key` and the time it
//! arrived (wall clock, microseconds since the Unix epoch, so the harness
//! can set it against commit times taken by another process on this
//! machine).
//!
//! - `GET /__stats` → `{"received":N,"distinct":D,"first_us":T0,"last_us":T1}`
//!   where `first_us`/`last_us` are the first and last arrivals.
//! - `GET /__dump` → one line per arrival, `KEY MICROS`, in arrival order.
//!
//! Bounded: at most `--max-records` arrivals are kept (later ones are
//! still counted), and it exits by itself after `--lifetime-ms`.
//!
//! Flags: `--listen 127.0.0.1:PORT`, `--max-records 2000000`,
//! `--lifetime-ms 900000`, `--threads 1`, `--delay-ms 0`.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::Args;

struct Log {
    arrivals: Vec<(Box<str>, u64)>,
    distinct: HashSet<Box<str>>,
    received: u64,
    first_us: u64,
    last_us: u64,
    max: usize,
}

pub fn main(args: &Args) -> Result<(), String> {
    let listen = args.loopback("listen")?;
    let max = args.num("max-records", 2_000_000)? as usize;
    let lifetime = Duration::from_millis(args.num("lifetime-ms", 15 * 60 * 1000)?);
    let threads = args.num("threads", 1)?.max(1) as usize;
    let delay = Duration::from_millis(args.num("delay-ms", 0)?);
    let log = Arc::new(Mutex::new(Log {
        arrivals: Vec::with_capacity(max.min(200_000)),
        distinct: HashSet::new(),
        received: 0,
        first_us: 0,
        last_us: 0,
        max,
    }));
    crate::runtime(threads)?.block_on(crate::serve_http(listen, lifetime, move |r| answer(r, log.clone(), delay)))
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

async fn answer(
    request: Request<Incoming>,
    log: Arc<Mutex<Log>>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    if parts.method == Method::POST {
        // The time the head arrived: the body is a few bytes behind it.
        let at = now_us();
        let key: Box<str> =
            parts.headers.get("idempotency-key").map_or("".into(), |v| String::from_utf8_lossy(v.as_bytes()).into());
        let _ = body.collect().await;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        log.received += 1;
        if log.first_us == 0 {
            log.first_us = at;
        }
        log.last_us = log.last_us.max(at);
        if log.arrivals.len() < log.max {
            log.distinct.insert(key.clone());
            log.arrivals.push((key, at));
        }
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    }
    let log = log.lock().unwrap_or_else(|p| p.into_inner());
    let text = match parts.uri.path() {
        "/__stats" => {
            format!(
                "{{\"received\":{},\"distinct\":{},\"first_us\":{},\"last_us\":{}}}",
                log.received,
                log.distinct.len(),
                log.first_us,
                log.last_us
            )
        }
        "/__dump" => {
            let mut text = String::with_capacity(log.arrivals.len() * 82);
            for (key, at) in &log.arrivals {
                text.push_str(key);
                text.push(' ');
                text.push_str(&at.to_string());
                text.push('\n');
            }
            text
        }
        _ => "ok".to_string(),
    };
    Ok(Response::new(Full::new(Bytes::from(text))))
}

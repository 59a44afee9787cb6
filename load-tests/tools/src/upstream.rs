//! A counting upstream for P5: every `POST` is counted per `Idempotency-Key`
//! and answered `201` after `--delay-ms`; `GET /__counts` reports
//! `{"keys":K,"calls":C,"max_per_key":M,"unkeyed":U}`. Anything else gets
//! `200 ok`. It exits by itself after `--lifetime-ms` (default 15 minutes).
//! With `--count 0` it counts nothing and answers every request `200 ok` at
//! once: the static upstream when nginx is not installed.
//!
//! Flags: `--listen 127.0.0.1:PORT`, `--delay-ms 50`, `--count 1`,
//! `--lifetime-ms N`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::Args;

#[derive(Default)]
struct Counts {
    per_key: HashMap<String, u64>,
    unkeyed: u64,
}

pub fn main(args: &Args) -> Result<(), String> {
    let listen = args.loopback("listen")?;
    let delay = Duration::from_millis(args.num("delay-ms", 50)?);
    let lifetime = Duration::from_millis(args.num("lifetime-ms", 15 * 60 * 1000)?);
    let counts = (args.num("count", 1)? != 0).then(|| Arc::new(Mutex::new(Counts::default())));
    crate::runtime(1)?.block_on(crate::serve_http(listen, lifetime, move |r| answer(r, counts.clone(), delay)))
}

async fn answer(
    request: Request<Incoming>,
    counts: Option<Arc<Mutex<Counts>>>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let Some(counts) = counts else {
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    };
    let (parts, body) = request.into_parts();
    let _ = body.collect().await;
    if parts.method == Method::GET && parts.uri.path() == "/__counts" {
        let report = {
            let counts = counts.lock().unwrap_or_else(|p| p.into_inner());
            format!(
                "{{\"keys\":{},\"calls\":{},\"max_per_key\":{},\"unkeyed\":{}}}",
                counts.per_key.len(),
                counts.per_key.values().sum::<u64>(),
                counts.per_key.values().max().copied().unwrap_or(0),
                counts.unkeyed
            )
        };
        return Ok(Response::new(Full::new(Bytes::from(report))));
    }
    if parts.method != Method::POST {
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    }
    let key = parts.headers.get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let call = {
        let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
        match key {
            Some(key) => {
                let n = counts.per_key.entry(key).or_default();
                *n += 1;
                *n
            }
            None => {
                counts.unkeyed += 1;
                counts.unkeyed
            }
        }
    };
    tokio::time::sleep(delay).await;
    let mut response = Response::new(Full::new(Bytes::from(format!("{{\"call\":{call}}}"))));
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}

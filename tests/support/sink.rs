//! A destination for outbox tests: a real HTTP server on port 0 that
//! records every request it receives, in arrival order.
//!
//! It obeys the payload it receives, so a test scripts a message's fate
//! when it enqueues it:
//! - `{"status": N}` → answers `N` (default `200`);
//! - `{"retry_after": "…"}` → adds that `Retry-After` header;
//! - `{"delay_ms": N}` → answers after `N` ms.
//!
//! [`Sink::fail_with`] overrides the status of every answer until cleared,
//! and [`Sink::retry_after`] adds a `Retry-After` to every failure.
//!
//! It is also the idempotent downstream the fault tests check against: a
//! `2xx` answer to a key it has not acknowledged before applies the
//! request's *effect* (marked [`Received::effect`]); a later request with
//! that key and the same body is acknowledged again without a second
//! effect; one with another body is refused with `422`, as an API that
//! honours `Idempotency-Key` does. A request without a key cannot be
//! deduplicated: each one it acknowledges is an effect of its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::Notify;

use super::http_server::HttpServer;

/// One request as received, and how it was answered.
#[derive(Debug, Clone)]
pub struct Received {
    pub key: String,
    pub payload: serde_json::Value,
    pub headers: http::HeaderMap,
    /// The body, byte for byte.
    pub body: Bytes,
    /// The status answered.
    pub status: u16,
    /// The `Retry-After` answered, if any.
    pub retry_after: Option<String>,
    /// Whether this request applied its key's effect (the first acknowledged one).
    pub effect: bool,
    /// When it was answered.
    pub at: Instant,
}

#[derive(Default)]
struct Log {
    received: Vec<Received>,
    /// The body of each key's effect.
    applied: HashMap<String, Bytes>,
}

#[derive(Default)]
struct State {
    log: Mutex<Log>,
    fail_with: Mutex<Option<u16>>,
    retry_after: Mutex<Option<String>>,
    signal: Notify,
}

pub struct Sink {
    pub addr: SocketAddr,
    state: Arc<State>,
    _server: HttpServer,
}

impl Sink {
    pub async fn start() -> Self {
        let state = Arc::new(State::default());
        let shared = state.clone();
        let server = HttpServer::start(move |r| handle(r, shared.clone())).await;
        Self { addr: server.addr, state, _server: server }
    }

    pub fn url(&self) -> String {
        format!("http://{}/deliver", self.addr)
    }

    /// Answers every request with `status` (or, with `None`, as the payload says).
    pub fn fail_with(&self, status: Option<u16>) {
        *self.state.fail_with.lock().unwrap() = status;
    }

    /// Adds `Retry-After: value` to every answer that is not a `2xx` (or, with `None`, as the payload says).
    pub fn retry_after(&self, value: Option<&str>) {
        *self.state.retry_after.lock().unwrap() = value.map(str::to_owned);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.log.lock().unwrap().received.clone()
    }

    pub fn count(&self) -> usize {
        self.state.log.lock().unwrap().received.len()
    }

    pub fn count_for(&self, key: &str) -> usize {
        self.state.log.lock().unwrap().received.iter().filter(|r| r.key == key).count()
    }

    /// Effects applied so far.
    pub fn effects(&self) -> usize {
        self.state.log.lock().unwrap().received.iter().filter(|r| r.effect).count()
    }

    /// Waits until `n` requests have arrived, at most `limit`; `false` on timeout.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> bool {
        self.wait_until(|log| log.received.len() >= n, limit).await
    }

    /// Waits until `n` effects have been applied, at most `limit`; `false` on timeout.
    pub async fn wait_for_effects(&self, n: usize, limit: Duration) -> bool {
        self.wait_until(|log| log.received.iter().filter(|r| r.effect).count() >= n, limit).await
    }

    async fn wait_until(&self, done: impl Fn(&Log) -> bool, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                let notified = self.state.signal.notified();
                if done(&self.state.log.lock().unwrap()) {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }
}

async fn handle(request: Request<Incoming>, state: Arc<State>) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let headers = request.headers().clone();
    let key =
        headers.get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).unwrap_or_default();
    let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let payload: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    if let Some(ms) = payload.get("delay_ms").and_then(|v| v.as_u64()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let scripted = payload.get("status").and_then(|v| v.as_u64()).unwrap_or(200) as u16;
    let mut status = state.fail_with.lock().unwrap().unwrap_or(scripted);
    let mut retry_after = payload.get("retry_after").and_then(|v| v.as_str()).map(str::to_owned);
    let mut log = state.log.lock().unwrap();
    let mut effect = false;
    if (200..300).contains(&status) {
        match log.applied.get(&key) {
            _ if key.is_empty() => effect = true,
            None => {
                log.applied.insert(key.clone(), body.clone());
                effect = true;
            }
            Some(first) if *first == body => {} // a repeat: acknowledged, not applied again
            Some(_) => status = 422,            // the key of another request
        }
    }
    if !(200..300).contains(&status) {
        retry_after = state.retry_after.lock().unwrap().clone().or(retry_after);
    }
    let at = Instant::now();
    log.received.push(Received { key, payload, headers, body, status, retry_after: retry_after.clone(), effect, at });
    drop(log);
    state.signal.notify_waiters();
    let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    if let Some(value) = retry_after {
        response.headers_mut().insert("retry-after", value.parse().unwrap());
    }
    Ok(response)
}

/// What a broker's consumer read, `(key, body)` in order, as a sink's
/// record: each message acknowledged (the broker stored it), and the first
/// of each key an effect — a consumer that deduplicates on the key.
pub fn consumed(messages: Vec<(String, Bytes)>) -> Vec<Received> {
    let mut seen = std::collections::HashSet::new();
    messages
        .into_iter()
        .map(|(key, body)| Received {
            effect: seen.insert(key.clone()),
            payload: serde_json::from_slice(&body).unwrap_or_default(),
            key,
            headers: http::HeaderMap::new(),
            body,
            status: 200,
            retry_after: None,
            at: Instant::now(),
        })
        .collect()
}

//! A destination for outbox tests: a real HTTP server on port 0 that
//! records every request it receives, in arrival order.
//!
//! It is not idempotent and it obeys the payload it receives, so a test
//! scripts a message's fate when it enqueues it:
//! - `{"status": N}` → answers `N` (default `200`);
//! - `{"retry_after": "…"}` → adds that `Retry-After` header;
//! - `{"delay_ms": N}` → answers after `N` ms.
//!
//! [`Sink::fail_with`] overrides the status of every answer until cleared.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub key: String,
    pub payload: serde_json::Value,
    pub headers: http::HeaderMap,
}

#[derive(Default)]
struct State {
    received: Mutex<Vec<Received>>,
    fail_with: Mutex<Option<u16>>,
    signal: Notify,
}

pub struct Sink {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Sink {
    pub async fn start() -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |r| handle(r, state.clone()));
                    let _ =
                        auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}/deliver", self.addr)
    }

    /// Answers every request with `status` (or, with `None`, as the payload says).
    pub fn fail_with(&self, status: Option<u16>) {
        *self.state.fail_with.lock().unwrap() = status;
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }

    pub fn count_for(&self, key: &str) -> usize {
        self.state.received.lock().unwrap().iter().filter(|r| r.key == key).count()
    }

    /// Waits until `n` requests have arrived, at most `limit`; `false` on timeout.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                let notified = self.state.signal.notified();
                if self.count() >= n {
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
    let status = state.fail_with.lock().unwrap().unwrap_or(scripted);
    let retry_after = payload.get("retry_after").and_then(|v| v.as_str()).map(str::to_owned);
    state.received.lock().unwrap().push(Received { key, payload, headers });
    state.signal.notify_waiters();
    let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    if let Some(value) = retry_after {
        response.headers_mut().insert("retry-after", value.parse().unwrap());
    }
    Ok(response)
}

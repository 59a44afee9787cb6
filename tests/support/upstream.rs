//! A real upstream HTTP server on port 0 that counts the side effects it performs.
//!
//! It is deliberately not idempotent: every request it accepts is one
//! "effect", counted in total and per received `Idempotency-Key`. Paths
//! choose its behaviour:
//! - `/charge` → `201` with a body naming the effect number;
//! - `/status?code=N` → status `N`;
//! - `/reset` → closes the connection without answering;
//! - `/slow?ms=N` → acts at once, answers `201` (or `code`) after `N` ms;
//! - `/big?bytes=N` → `200` with an `N`-byte body;
//! - anything else → `200 ok` (counted too).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;

use super::http_server::{HttpServer, Options};

#[derive(Default)]
pub struct Effects {
    total: AtomicU64,
    finished: AtomicU64,
    /// The most requests it was handling at once.
    most_at_once: AtomicU64,
    by_key: Mutex<HashMap<String, u64>>,
    last_headers: Mutex<Option<HeaderMap>>,
    last_body: Mutex<Bytes>,
    finished_signal: Notify,
    started_signal: Notify,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub effects: Arc<Effects>,
    tls: bool,
    _server: HttpServer,
}

impl Upstream {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// An `https://` upstream with this certificate and key (PEM files).
    pub async fn start_tls(cert: &Path, key: &Path) -> Self {
        Self::start_with(Some(idemgate::http::tls::acceptor(cert, key).unwrap())).await
    }

    async fn start_with(tls: Option<TlsAcceptor>) -> Self {
        let effects = Arc::new(Effects::default());
        let shared = effects.clone();
        let tls_enabled = tls.is_some();
        let options = tls.map_or_else(Options::default, |acceptor| Options::default().tls(acceptor));
        let server = HttpServer::start_with(options, move |r| handle(r, shared.clone())).await;
        Self { addr: server.addr, effects, tls: tls_enabled, _server: server }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Effects performed so far.
    pub fn total(&self) -> u64 {
        self.effects.total.load(Ordering::SeqCst)
    }

    /// Effects performed under one received `Idempotency-Key`.
    pub fn count_for(&self, key: &str) -> u64 {
        self.effects.by_key.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// The keys the upstream received.
    pub fn keys(&self) -> Vec<String> {
        self.effects.by_key.lock().unwrap().keys().cloned().collect()
    }

    /// Headers of the last request received.
    pub fn last_headers(&self) -> HeaderMap {
        self.effects.last_headers.lock().unwrap().clone().unwrap_or_default()
    }

    /// The body of the last request received.
    pub fn last_body(&self) -> Bytes {
        self.effects.last_body.lock().unwrap().clone()
    }

    /// The most requests the upstream was handling at once.
    pub fn most_at_once(&self) -> u64 {
        self.effects.most_at_once.load(Ordering::SeqCst)
    }

    /// Waits until the upstream has received (and acted on) `n` requests.
    pub async fn wait_started(&self, n: u64) {
        loop {
            let notified = self.effects.started_signal.notified();
            if self.total() >= n {
                return;
            }
            notified.await;
        }
    }

    /// Waits until `n` requests have been fully handled by the upstream.
    pub async fn wait_finished(&self, n: u64) {
        loop {
            let notified = self.effects.finished_signal.notified();
            if self.effects.finished.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }
}

fn query_number(request: &Request<Incoming>, name: &str) -> u64 {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

async fn handle(request: Request<Incoming>, effects: Arc<Effects>) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let key = request.headers().get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(key) = &key {
        *effects.by_key.lock().unwrap().entry(key.clone()).or_default() += 1;
    }
    let n = effects.total.fetch_add(1, Ordering::SeqCst) + 1;
    effects.most_at_once.fetch_max(n - effects.finished.load(Ordering::SeqCst), Ordering::SeqCst);
    effects.started_signal.notify_waiters();
    *effects.last_headers.lock().unwrap() = Some(request.headers().clone());
    let path = request.uri().path().to_owned();
    let code = query_number(&request, "code");
    let ms = query_number(&request, "ms");
    let bytes = query_number(&request, "bytes");
    let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    *effects.last_body.lock().unwrap() = body.clone();
    let result = match path.as_str() {
        "/reset" => Err(std::io::Error::other("reset on purpose")),
        "/status" => Ok(reply(StatusCode::from_u16(code as u16).unwrap(), format!("{{\"effect\":{n}}}"))),
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let status = if code == 0 { StatusCode::CREATED } else { StatusCode::from_u16(code as u16).unwrap() };
            Ok(reply(status, format!("{{\"effect\":{n},\"slow\":true}}")))
        }
        "/big" => Ok(reply(StatusCode::OK, "x".repeat(bytes as usize))),
        "/charge" => Ok(reply(StatusCode::CREATED, format!("{{\"effect\":{n},\"echo\":{}}}", body.len()))),
        _ => Ok(reply(StatusCode::OK, "ok".into())),
    };
    effects.finished.fetch_add(1, Ordering::SeqCst);
    effects.finished_signal.notify_waiters();
    result
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("x-charge-id", format!("ch_{}", rand::random::<u32>()).parse().unwrap());
    headers.insert("set-cookie", "session=secret".parse().unwrap());
    response
}

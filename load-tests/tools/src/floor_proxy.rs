//! `floor-proxy`: the *floor* of PERFORMANCE.md, the pinned stack's own limit
//! for a reverse proxy. P1 (idemgate's passthrough) is reported against it:
//! what idemgate costs beyond this is idemgate's own code.
//!
//! A minimal HTTP/1.1 reverse proxy on hyper 1.x: each request's method,
//! path, headers and body go to `--upstream` on a keep-alive connection, and
//! the response streams back. No routing, store or logging. Upstream
//! connections are `hyper::client::conn::http1` senders in a pool of the
//! runtime's own (the fastest variant measured in issue 31): per core, each
//! thread has its own pool and its own connections; work-stealing, one pool
//! for the process.
//!
//! A sender goes back to its pool when the response body it carried has been
//! read to its end or dropped (`Pooled`), so the next request finds it idle
//! rather than queueing behind a body still in flight.
//!
//! `--correct yes` makes it the *correct floor*: the least a reverse proxy
//! must add to be correct and safe in front of an API, and the floor leaves
//! out. Each request head must arrive within 10 s (slowloris), the upstream
//! must answer within 30 s, hop-by-hop headers (`Connection` and the names
//! it lists, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
//! `Transfer-Encoding`, `Upgrade`) are removed both ways (RFC 9110 §7.6.1),
//! and the request's `Host` is the upstream's. It measures what part of
//! the floor-to-idemgate gap is the price of a correct proxy on this stack
//! (`load-tests/callgrind --floor --correct`).
//!
//! Flags: `--listen 127.0.0.1:PORT`, `--upstream 127.0.0.1:PORT`,
//! `--runtime per-core|work-stealing` (default per-core), `--threads N`
//! (default: the available cores), `--lifetime-ms N` (default 15 minutes),
//! `--correct yes|no` (default no).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::Args;
use crate::floor::{Settings, serve};

/// Idle connections kept per pool; more than wrk's 32 connections need.
const MAX_IDLE: usize = 256;

/// What the correct floor gives a client for a request head, and the upstream for its answer.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

pub fn main(args: &Args) -> Result<(), String> {
    let mut settings = Settings::from_args(args)?;
    let upstream = args.loopback("upstream")?;
    let correct = match args.str("correct", "no").as_str() {
        "yes" => Some(HeaderValue::from_str(&upstream.to_string()).map_err(|e| e.to_string())?),
        "no" => None,
        other => return Err(format!("--correct: {other:?} is neither yes nor no")),
    };
    if correct.is_some() {
        settings.header_read_timeout = Some(HEADER_READ_TIMEOUT);
    }
    serve(&settings, || {
        let pool = Arc::new(Pool { upstream, idle: Mutex::new(Vec::new()) });
        let correct = correct.clone();
        move |request| {
            let pool = pool.clone();
            let correct = correct.clone();
            async move {
                match correct {
                    None => forward(pool, request).await,
                    Some(host) => forward_correctly(pool, request, host).await,
                }
            }
        }
    })
}

/// The correct floor's forward: the same, with the head cleaned both ways,
/// the upstream's `Host`, and the upstream's answer bounded in time.
async fn forward_correctly(
    pool: Arc<Pool>,
    mut request: Request<Incoming>,
    host: HeaderValue,
) -> Result<Answer, Infallible> {
    strip_hop_by_hop(request.headers_mut());
    request.headers_mut().insert(header::HOST, host);
    match tokio::time::timeout(UPSTREAM_TIMEOUT, forward(pool, request)).await {
        Ok(Ok(mut response)) => {
            strip_hop_by_hop(response.headers_mut());
            Ok(response)
        }
        Ok(Err(never)) => match never {},
        Err(_) => Ok(bad_gateway()),
    }
}

/// Removes the hop-by-hop headers, the names `Connection` lists and the
/// fixed ones, in one pass over the names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut hop: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        for token in value.to_str().unwrap_or("").split(',').map(str::trim) {
            if !token.is_empty() && !token.eq_ignore_ascii_case("close") && !token.eq_ignore_ascii_case("keep-alive") {
                hop.extend(HeaderName::from_bytes(token.as_bytes()).ok());
            }
        }
    }
    hop.extend(headers.keys().filter(|name| is_hop_by_hop(name.as_str())).cloned());
    for name in hop {
        headers.remove(name);
    }
}

fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "te" | "trailer" | "transfer-encoding" | "upgrade"
    )
}

/// One runtime's keep-alive connections to the upstream. The mutex is never
/// contended per core (one thread); it keeps the one type Send for both models.
struct Pool {
    upstream: SocketAddr,
    idle: Mutex<Vec<SendRequest<Incoming>>>,
}

type Answer = Response<Either<Pooled, Full<Bytes>>>;

async fn forward(pool: Arc<Pool>, request: Request<Incoming>) -> Result<Answer, Infallible> {
    let Ok(mut sender) = pool.sender().await else { return Ok(bad_gateway()) };
    match sender.send_request(request).await {
        Ok(response) => Ok(response.map(|body| Either::Left(Pooled { body, giveback: Some((sender, pool)) }))),
        Err(_) => Ok(bad_gateway()),
    }
}

fn bad_gateway() -> Answer {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from_static(b"bad gateway"))));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

impl Pool {
    /// An idle connection ready for a request, or a new one.
    async fn sender(&self) -> Result<SendRequest<Incoming>, String> {
        loop {
            let Some(mut sender) = self.lock().pop() else { break };
            // A connection the upstream closed, or whose last body was
            // dropped half read, is not ready and is dropped here.
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        self.connect().await
    }

    async fn connect(&self) -> Result<SendRequest<Incoming>, String> {
        let stream = tokio::net::TcpStream::connect(self.upstream).await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(sender)
    }

    fn give_back(&self, sender: SendRequest<Incoming>) {
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE && !sender.is_closed() {
            idle.push(sender);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SendRequest<Incoming>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An upstream response body that returns its connection to the pool when it
/// has been read to the end, or dropped.
pub struct Pooled {
    body: Incoming,
    giveback: Option<(SendRequest<Incoming>, Arc<Pool>)>,
}

impl Pooled {
    fn release(&mut self) {
        if let Some((sender, pool)) = self.giveback.take() {
            pool.give_back(sender);
        }
    }
}

impl Body for Pooled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.body.is_end_stream() {
            self.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.release();
    }
}

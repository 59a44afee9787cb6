//! One pooled, keep-alive HTTP client per origin: the gateway forwards
//! to its upstreams with it, the outbox relay publishes to destinations.
//!
//! Each [`Upstream`] talks to one origin (scheme, host, port) over at most
//! `max_connections` HTTP/1.1 keep-alive connections open at once, idle or
//! busy, counted for all its [siblings](Upstream::sibling) together (the
//! per-core gateways of one process). A request reuses the most recently
//! idle connection of its own pool; finding none, it dials a new one while
//! the limit allows, and at the limit it takes a sibling's idle connection,
//! or else waits, within its upstream timeout, for a connection to come
//! back or close. A connection goes back to the pool that dialled it once
//! its response body has been read to the end. A pooled connection the
//! upstream closed while it sat idle is detected when the request could not
//! be written: hyper hands the request back unsent, and it goes out on
//! another connection. A request that may have reached the upstream is
//! never sent twice.

use std::collections::VecDeque;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::OwnedSemaphorePermit;
use tower::ServiceExt;

use super::body::BoxedBody;

mod limit;
use limit::{Acquired, Shared};

/// Why a forward failed. Each variant says whether the request can have
/// reached the upstream ([`UpstreamError::may_have_been_sent`]): the guard
/// releases a key only when it provably did not.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be opened (refused, DNS, TLS handshake): nothing was sent.
    #[error("cannot connect to the upstream {origin}: {}", crate::escape::ErrorChain(source.as_ref()))]
    Connect {
        /// `scheme://host:port`: which upstream (a DNS error does not say).
        origin: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Every connection slot stayed busy for the whole wait: nothing was sent.
    #[error("no upstream connection became free within {0:?}")]
    NoConnection(Duration),
    /// The connection failed before the request was written: nothing was sent.
    #[error("the upstream connection failed before the request was sent: {0}")]
    NotSent(#[source] hyper::Error),
    /// The connection failed after (part of) the request was written and
    /// before a whole response head came back: the upstream may have acted.
    #[error("the upstream connection was lost after the request was sent: {0}")]
    Lost(#[source] hyper::Error),
    /// The response head frames its body ambiguously (see [`framing`]):
    /// the request was sent, and what the answer says cannot be trusted.
    #[error("the upstream answered with a malformed response: {0}")]
    Malformed(&'static str),
    /// The response body broke off after its head.
    #[error("the upstream response body broke off: {0}")]
    Body(#[source] hyper::Error),
    /// No response within the time allowed; the request may have been sent.
    #[error("the upstream did not answer within {0:?}")]
    TimedOut(Duration),
    /// The rewritten request could not be built (a bad path, say): nothing was sent.
    #[error("cannot build upstream request: {0}")]
    Build(#[source] http::Error),
}

impl UpstreamError {
    /// `false` only when the request provably never reached the upstream.
    pub fn may_have_been_sent(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::NoConnection(_) | Self::NotSent(_) | Self::Build(_) => false,
            Self::Lost(_) | Self::Malformed(_) | Self::Body(_) | Self::TimedOut(_) => true,
        }
    }
}

/// Why a client cannot be made for an origin.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URI has no scheme or no host.
    #[error("{0}: an upstream needs a scheme and a host")]
    NoOrigin(String),
    /// The host cannot be a `Host` header, or the origin a URI.
    #[error("{0}")]
    InvalidOrigin(String),
    /// The extra CA file cannot be used (boxed: large, and rare).
    #[error(transparent)]
    Tls(Box<super::tls::TlsError>),
}

/// A pooled client for one upstream origin (HTTP/1.1 keep-alive, `http` or `https`).
#[derive(Clone)]
pub struct Upstream {
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Upstream({})", self.pool.origin)
    }
}

struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// `scheme://authority/`: what the connector dials.
    origin: Uri,
    /// The `Host` a request gets when it has none.
    host: HeaderValue,
    /// What this pool shares with its siblings: the limit, and each other.
    shared: Arc<Shared>,
    /// Idle connections, most recently used last.
    idle: Mutex<VecDeque<Idle>>,
    /// How long an idle connection is kept.
    idle_timeout: Duration,
}

/// An open connection and the slot it holds.
struct Connection {
    sender: SendRequest<BoxedBody>,
    slot: OwnedSemaphorePermit,
}

struct Idle {
    connection: Connection,
    since: Instant,
}

impl Upstream {
    /// A client for `origin` (its scheme and authority; any path is ignored)
    /// trusting the bundled roots plus `extra_ca`, with at most
    /// `max_connections` connections open, each kept idle at most `idle_timeout`.
    pub fn new(
        origin: &Uri,
        extra_ca: Option<&Path>,
        max_connections: usize,
        idle_timeout: Duration,
    ) -> Result<Self, ClientError> {
        let (Some(scheme), Some(authority)) = (origin.scheme(), origin.authority()) else {
            return Err(ClientError::NoOrigin(origin.to_string()));
        };
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        // Let the TLS layer see https:// URIs.
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(super::tls::client_config(extra_ca).map_err(|e| ClientError::Tls(Box::new(e)))?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let invalid = |e: &dyn std::fmt::Display| ClientError::InvalidOrigin(format!("{origin}: {e}"));
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| invalid(&e))?;
        let origin = origin_uri(scheme.clone(), authority.clone()).map_err(|e| invalid(&e))?;
        let shared = Shared::new(max_connections);
        let pool = Pool { connector, origin, host, shared, idle: Mutex::new(VecDeque::new()), idle_timeout };
        Ok(Self { pool: Shared::join(pool) })
    }

    /// A client with a pool of its own (its connections are driven by the
    /// runtime that dials them) that shares this one's connector, TLS
    /// settings and connection limit: one `max_connections` for both, and
    /// at the limit each may use the other's idle connections. The
    /// per-core gateways of one process each take one (a clone, by
    /// contrast, shares the pool itself).
    pub fn sibling(&self) -> Upstream {
        let Pool { connector, origin, host, shared, idle_timeout, .. } = &*self.pool;
        let pool = Pool {
            connector: connector.clone(),
            origin: origin.clone(),
            host: host.clone(),
            shared: shared.clone(),
            idle: Mutex::new(VecDeque::new()),
            idle_timeout: *idle_timeout,
        };
        Self { pool: Shared::join(pool) }
    }

    /// The `Host` a request to this upstream gets unless it brings its own.
    pub fn host(&self) -> &HeaderValue {
        &self.pool.host
    }

    /// Sends a request to this upstream and waits for the response head.
    /// `wait` bounds getting a connection (a free slot, then dialling);
    /// the wait for the response head is the caller's to bound, since only
    /// the caller knows what a late answer means. The request's URI may be
    /// absolute (its path and query are sent) or origin-form; a request
    /// without `Host` gets the upstream's authority.
    pub async fn send(
        &self,
        mut request: Request<BoxedBody>,
        wait: Duration,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        if request.uri().authority().is_some() {
            let path = request.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
            *request.uri_mut() = Uri::from(path);
        }
        if !request.headers().contains_key(header::HOST) {
            request.headers_mut().insert(header::HOST, self.pool.host.clone());
        }
        self.pool.clone().send(request, wait).await
    }

    /// Opens one connection (DNS, TCP, TLS, HTTP/1 handshake) within `wait`
    /// and keeps it idle in the pool; sends nothing. At start it tells early
    /// whether the upstream can be reached at all, and saves the first
    /// request the dial.
    pub async fn probe(&self, wait: Duration) -> Result<(), UpstreamError> {
        // At the limit there are open connections already: nothing to learn.
        let Some(slot) = self.pool.shared.free_slot() else { return Ok(()) };
        match tokio::time::timeout(wait, self.pool.connect()).await {
            Ok(connected) => {
                self.pool.put(Connection { sender: connected?, slot });
                Ok(())
            }
            Err(_) => Err(UpstreamError::Connect {
                origin: self.pool.origin.to_string(),
                source: format!("no connection within {wait:?}").into(),
            }),
        }
    }
}

impl Pool {
    async fn send(
        self: Arc<Self>,
        mut request: Request<BoxedBody>,
        wait: Duration,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let waited_until = tokio::time::Instant::now() + wait;
        loop {
            let Acquired { home, connection: Connection { mut sender, slot }, pooled } =
                self.acquire(waited_until, wait).await?;
            match sender.try_send_request(request).await {
                Ok(response) => {
                    // The connection goes with the response: after a
                    // malformed head, what follows on it is anyone's guess.
                    framing(&response).map_err(UpstreamError::Malformed)?;
                    let lease = Lease { home, connection: Connection { sender, slot } };
                    // The head's values still share the connection's read
                    // buffer: a caller that holds the head (the guard, across
                    // its store call) detaches them (`head::detach_headers`);
                    // a passthrough hands it on to its client at once.
                    let (head, body) = response.into_parts();
                    let body = if body.is_end_stream() {
                        lease.release();
                        UpstreamBody { inner: body, lease: None }
                    } else {
                        UpstreamBody { inner: body, lease: Some(lease) }
                    };
                    return Ok(Response::from_parts(head, body));
                }
                // hyper hands the request back only when none of it was
                // written: nothing reached the upstream. A pooled connection
                // closed while idle is retried on another; a fresh one that
                // failed so early is reported as not sent.
                Err(mut error) => match error.take_message() {
                    Some(unsent) if pooled => request = unsent,
                    Some(_) => return Err(UpstreamError::NotSent(error.into_error())),
                    None => return Err(UpstreamError::Lost(error.into_error())),
                },
            }
        }
    }

    /// Dials a connection for `slot` within the wait. Boxed: connecting is
    /// rare, and its future (DNS, TCP, TLS) would otherwise size every
    /// request's future, and with it every connection's in-flight slot in hyper.
    async fn dial(
        &self,
        slot: OwnedSemaphorePermit,
        waited_until: tokio::time::Instant,
        wait: Duration,
    ) -> Result<Connection, UpstreamError> {
        match tokio::time::timeout_at(waited_until, Box::pin(self.connect())).await {
            Ok(connected) => Ok(Connection { sender: connected?, slot }),
            Err(_) => Err(UpstreamError::NoConnection(wait)),
        }
    }

    /// The most recently idle connection that is still open, dropping stale
    /// ones (which frees their slots).
    fn checkout(&self) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some(entry) = idle.pop_back() {
            if entry.connection.sender.is_ready() && entry.since.elapsed() < self.idle_timeout {
                return Some(entry.connection);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<BoxedBody>, UpstreamError> {
        let connect = |source| UpstreamError::Connect { origin: self.origin.to_string(), source };
        let io = self.connector.clone().oneshot(self.origin.clone()).await.map_err(connect)?;
        let (sender, connection) = http1::handshake(io).await.map_err(|e| connect(Box::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Keeps a connection idle here, or hands it to the oldest request
    /// waiting at the limit.
    fn put(self: &Arc<Self>, connection: Connection) {
        self.keep(connection);
        self.shared.hand_over(self);
    }

    fn keep(&self, connection: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The oldest connections sit at the front; let the stale ones go.
        while idle.front().is_some_and(|entry| entry.since.elapsed() >= self.idle_timeout) {
            idle.pop_front();
        }
        idle.push_back(Idle { connection, since: Instant::now() });
    }
}

/// Refuses a response whose framing upstreams and clients may read
/// differently (request smuggling's other half, RFC 9112 §6.3): both
/// `Content-Length` and `Transfer-Encoding`, a transfer coding other than
/// `chunked` (hyper would hand over a body still gzipped, or read to the
/// close), or a `1xx` as the final answer — `101` included, since no
/// request sent through this client asks for an upgrade.
fn framing<B>(response: &Response<B>) -> Result<(), &'static str> {
    if response.status().is_informational() {
        return Err("an informational (1xx) status as the final answer");
    }
    let headers = response.headers();
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter().peekable();
    if codings.peek().is_none() {
        return Ok(());
    }
    if headers.contains_key(header::CONTENT_LENGTH) {
        return Err("both Content-Length and Transfer-Encoding");
    }
    let mut codings = codings.flat_map(|value| value.as_bytes().split(|&b| b == b','));
    match (codings.next(), codings.next()) {
        (Some(only), None) if only.trim_ascii().eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => Err("a transfer coding other than chunked"),
    }
}

/// A connection busy with one response, and the pool it goes back to.
struct Lease {
    home: Arc<Pool>,
    connection: Connection,
}

impl Lease {
    /// Returns the connection to its pool once its response has been read
    /// to the end (at once when it already has); a connection that closes
    /// instead is dropped, and its slot with it.
    fn release(self) {
        let Self { home, mut connection } = self;
        if connection.sender.is_ready() {
            home.put(connection);
            return;
        }
        tokio::spawn(async move {
            if connection.sender.ready().await.is_ok() {
                home.put(connection);
            }
        });
    }
}

/// A response body from a pooled connection. Its connection goes back to
/// the pool when the body has been read to the end or is dropped.
pub struct UpstreamBody {
    inner: Incoming,
    lease: Option<Lease>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").field("pooled", &self.lease.is_some()).finish_non_exhaustive()
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if (matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream())
            && let Some(lease) = self.lease.take()
        {
            lease.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }
}

fn origin_uri(scheme: Scheme, authority: Authority) -> Result<Uri, http::Error> {
    Uri::builder().scheme(scheme).authority(authority).path_and_query("/").build()
}

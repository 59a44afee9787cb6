//! Forwarding to upstreams over one pooled, keep-alive HTTP client.
//!
//! The request is rewritten here and only here: the URI points at the
//! route's upstream, hop-by-hop headers are dropped, `Host` becomes the
//! upstream's authority (unless the route keeps it), `X-Forwarded-For` and
//! `X-Forwarded-Proto` are set, and the `Idempotency-Key` is replaced by the
//! derived key when configured.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;

use super::body::ResponseBody;
use super::headers::strip_hop_by_hop;
use super::routes::Route;
use crate::idempotency::key::IDEMPOTENCY_KEY;

/// Why a forward failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Connect failure, reset, or a malformed response.
    #[error("upstream request failed: {0}")]
    Failed(#[source] hyper_util::client::legacy::Error),
    /// The response body broke off.
    #[error("upstream response body failed: {0}")]
    Body(#[source] hyper::Error),
    /// No response (head and stored body) within the timeout.
    #[error("upstream did not answer within {0:?}")]
    TimedOut(Duration),
    /// The rewritten request could not be built (a bad path, say).
    #[error("cannot build upstream request: {0}")]
    Build(#[source] http::Error),
}

/// A route's pooled upstream client (HTTP/1.1 keep-alive, `http` or `https`).
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, ResponseBody>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upstream(..)")
    }
}

impl Upstream {
    /// A client trusting the bundled roots plus `extra_ca`.
    pub fn new(extra_ca: Option<&Path>) -> Result<Self, String> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        // Let the TLS layer see https:// URIs.
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(super::tls::client_config(extra_ca)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(connector);
        Ok(Self { client })
    }

    /// Sends a rewritten request and waits for the response head.
    pub async fn send(
        &self,
        request: Request<ResponseBody>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Ok(result) => result.map_err(UpstreamError::Failed),
            Err(_) => Err(UpstreamError::TimedOut(timeout)),
        }
    }
}

/// Who sent a request, as the listener saw it.
#[derive(Debug, Clone, Copy)]
pub struct ClientInfo {
    /// The peer address.
    pub addr: SocketAddr,
    /// `true` when the client connected over TLS.
    pub tls: bool,
}

// Parsed once: a `&str` header name is parsed and hashed again on every use.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Turns a client request into the upstream request.
pub fn rewrite(
    route: &Route,
    mut parts: http::request::Parts,
    body: ResponseBody,
    client: &ClientInfo,
    forwarded_key: Option<HeaderValue>,
) -> Result<Request<ResponseBody>, UpstreamError> {
    parts.uri = route.upstream_uri(&parts.uri).map_err(UpstreamError::Build)?;
    parts.version = http::Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    if !route.keep_host {
        // The client fills in Host from the URI's authority.
        headers.remove(header::HOST);
    }
    let ip = client.addr.ip().to_string();
    let forwarded_for = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(previous) => format!("{previous}, {ip}"),
        None => ip,
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded_for) {
        headers.insert(&X_FORWARDED_FOR, value);
    }
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(if client.tls { "https" } else { "http" }));
    if let Some(key) = forwarded_key {
        headers.insert(&IDEMPOTENCY_KEY, key);
    }
    Ok(Request::from_parts(parts, body))
}

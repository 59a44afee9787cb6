//! The request the upstream gets, rewritten here and only here: the URI
//! points at the route's upstream, hop-by-hop headers are dropped, `Host`
//! becomes the upstream's authority (unless the route keeps it),
//! `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Forwarded-Host` are set,
//! and the `Idempotency-Key` is replaced by the derived key when configured.

use http::Request;
use http::header::{self, HeaderName, HeaderValue};

use super::routes::Route;
use crate::http::body::BoxedBody;
use crate::http::client::UpstreamError;
use crate::http::connection::ClientInfo;
use crate::http::headers::strip_hop_by_hop;
use crate::idempotency::key::IDEMPOTENCY_KEY;

// Parsed once: a `&str` header name is parsed and hashed again on every use.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Turns a client request into the upstream request.
pub fn rewrite(
    route: &Route,
    mut parts: http::request::Parts,
    body: BoxedBody,
    client: &ClientInfo,
    forwarded_key: Option<HeaderValue>,
) -> Result<Request<BoxedBody>, UpstreamError> {
    // The host the client asked for: `Host` in HTTP/1.1, `:authority` in h2.
    let client_host = parts
        .headers
        .get(header::HOST)
        .cloned()
        .or_else(|| parts.uri.authority().and_then(|authority| HeaderValue::from_str(authority.as_str()).ok()));
    parts.uri = route.upstream_uri(&parts.uri).map_err(UpstreamError::Build)?;
    parts.version = http::Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    // It travels as X-Forwarded-Host, like the scheme in X-Forwarded-Proto:
    // set from what this gateway saw, never from the client's own header.
    match &client_host {
        Some(host) => headers.insert(&X_FORWARDED_HOST, host.clone()),
        None => headers.remove(&X_FORWARDED_HOST),
    };
    match client_host {
        // An h2 client's :authority becomes the Host an HTTP/1.1 upstream needs.
        Some(host) if route.keep_host => headers.insert(header::HOST, host),
        // The upstream's authority, set here in the client's Host's place
        // (one update of the map, where removing it and letting the
        // upstream client add its own took two).
        _ => headers.insert(header::HOST, route.upstream.host().clone()),
    };
    let forwarded_for = match headers.get(&X_FORWARDED_FOR).map(HeaderValue::as_bytes) {
        Some(previous) => {
            let mut chain = Vec::with_capacity(previous.len() + 2 + client.ip().len());
            chain.extend_from_slice(previous);
            chain.extend_from_slice(b", ");
            chain.extend_from_slice(client.ip().as_bytes());
            HeaderValue::from_bytes(&chain).ok()
        }
        None => Some(client.ip().clone()),
    };
    if let Some(value) = forwarded_for {
        headers.insert(&X_FORWARDED_FOR, value);
    }
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(if client.tls { "https" } else { "http" }));
    if let Some(key) = forwarded_key {
        headers.insert(&IDEMPOTENCY_KEY, key);
    }
    Ok(Request::from_parts(parts, body))
}

//! Header hygiene: what crosses the proxy and what is kept for replay.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it
//! names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
//! `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate`,
//! `Proxy-Authorization`) describe one connection, so they are never
//! forwarded and never stored.

use http::HeaderMap;
use http::header::{self, HeaderName};

use bytes::Bytes;

/// The header that marks a replayed response.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Runs twice per proxied request, so it removes only what is there: one
    // pass over a message's few names is far cheaper than a hashed remove
    // for each of the nine hop-by-hop names, and most messages carry none
    // of them (or only `Connection: keep-alive`).
    let mut doomed: Vec<HeaderName> = headers.keys().filter(|name| HOP_BY_HOP.contains(name)).cloned().collect();
    if doomed.is_empty() {
        return;
    }
    let named = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok());
    doomed.extend(named);
    for name in &doomed {
        headers.remove(name);
    }
}

/// Prepares an upstream response head for the client: hop-by-hop headers
/// go, and the version is reset so the listener answers in the client's
/// protocol (an HTTP/1.0 upstream must not turn the client's reply into 1.0).
pub fn clean_response_head(head: &mut http::response::Parts) {
    strip_hop_by_hop(&mut head.headers);
    head.version = http::Version::default();
}

/// The headers of an upstream response as they will be stored: hop-by-hop
/// headers were already removed; deny-listed ones are dropped here.
pub fn headers_to_store(headers: &HeaderMap, deny: &[HeaderName]) -> Vec<(String, Bytes)> {
    headers
        .iter()
        .filter(|(name, _)| !deny.contains(name))
        .map(|(name, value)| (name.as_str().to_owned(), Bytes::copy_from_slice(value.as_bytes())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn proxy_credentials_are_removed_and_end_to_end_headers_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(header::PROXY_AUTHORIZATION, HeaderValue::from_static("Basic eA=="));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        strip_hop_by_hop(&mut headers);
        assert!(headers.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn deny_listed_headers_are_not_stored() {
        let mut headers = HeaderMap::new();
        headers.insert(header::DATE, HeaderValue::from_static("Sun, 29 Nov 2026 08:00:00 GMT"));
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("s=1"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let stored = headers_to_store(&headers, &[header::DATE, header::SET_COOKIE]);
        assert_eq!(stored, vec![("content-type".to_string(), Bytes::from_static(b"application/json"))]);
    }
}

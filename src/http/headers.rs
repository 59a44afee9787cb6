//! Headers that describe one connection, not a message.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it
//! names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
//! `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate`,
//! `Proxy-Authorization`) are never forwarded and never stored.

use http::HeaderMap;
use http::header::{self, HeaderName};

/// The hop-by-hop header names (without those a `Connection` header names).
pub static HOP_BY_HOP: [HeaderName; 9] = [
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
}

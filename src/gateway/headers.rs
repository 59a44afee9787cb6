//! What of an upstream response is kept for replay, and the header that
//! marks a replay. Hop-by-hop headers ([`crate::http::headers`]) are never
//! forwarded and never stored.

use http::HeaderMap;
use http::header::HeaderName;

use crate::http::headers::strip_hop_by_hop;

use bytes::Bytes;

/// The header that marks a replayed response.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

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
    use http::header;

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

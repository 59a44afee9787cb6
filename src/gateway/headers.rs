//! What of an upstream response is kept for replay, and the header that
//! marks a replay. Hop-by-hop headers ([`crate::http::headers`]) are never
//! forwarded and never stored.

use http::HeaderMap;
use http::header::HeaderName;

use crate::http::head::detach_headers;
use crate::http::headers::strip_hop_by_hop;

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
/// headers were already removed; deny-listed ones are dropped here. The
/// values kept get one allocation of their own ([`detach_headers`]): they
/// shared one with the whole upstream head, deny-listed values too, and a
/// stored response outlives that head by the key's TTL.
pub fn headers_to_store(headers: &HeaderMap, deny: &[HeaderName]) -> HeaderMap {
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter().filter(|(name, _)| !deny.contains(name)) {
        kept.append(name.clone(), value.clone());
    }
    detach_headers(&mut kept);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderValue, header};

    #[test]
    fn deny_listed_headers_are_not_stored() {
        let mut headers = HeaderMap::new();
        headers.insert(header::DATE, HeaderValue::from_static("Sun, 29 Nov 2026 08:00:00 GMT"));
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("s=1"));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let stored = headers_to_store(&headers, &[header::DATE, header::SET_COOKIE]);
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn stored_values_do_not_keep_the_upstream_head_alive() {
        // As the upstream client leaves them: every value a slice of one buffer.
        let head = Bytes::from(b"application/jsonsecret-cookie".to_vec());
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_maybe_shared(head.slice(..16)).unwrap());
        headers.insert(header::SET_COOKIE, HeaderValue::from_maybe_shared(head.slice(16..)).unwrap());
        let stored = headers_to_store(&headers, &[header::SET_COOKIE]);
        let value = stored[header::CONTENT_TYPE].as_bytes();
        assert_eq!(value, b"application/json");
        assert!(!head.as_ptr_range().contains(&value.as_ptr()), "the stored value points into the upstream's head");
    }
}

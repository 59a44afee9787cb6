//! What of an upstream response is kept for replay, and the header that
//! marks a replay. Hop-by-hop headers ([`crate::http::headers`]) are never
//! forwarded and never stored.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

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
pub fn headers_to_store(headers: &HeaderMap, deny: &[HeaderName]) -> HeaderMap {
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter().filter(|(name, _)| !deny.contains(name)) {
        // A copy of its own: the value shares one allocation with the whole
        // upstream head (src/http/head.rs), deny-listed values too, and a
        // stored response outlives that head by the key's TTL. (The copy is
        // checked again; a value hyper took that the check would refuse is
        // kept shared rather than lost.)
        let copy =
            HeaderValue::from_maybe_shared(Bytes::copy_from_slice(value.as_bytes())).unwrap_or_else(|_| value.clone());
        kept.append(name.clone(), copy);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

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
}

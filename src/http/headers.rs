//! Headers that describe one connection, not a message.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it
//! names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
//! `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate`,
//! `Proxy-Authorization`) are never forwarded and never stored.

use http::HeaderMap;
use http::header::{self, HeaderName};

/// Whether `name` is a hop-by-hop header (the module's list; not those a
/// `Connection` header names). A match on the name's text: for the few
/// names of a message this is a length test and at most one comparison
/// each, where a list of names compares every name nine times.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
    )
}

/// `close`, the one option a `Connection` header commonly lists besides
/// `keep-alive`, parsed once: it names no header of its own, but a message
/// may carry a field of that name, and it goes too.
static CLOSE: HeaderName = HeaderName::from_static("close");

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Runs twice per proxied request (the request, the upstream's answer),
    // so it removes only what is there: one pass over a message's few
    // names finds them, and most messages carry none of them, or only
    // `Connection: keep-alive` (every nginx answer does).
    let mut doomed: Vec<HeaderName> = headers.keys().filter(|name| is_hop_by_hop(name)).cloned().collect();
    if doomed.is_empty() {
        return;
    }
    let options = headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','));
    for option in options.map(str::trim) {
        // `keep-alive` is hop-by-hop itself: found above if the message has it.
        // Parsing it, or `close`, as a header name on every message would
        // cost more than the rest of this function.
        if option.eq_ignore_ascii_case("keep-alive") {
            continue;
        }
        let named = match option.eq_ignore_ascii_case("close") {
            true => Some(CLOSE.clone()),
            false => HeaderName::from_bytes(option.as_bytes()).ok(),
        };
        doomed.extend(named);
    }
    for name in &doomed {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// RFC 9110 §7.6.1's hop-by-hop names, as `http` spells them.
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
    fn every_hop_by_hop_name_is_recognised_and_connection_options_in_any_case_name_headers() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop(name), "{name}");
        }
        assert!(!is_hop_by_hop(&header::CONTENT_TYPE));
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive , CLOSE,,X-Private"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("close", HeaderValue::from_static("1"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert(header::DATE, HeaderValue::from_static("Sun, 29 Nov 2026 08:00:00 GMT"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.keys().collect::<Vec<_>>(), [header::DATE]);
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

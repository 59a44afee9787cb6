//! Message heads that do not pin hyper's read buffers.
//!
//! hyper parses an HTTP/1.1 head in place: a request's target and every
//! header value are slices of the connection's 8 KiB read buffer, and so
//! are an upstream response's header values. While the gateway holds such
//! a head (a proxied request holds its own until the upstream answers, and
//! the upstream's until the client has the response), that buffer cannot
//! be reused, and hyper's next read on the connection — the end-of-stream
//! check it makes while a request is in flight, the read-ahead after a
//! response — allocates another 8 KiB. [`detach_request`] and
//! [`detach_headers`] copy the bytes (a few hundred, in one allocation), so
//! each buffer is its connection's alone again by hyper's next read.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Uri};

/// Moves `request`'s target and header values into one allocation of their
/// own. Call it before reading the body: hyper reads next after the body.
pub fn detach_request<B>(request: &mut Request<B>) {
    let target = target_of(request.uri());
    let mut owned = copy(target, request.headers());
    if let Some(target) = target {
        let copy = owned.split_to(target.len());
        // The bytes are the ones hyper accepted: the parse cannot fail, and
        // if it somehow did the request keeps its (pinning) original.
        if let Ok(uri) = Uri::from_maybe_shared(copy) {
            *request.uri_mut() = uri;
        }
    }
    replace_values(request.headers_mut(), owned);
}

/// Moves the header values of `headers` into one allocation of their own.
/// Names need no copy: hyper's are static or already owned.
pub fn detach_headers(headers: &mut HeaderMap) {
    let owned = copy(None, headers);
    replace_values(headers, owned);
}

/// `target` then every value, in `headers`' iteration order.
fn copy(target: Option<&str>, headers: &HeaderMap) -> Bytes {
    let values: usize = headers.values().map(HeaderValue::len).sum();
    let mut buffer = BytesMut::with_capacity(target.map_or(0, str::len) + values);
    if let Some(target) = target {
        buffer.extend_from_slice(target.as_bytes());
    }
    for value in headers.values() {
        buffer.extend_from_slice(value.as_bytes());
    }
    buffer.freeze()
}

fn replace_values(headers: &mut HeaderMap, mut owned: Bytes) {
    for value in headers.values_mut() {
        let copy = owned.split_to(value.len());
        if let Ok(mut fresh) = HeaderValue::from_maybe_shared(copy) {
            fresh.set_sensitive(value.is_sensitive());
            *value = fresh;
        }
    }
}

/// The request target as sent in origin form, when the URI is one (an
/// absolute-form or authority-form target is rare and kept as it is).
fn target_of(uri: &Uri) -> Option<&str> {
    match (uri.scheme(), uri.authority(), uri.path_and_query()) {
        (None, None, Some(target)) => Some(target.as_str()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(a: &[u8], buffer: &[u8]) -> bool {
        let range = buffer.as_ptr_range();
        range.contains(&a.as_ptr())
    }

    #[test]
    fn the_target_and_the_values_no_longer_point_into_the_read_buffer() {
        // A head built the way hyper builds one: slices of one buffer.
        let read = Bytes::from_static(b"/v1/charges?x=1 application/json key-1 secret");
        let mut request = Request::builder().uri(Uri::from_maybe_shared(read.slice(0..15)).unwrap()).body(()).unwrap();
        let headers = request.headers_mut();
        headers.insert("content-type", HeaderValue::from_maybe_shared(read.slice(16..32)).unwrap());
        headers.append("idempotency-key", HeaderValue::from_maybe_shared(read.slice(33..38)).unwrap());
        let mut secret = HeaderValue::from_maybe_shared(read.slice(39..45)).unwrap();
        secret.set_sensitive(true);
        headers.insert("authorization", secret);
        assert!(shares(request.uri().path_and_query().unwrap().as_str().as_bytes(), &read));

        detach_request(&mut request);

        assert_eq!(request.uri(), "/v1/charges?x=1");
        assert!(!shares(request.uri().path_and_query().unwrap().as_str().as_bytes(), &read));
        for (name, value) in
            [("content-type", "application/json"), ("idempotency-key", "key-1"), ("authorization", "secret")]
        {
            let got = &request.headers()[name];
            assert_eq!(got, value);
            assert!(!shares(got.as_bytes(), &read), "{name} still points into the read buffer");
        }
        assert!(request.headers()["authorization"].is_sensitive());
        assert!(!request.headers()["content-type"].is_sensitive());
    }

    #[test]
    fn repeated_headers_keep_their_values_and_order() {
        let mut request =
            Request::builder().uri("/").header("x-a", "1").header("x-b", "2").header("x-a", "3").body(()).unwrap();
        detach_request(&mut request);
        let a: Vec<_> = request.headers().get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "3"]);
        assert_eq!(request.headers()["x-b"], "2");
    }

    #[test]
    fn an_absolute_form_target_is_kept() {
        let mut request = Request::builder().uri("http://example.com/a?b").header("x", "y").body(()).unwrap();
        detach_request(&mut request);
        assert_eq!(request.uri(), "http://example.com/a?b");
        assert_eq!(request.headers()["x"], "y");
    }
}

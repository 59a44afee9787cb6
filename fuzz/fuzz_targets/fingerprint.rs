//! Any path, query, content type and body: fingerprinting never panics, is
//! deterministic, and a JSON body and its canonical form fingerprint alike.
#![no_main]

use http::{HeaderMap, HeaderValue, Method, Uri};
use idemgate::idempotency::FingerprintPolicy;
use idemgate::idempotency::canonical_json::canonicalize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (head, body) = data.split_at(data.len().min(64));
    let Ok(uri) = format!("/p?{}", String::from_utf8_lossy(head)).parse::<Uri>() else { return };
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let policy = FingerprintPolicy::default();
    let first = policy.fingerprint(&Method::POST, &uri, &headers, body);
    assert_eq!(first, policy.fingerprint(&Method::POST, &uri, &headers, body));
    if let Some(canonical) = canonicalize(body) {
        assert_eq!(first, policy.fingerprint(&Method::POST, &uri, &headers, &canonical));
    }
});

//! Any signature header and body, for every scheme: parsing never panics,
//! its work stays bounded, and nothing made up verifies.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use idemgate::webhook::{Scheme, Verifier};
use libfuzzer_sys::fuzz_target;

/// Every header any scheme reads, set to the fuzzed value.
const HEADERS: [&str; 6] = [
    "stripe-signature",
    "webhook-signature",
    "webhook-timestamp",
    "webhook-id",
    "x-hub-signature-256",
    "x-shopify-hmac-sha256",
];

fuzz_target!(|data: &[u8]| {
    // The first line is the header value, the rest the body.
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let (value, body) = (&data[..split], data.get(split + 1..).unwrap_or(&[]));
    let Ok(value) = HeaderValue::from_bytes(value) else { return };
    let mut headers = HeaderMap::new();
    for name in HEADERS {
        headers.insert(name, value.clone());
    }
    for scheme in Scheme::ALL {
        let secret = if scheme == Scheme::StandardWebhooks { "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" } else { "s" };
        let verifier = Verifier::new(scheme, &[secret], Duration::from_secs(300)).unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert!(verifier.verify(&headers, body, now).is_err(), "{scheme:?} verified a made-up signature");
    }
});

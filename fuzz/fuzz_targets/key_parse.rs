//! Any header value: parsing never panics, and an accepted key is 1..=255
//! printable ASCII characters.
#![no_main]

use idemgate::idempotency::IdempotencyKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = IdempotencyKey::parse(data) {
        let key = key.as_str();
        assert!((1..=255).contains(&key.len()));
        assert!(key.bytes().all(|b| (0x20..=0x7e).contains(&b)));
    }
});

//! Any body: canonicalisation never panics and is idempotent.
#![no_main]

use idemgate::idempotency::canonical_json::canonicalize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(once) = canonicalize(data) {
        assert_eq!(canonicalize(&once).as_deref(), Some(&once[..]));
    }
});

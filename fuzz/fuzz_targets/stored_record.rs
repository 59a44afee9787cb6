//! Any bytes read back from a store: decoding and unsealing never panic.
#![no_main]

use idemgate::store::codec;
use idemgate::store::sealing::Sealer;
use libfuzzer_sys::fuzz_target;

const KEYS: &str = "k:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fuzz_target!(|data: &[u8]| {
    let _ = codec::decode(data.to_vec());
    if let Ok(sealer) = Sealer::from_spec(KEYS) {
        let _ = sealer.open(b"record", data);
        if let Ok(sealed) = sealer.seal(b"record", data) {
            assert_eq!(sealer.open(b"record", &sealed).ok().as_deref(), Some(data));
        }
    }
});

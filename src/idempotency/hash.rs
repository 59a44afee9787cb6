//! The one encoding used for every hash of several fields.
//!
//! Each field is written as its length (8 bytes, big endian) followed by its
//! bytes, so no two different field lists can produce the same input:
//! `("ab", "c")` and `("a", "bc")` hash differently. The key scope, the
//! fingerprint and the outbox's derived key all go through [`hash_fields`].

use sha2::{Digest, Sha256};

/// A SHA-256 hasher that takes length-prefixed fields.
#[derive(Clone, Default)]
pub struct FieldHasher(Sha256);

impl FieldHasher {
    /// Starts an empty hash.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one length-prefixed field.
    pub fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    /// Returns the 32-byte digest.
    pub fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// Hashes a fixed list of fields.
pub fn hash_fields(fields: &[&[u8]]) -> [u8; 32] {
    let mut hasher = FieldHasher::new();
    for field in fields {
        hasher.field(field);
    }
    hasher.finish()
}

/// Lower-case hex of a digest.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(bytes, &mut out);
    out
}

/// Appends the lower-case hex of `bytes` to `out` (a store key built in
/// one string, without a hex string of its own first).
pub fn push_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Through a buffer, 32 bytes at a time: pushed one `char` each, the 64
    // digits of a digest cost a Redis operation 770 instructions.
    let mut digits = [0u8; 64];
    for chunk in bytes.chunks(32) {
        for (pair, byte) in digits.chunks_exact_mut(2).zip(chunk) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        // Hex digits are ASCII: this never falls back.
        out.push_str(std::str::from_utf8(&digits[..2 * chunk.len()]).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_boundaries_change_the_hash() {
        assert_ne!(hash_fields(&[b"ab", b"c"]), hash_fields(&[b"a", b"bc"]));
        assert_ne!(hash_fields(&[b"", b"a"]), hash_fields(&[b"a", b""]));
        assert_ne!(hash_fields(&[b"a"]), hash_fields(&[b"a", b""]));
    }

    #[test]
    fn hex_is_lower_case_and_complete() {
        assert_eq!(to_hex(&[0x00, 0xab, 0xff]), "00abff");
        // sha256("") is a well-known constant; one unprefixed field is not it.
        assert_eq!(to_hex(&hash_fields(&[])).len(), 64);
    }

    #[test]
    fn hex_of_any_length_matches_the_formatted_bytes() {
        for len in [0, 1, 31, 32, 33, 64, 65, 100] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let formatted: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(to_hex(&bytes), formatted, "{len} bytes");
            let mut appended = String::from("p:");
            push_hex(&bytes, &mut appended);
            assert_eq!(appended, format!("p:{formatted}"));
        }
    }
}

//! Encryption at rest for stored responses (AES-256-GCM, `ring`).
//!
//! Stored responses can hold customer data, and a shared Redis or Postgres
//! is often readable by more people than the gateway's own memory. With
//! keys configured, networked stores keep every response sealed:
//!
//! `0xE1 | key id length:u8 | key id | nonce:12 | ciphertext and tag`
//!
//! The record's scoped key is the additional authenticated data, so a
//! sealed response copied onto another key's record fails to open instead
//! of being replayed to the wrong client.
//!
//! **Keys and rotation.** Keys are `id:hex` pairs (32-byte keys, 64 hex
//! characters), comma-separated, from `IDEMGATE__STORE_ENCRYPTION__KEYS` or
//! a file. The first key seals; every listed key opens. To rotate, put the
//! new key first and keep the old one listed until `key_ttl` has passed
//! (every record sealed with it has then expired), then remove it.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use super::{StoreError, codec};
use crate::config::StoreEncryptionConfig;
use crate::idempotency::{ScopedKey, StoredResponse};

/// First byte of a sealed value (an unsealed encoding starts with its version, 1).
pub const SEALED: u8 = 0xE1;

/// The configured keys: the first seals, all open.
pub struct Sealer {
    keys: Vec<(String, LessSafeKey)>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("key_ids", &self.keys.iter().map(|(id, _)| id).collect::<Vec<_>>()).finish()
    }
}

/// Why `store_encryption` cannot seal.
#[derive(Debug, thiserror::Error)]
pub enum SealingError {
    /// `store_encryption.key_file` cannot be read.
    #[error("cannot read store_encryption.key_file {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key list is malformed; says which key and how.
    #[error("store_encryption: {0}")]
    Keys(#[source] KeySpecError),
}

/// What is wrong with a key list `id:hex,id:hex,…`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    /// An entry without `:`.
    #[error("each encryption key is written id:hex")]
    Entry,
    /// An id too long, empty or with other characters.
    #[error("encryption key id {0:?}: 1 to 32 characters of [A-Za-z0-9_-]")]
    Id(String),
    /// The key is not 32 bytes in hex.
    #[error("encryption key {0:?}: expected 64 hex characters")]
    Hex(String),
    /// The key is refused by the cipher.
    #[error("encryption key {0:?}: unusable")]
    Unusable(String),
    /// Two keys share an id.
    #[error("encryption key id {0:?} is listed twice")]
    Twice(String),
    /// The list is empty.
    #[error("no encryption key given")]
    Empty,
}

impl Sealer {
    /// The sealer a config's `store_encryption` describes, if any: its
    /// `keys`, or else the keys in its `key_file`.
    pub fn from_config(config: &StoreEncryptionConfig) -> Result<Option<Self>, SealingError> {
        let spec = match (&config.keys, &config.key_file) {
            (Some(keys), _) => keys.expose().to_owned(),
            (None, Some(path)) => {
                std::fs::read_to_string(path).map_err(|source| SealingError::Read { path: path.clone(), source })?
            }
            (None, None) => return Ok(None),
        };
        Self::from_spec(&spec).map(Some).map_err(SealingError::Keys)
    }

    /// Parses `id:hex,id:hex,…`.
    pub fn from_spec(spec: &str) -> Result<Self, KeySpecError> {
        let mut keys = Vec::new();
        for entry in spec.split([',', '\n']).map(str::trim).filter(|e| !e.is_empty()) {
            let (id, hex) = entry.split_once(':').ok_or(KeySpecError::Entry)?;
            if id.is_empty()
                || id.len() > 32
                || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(KeySpecError::Id(id.to_owned()));
            }
            let bytes = decode_hex(hex).ok_or_else(|| KeySpecError::Hex(id.to_owned()))?;
            let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| KeySpecError::Unusable(id.to_owned()))?;
            if keys.iter().any(|(existing, _)| existing == id) {
                return Err(KeySpecError::Twice(id.to_owned()));
            }
            keys.push((id.to_owned(), LessSafeKey::new(key)));
        }
        if keys.is_empty() {
            return Err(KeySpecError::Empty);
        }
        Ok(Self { keys })
    }

    /// Seals `plain`, bound to `context` (the record's address).
    pub fn seal(&self, context: &[u8], plain: &[u8]) -> Result<Vec<u8>, StoreError> {
        let (id, key) = &self.keys[0];
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let mut sealed = Vec::with_capacity(2 + id.len() + NONCE_LEN + plain.len() + 16);
        sealed.push(SEALED);
        sealed.push(id.len() as u8);
        sealed.extend_from_slice(id.as_bytes());
        sealed.extend_from_slice(&nonce_bytes);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce_bytes), Aad::from(context), &mut body)
            .map_err(|_| StoreError::Corrupt("sealing failed".into()))?;
        sealed.extend_from_slice(&body);
        Ok(sealed)
    }

    /// Opens what [`Sealer::seal`] wrote for the same `context`.
    pub fn open(&self, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
        let corrupt = |why: &str| StoreError::Corrupt(format!("sealed response: {why}"));
        let (&marker, rest) = sealed.split_first().ok_or_else(|| corrupt("empty"))?;
        if marker != SEALED {
            return Err(corrupt("not sealed (written without encryption?)"));
        }
        let (&id_len, rest) = rest.split_first().ok_or_else(|| corrupt("truncated"))?;
        let id_len = usize::from(id_len);
        if rest.len() < id_len + NONCE_LEN {
            return Err(corrupt("truncated"));
        }
        let (id, rest) = rest.split_at(id_len);
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let key = self
            .keys
            .iter()
            .find(|(known, _)| known.as_bytes() == id)
            .map(|(_, key)| key)
            .ok_or_else(|| corrupt("sealed with a key that is no longer configured"))?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| corrupt("bad nonce"))?;
        let mut body = ciphertext.to_vec();
        let plain =
            key.open_in_place(nonce, Aad::from(context), &mut body).map_err(|_| corrupt("authentication failed"))?;
        Ok(plain.to_vec())
    }
}

/// A response as networked stores keep it: encoded, then sealed when a
/// sealer is configured.
pub fn seal_response(
    sealer: Option<&Sealer>,
    key: &ScopedKey,
    response: &StoredResponse,
) -> Result<Vec<u8>, StoreError> {
    let encoded = codec::encode(response);
    match sealer {
        Some(sealer) => sealer.seal(key.as_bytes(), &encoded),
        None => Ok(encoded),
    }
}

/// Reads back what [`seal_response`] wrote. Unsealed records written before
/// keys were configured still read (they expire within `key_ttl`); a sealed
/// one without keys is an error, never a guess.
pub fn open_response(sealer: Option<&Sealer>, key: &ScopedKey, stored: Vec<u8>) -> Result<StoredResponse, StoreError> {
    match (sealer, stored.first()) {
        (Some(sealer), Some(&SEALED)) => codec::decode(sealer.open(key.as_bytes(), &stored)?),
        (None, Some(&SEALED)) => {
            Err(StoreError::Corrupt("the stored response is sealed but no store_encryption keys are set".into()))
        }
        _ => codec::decode(stored),
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "k1:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "k2:1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

    #[test]
    fn a_sealed_response_opens_only_for_its_own_record() {
        let sealer = Sealer::from_spec(K1).unwrap();
        let sealed = sealer.seal(b"record-a", b"card 4242").unwrap();
        assert!(!sealed.windows(4).any(|w| w == b"4242"), "the plaintext is not visible");
        assert_eq!(sealer.open(b"record-a", &sealed).unwrap(), b"card 4242");
        assert!(sealer.open(b"record-b", &sealed).is_err(), "moved to another record: refused");
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(sealer.open(b"record-a", &tampered).is_err());
    }

    #[test]
    fn rotation_seals_with_the_first_key_and_opens_with_any() {
        let old = Sealer::from_spec(K1).unwrap();
        let sealed_old = old.seal(b"r", b"x").unwrap();
        let rotated = Sealer::from_spec(&format!("{K2},{K1}")).unwrap();
        assert_eq!(rotated.open(b"r", &sealed_old).unwrap(), b"x");
        let sealed_new = rotated.seal(b"r", b"y").unwrap();
        assert!(old.open(b"r", &sealed_new).is_err(), "the old key set cannot open the new key's records");
        let retired = Sealer::from_spec(K2).unwrap();
        assert!(retired.open(b"r", &sealed_old).unwrap_err().to_string().contains("no longer configured"));
    }

    #[test]
    fn bad_key_specs_say_what_is_wrong() {
        assert!(Sealer::from_spec("").is_err());
        assert!(Sealer::from_spec("nokey").unwrap_err().to_string().contains("id:hex"));
        assert!(Sealer::from_spec("k:abcd").unwrap_err().to_string().contains("64 hex"));
        assert!(Sealer::from_spec(&format!("{K1},{K1}")).unwrap_err().to_string().contains("twice"));
        assert!(!format!("{:?}", Sealer::from_spec(K1).unwrap()).contains("0001"), "Debug shows ids only");
    }
}

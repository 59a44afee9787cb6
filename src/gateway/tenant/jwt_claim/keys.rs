//! The keys a token is checked with: an HS256 secret read once at start,
//! or a JSON Web Key Set file read again when it changes.
//!
//! The key set is re-read at most once per [`RECHECK`], by whichever
//! request comes first after it (the others go on with the keys they
//! have), and replaced only when its bytes changed and parse: an
//! identity provider's rotation (new key added, tokens signed with it,
//! old key dropped later) is followed within a second of the file's
//! update, and a half-written or broken file keeps the previous keys
//! (warned once per change). No background task: a gateway that verifies
//! no token reads nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use sha2::{Digest, Sha256};

use crate::config::JwtKeys;

/// How often, at most, the key set file is read again.
pub(super) const RECHECK: Duration = Duration::from_secs(1);

/// An HS256 secret shorter than this is refused (RFC 7518 §3.2: a key at
/// least as long as the hash).
const MIN_SECRET: usize = 32;

/// A key a token may name, with the algorithms it checks.
#[derive(Debug)]
pub(super) struct VerifyingKey {
    kid: Option<String>,
    pub(super) key: DecodingKey,
    pub(super) algorithms: Vec<Algorithm>,
}

/// The keys in force.
#[derive(Debug)]
pub(super) struct KeySet(Vec<VerifyingKey>);

impl KeySet {
    /// The key a token's `kid` names; a token without one (or a set whose
    /// one key has none) needs a set of one key.
    pub(super) fn find(&self, kid: Option<&str>) -> Result<&VerifyingKey, &'static str> {
        if let Some(kid) = kid
            && let Some(key) = self.0.iter().find(|key| key.kid.as_deref() == Some(kid))
        {
            return Ok(key);
        }
        match self.0.as_slice() {
            [only] if only.kid.is_none() || kid.is_none() => Ok(only),
            _ if kid.is_some() => Err("the token's key (kid) is not in the key set"),
            _ => Err("the token names no key (kid) and the key set has several"),
        }
    }
}

/// Where the keys come from.
pub(super) enum Keys {
    /// A shared secret: one key, read once.
    Secret(Arc<KeySet>),
    /// A key set file, followed.
    Jwks(JwksFile),
}

/// Why the configured keys cannot be used; names the file.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// `hs256_secret_file` cannot be read.
    #[error("cannot read hs256_secret_file {}: {source}", path.display())]
    ReadSecret {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The secret is shorter than the hash.
    #[error("hs256_secret_file {}: the secret must be at least {MIN_SECRET} bytes; use a random value", path.display())]
    ShortSecret {
        /// The file.
        path: PathBuf,
    },
    /// The secret is not a key.
    #[error("hs256_secret_file {}: {source}", path.display())]
    Secret {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// `jwks_file` cannot be read.
    #[error("cannot read jwks_file {}: {source}", path.display())]
    ReadJwks {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `jwks_file` holds no usable key set.
    #[error("jwks_file {}: {source}", path.display())]
    Jwks {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: KeySetError,
    },
}

/// Why the bytes of a key set file are not a usable key set.
#[derive(Debug, thiserror::Error)]
pub enum KeySetError {
    /// Not JSON, or not the shape of a JWK Set.
    #[error("not a JSON Web Key Set: {0}")]
    Json(#[source] serde_json::Error),
    /// A signing key that cannot be used (its parameters).
    #[error("key {kid:?}: {source}")]
    Key {
        /// The key's `kid`, if it has one.
        kid: Option<String>,
        /// Why.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// Only encryption, symmetric or unsupported keys.
    #[error("no RSA, EC (P-256, P-384) or Ed25519 signing key in it")]
    NoSigningKey,
}

impl Keys {
    /// Reads the configured keys; the error names the file and the fault.
    pub(super) fn load(config: &JwtKeys) -> Result<Self, KeysError> {
        match config {
            JwtKeys::Hs256SecretFile(path) => {
                let bytes =
                    std::fs::read(path).map_err(|source| KeysError::ReadSecret { path: path.clone(), source })?;
                let secret = bytes.strip_suffix(b"\n").map(|s| s.strip_suffix(b"\r").unwrap_or(s)).unwrap_or(&bytes);
                if secret.len() < MIN_SECRET {
                    return Err(KeysError::ShortSecret { path: path.clone() });
                }
                let key = DecodingKey::from_secret(secret)
                    .map_err(|source| KeysError::Secret { path: path.clone(), source })?;
                Ok(Self::Secret(Arc::new(KeySet(vec![VerifyingKey {
                    kid: None,
                    key,
                    algorithms: vec![Algorithm::HS256],
                }]))))
            }
            JwtKeys::JwksFile(path) => JwksFile::load(path).map(Self::Jwks),
        }
    }

    /// The keys in force now.
    pub(super) fn current(&self) -> Arc<KeySet> {
        match self {
            Self::Secret(set) => set.clone(),
            Self::Jwks(file) => file.current(),
        }
    }
}

/// A key set file and what was last read from it.
pub(super) struct JwksFile {
    path: PathBuf,
    keys: RwLock<Arc<KeySet>>,
    last: Mutex<LastRead>,
}

struct LastRead {
    at: Instant,
    /// Of the bytes last read, parsed or not: a broken file is warned about once.
    digest: [u8; 32],
}

impl JwksFile {
    fn load(path: &Path) -> Result<Self, KeysError> {
        let bytes = std::fs::read(path).map_err(|source| KeysError::ReadJwks { path: path.to_owned(), source })?;
        let keys = parse(&bytes).map_err(|source| KeysError::Jwks { path: path.to_owned(), source })?;
        Ok(Self {
            path: path.to_owned(),
            keys: RwLock::new(Arc::new(keys)),
            last: Mutex::new(LastRead { at: Instant::now(), digest: Sha256::digest(&bytes).into() }),
        })
    }

    fn current(&self) -> Arc<KeySet> {
        // One request re-reads; the others do not wait for it.
        if let Ok(mut last) = self.last.try_lock()
            && last.at.elapsed() >= RECHECK
        {
            last.at = Instant::now();
            self.reread(&mut last);
        }
        self.keys.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn reread(&self, last: &mut LastRead) {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) => {
                if last.digest != [0; 32] {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot read jwks_file; keeping the keys read before");
                    last.digest = [0; 32];
                }
                return;
            }
        };
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if digest == last.digest {
            return;
        }
        last.digest = digest;
        match parse(&bytes) {
            Ok(keys) => {
                tracing::info!(path = %self.path.display(), keys = keys.0.len(), "jwks_file changed: keys reloaded");
                *self.keys.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(keys);
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "jwks_file changed but cannot be used; keeping the keys read before");
            }
        }
    }
}

/// The signing keys of a key set: RSA, EC (P-256, P-384) and Ed25519
/// public keys. Encryption keys and symmetric ones are left out (a
/// shared secret belongs in `hs256_secret_file`, not in a key set).
fn parse(bytes: &[u8]) -> Result<KeySet, KeySetError> {
    let set: JwkSet = serde_json::from_slice(bytes).map_err(KeySetError::Json)?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let family: &[Algorithm] = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => &[
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ],
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => &[Algorithm::ES256],
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P384 => &[Algorithm::ES384],
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => &[Algorithm::EdDSA],
            _ => continue,
        };
        // A key that names its algorithm checks that one only.
        let algorithms: Vec<Algorithm> = match jwk.common.key_algorithm.map(|alg| alg.to_string().parse::<Algorithm>())
        {
            None => family.to_vec(),
            Some(Ok(alg)) if family.contains(&alg) => vec![alg],
            Some(_) => continue,
        };
        let key =
            DecodingKey::from_jwk(jwk).map_err(|source| KeySetError::Key { kid: jwk.common.key_id.clone(), source })?;
        keys.push(VerifyingKey { kid: jwk.common.key_id.clone(), key, algorithms });
    }
    if keys.is_empty() {
        return Err(KeySetError::NoSigningKey);
    }
    Ok(KeySet(keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EC_KEY: &str = r#"{"kty":"EC","crv":"P-256","kid":"ec-1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}"#;

    #[test]
    fn signing_keys_are_kept_with_their_algorithms_and_others_left_out() {
        let text = format!(
            r#"{{"keys":[{EC_KEY},{{"kty":"EC","crv":"P-256","use":"enc","kid":"enc","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}},{{"kty":"oct","k":"c2VjcmV0","kid":"oct"}}]}}"#
        );
        let set = parse(text.as_bytes()).unwrap();
        assert_eq!(set.0.len(), 1);
        let key = set.find(Some("ec-1")).unwrap();
        assert_eq!(key.algorithms, vec![Algorithm::ES256]);
        assert_eq!(set.find(None).map(|k| k.algorithms.clone()), Ok(vec![Algorithm::ES256]), "one key: no kid needed");
        assert!(set.find(Some("enc")).is_err());
        assert!(set.find(Some("oct")).is_err());
    }

    #[test]
    fn a_file_without_a_signing_key_or_not_a_key_set_is_refused() {
        assert!(parse(br#"{"keys":[]}"#).unwrap_err().to_string().contains("no RSA"));
        assert!(parse(b"[]").unwrap_err().to_string().contains("not a JSON Web Key Set"));
    }

    #[test]
    fn several_keys_need_a_kid_that_names_one() {
        let second = EC_KEY.replace("ec-1", "ec-2");
        let set = parse(format!(r#"{{"keys":[{EC_KEY},{second}]}}"#).as_bytes()).unwrap();
        assert!(set.find(Some("ec-2")).is_ok());
        assert!(set.find(None).unwrap_err().contains("several"));
        assert!(set.find(Some("ec-3")).unwrap_err().contains("not in the key set"));
    }
}

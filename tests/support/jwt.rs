//! Signed JWTs and the files a gateway verifies them with, made at test
//! time: an HS256 secret file, and an EC P-256 key whose JSON Web Key Set
//! is written to a file (ring signs; nothing here is a fixture).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};

pub const ISSUER: &str = "https://id.example.test";
pub const AUDIENCE: &str = "payments";

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Claims for `sub` that pass every check: right issuer and audience, an
/// hour to live, and a `jti` of their own (each token is a new string).
pub fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now(), "exp": now() + 3600, "jti": rand::random::<u64>().to_string() })
}

/// `header.claims.signature`, each part base64url.
fn token(header: &Value, claims: &Value, sign: impl FnOnce(&[u8]) -> Vec<u8>) -> String {
    let message =
        format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
    let signature = sign(message.as_bytes());
    format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// A directory of key files, removed on drop.
pub struct KeyDir(PathBuf);

impl KeyDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("idemgate-test-jwt-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An HS256 issuer; its secret is written to a file.
pub struct Hs256 {
    secret: Vec<u8>,
    pub file: PathBuf,
}

impl Hs256 {
    pub fn new(dir: &KeyDir) -> Self {
        let secret: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
        let file = dir.path("hs256.secret");
        std::fs::write(&file, URL_SAFE_NO_PAD.encode(&secret)).unwrap();
        // The file holds the base64 text: that text is the secret's bytes.
        Self { secret: URL_SAFE_NO_PAD.encode(&secret).into_bytes(), file }
    }

    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(&json!({ "alg": "HS256", "typ": "JWT" }), claims)
    }

    pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.secret);
        token(header, claims, |message| ring::hmac::sign(&key, message).as_ref().to_vec())
    }
}

/// An ES256 issuer with a key id; [`Es256::jwk`] is its public key.
pub struct Es256 {
    pair: EcdsaKeyPair,
    pub kid: String,
}

impl Es256 {
    pub fn new(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        Self { pair, kid: kid.into() }
    }

    pub fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref(); // 0x04 ‖ x ‖ y
        json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        })
    }

    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({ "alg": "ES256", "typ": "JWT", "kid": self.kid });
        let rng = SystemRandom::new();
        token(&header, claims, |message| self.pair.sign(&rng, message).unwrap().as_ref().to_vec())
    }
}

/// Writes a key set of these keys to `path`.
pub fn write_jwks(path: &Path, keys: &[&Es256]) {
    let set = json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() });
    std::fs::write(path, set.to_string()).unwrap();
}

/// An unsigned token (`alg: none`) with these claims.
pub fn unsigned(claims: &Value) -> String {
    token(&json!({ "alg": "none", "typ": "JWT" }), claims, |_| Vec::new())
}

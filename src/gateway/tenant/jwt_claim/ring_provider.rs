//! jsonwebtoken's signature checks, done by ring.
//!
//! jsonwebtoken leaves its cryptography to a provider: its own are aws-lc
//! (C, a second TLS-grade library beside ring) or RustCrypto (a dozen more
//! crates: rsa, p256, p384, ed25519-dalek and their bigint stack). ring is
//! already linked for rustls and verifies every JWS algorithm the gateway
//! takes, so this file maps each to its ring algorithm and nothing more;
//! parsing, the `alg` and key-family checks and the claims stay
//! jsonwebtoken's. The gateway only verifies: signing, and the JWK helpers
//! that derive public keys from private ones, answer with an error.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::jwk::{EllipticCurve, ThumbprintHash};
use jsonwebtoken::signature;
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::{digest, hmac, signature as ring_sig};

/// The provider, installed for the process before the first token is checked.
static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: no_signer,
    verifier_factory: verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(not_here()),
        rsa_pub_components_from_public_key: |_| Err(not_here()),
        ec_pub_components_from_private_key: |_, _| Err(not_here()),
        ed_pub_components_from_private_key: no_ed_components,
        compute_digest,
    },
};

/// Makes ring the process's JWT provider (once; later calls change nothing).
pub(super) fn install() {
    // Err means a provider is installed already: this one, by an earlier gateway in the process.
    let _ = PROVIDER.install_default();
}

fn not_here() -> Error {
    ErrorKind::UnsupportedAlgorithm.into()
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>, Error> {
    Err(not_here())
}

fn no_ed_components(_: &[u8], _: &EllipticCurve) -> Result<Vec<u8>, Error> {
    Err(not_here())
}

fn compute_digest(data: &[u8], hash: ThumbprintHash) -> Result<Vec<u8>, Error> {
    let algorithm = match hash {
        ThumbprintHash::SHA256 => &digest::SHA256,
        ThumbprintHash::SHA384 => &digest::SHA384,
        ThumbprintHash::SHA512 => &digest::SHA512,
        _ => return Err(not_here()),
    };
    Ok(digest::digest(algorithm, data).as_ref().to_vec())
}

/// How one algorithm is checked.
enum Check {
    Hmac(hmac::Algorithm),
    Rsa(&'static ring_sig::RsaParameters),
    /// ECDSA (fixed-length `r ‖ s`, as JWS writes it) and Ed25519 over a raw public key.
    Raw(&'static dyn ring_sig::VerificationAlgorithm),
}

fn check_for(algorithm: Algorithm) -> Option<Check> {
    Some(match algorithm {
        Algorithm::HS256 => Check::Hmac(hmac::HMAC_SHA256),
        Algorithm::HS384 => Check::Hmac(hmac::HMAC_SHA384),
        Algorithm::HS512 => Check::Hmac(hmac::HMAC_SHA512),
        Algorithm::RS256 => Check::Rsa(&ring_sig::RSA_PKCS1_2048_8192_SHA256),
        Algorithm::RS384 => Check::Rsa(&ring_sig::RSA_PKCS1_2048_8192_SHA384),
        Algorithm::RS512 => Check::Rsa(&ring_sig::RSA_PKCS1_2048_8192_SHA512),
        Algorithm::PS256 => Check::Rsa(&ring_sig::RSA_PSS_2048_8192_SHA256),
        Algorithm::PS384 => Check::Rsa(&ring_sig::RSA_PSS_2048_8192_SHA384),
        Algorithm::PS512 => Check::Rsa(&ring_sig::RSA_PSS_2048_8192_SHA512),
        Algorithm::ES256 => Check::Raw(&ring_sig::ECDSA_P256_SHA256_FIXED),
        Algorithm::ES384 => Check::Raw(&ring_sig::ECDSA_P384_SHA384_FIXED),
        Algorithm::EdDSA => Check::Raw(&ring_sig::ED25519),
        _ => return None,
    })
}

/// A key bound to one algorithm.
struct Verifier {
    algorithm: Algorithm,
    check: Check,
    key: DecodingKey,
}

fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    // An HMAC secret never checks an RSA or EC token, nor the reverse.
    if key.family() != algorithm.family() {
        return Err(ErrorKind::InvalidKeyFormat.into());
    }
    let check = check_for(*algorithm).ok_or_else(not_here)?;
    Ok(Box::new(Verifier { algorithm: *algorithm, check, key: key.clone() }))
}

impl signature::Verifier<Vec<u8>> for Verifier {
    fn verify(&self, message: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        let checked = match (&self.check, self.key.kind()) {
            (Check::Hmac(algorithm), DecodingKeyKind::SecretOrDer(secret)) => {
                hmac::verify(&hmac::Key::new(*algorithm, secret), message, signature)
            }
            (Check::Rsa(parameters), DecodingKeyKind::RsaModulusExponent { n, e }) => {
                ring_sig::RsaPublicKeyComponents { n, e }.verify(parameters, message, signature)
            }
            (Check::Rsa(parameters), DecodingKeyKind::SecretOrDer(der)) => {
                ring_sig::UnparsedPublicKey::new(*parameters, der).verify(message, signature)
            }
            (Check::Raw(algorithm), DecodingKeyKind::SecretOrDer(public)) => {
                ring_sig::UnparsedPublicKey::new(*algorithm, public).verify(message, signature)
            }
            _ => Err(ring::error::Unspecified),
        };
        checked.map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for Verifier {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

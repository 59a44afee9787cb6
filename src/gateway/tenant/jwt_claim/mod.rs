//! `{ jwt_claim = "sub", … }`: the tenant is a claim of the request's
//! bearer JWT, once the gateway has checked the token itself: its
//! signature against `jwks_file` (RSA, EC or Ed25519 public keys, followed
//! on disk: [`keys`]) or `hs256_secret_file`, its `exp` (60 s of leeway
//! for clock skew), `nbf` when present, and that its `iss` is `issuer` and
//! its `aud` holds `audience`. A claim is never read from a token that
//! fails any of these: a forged claim would read another tenant's stored
//! responses. `alg: none` is not an algorithm here, and a key checks only
//! the algorithms of its own family (an RSA public key is never taken as
//! an HMAC secret).
//!
//! A refreshed token names the same principal, so a retry after a refresh
//! replays. A request without a valid token gets `401 unauthenticated`.

mod keys;
mod ring_provider;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Validation, decode, decode_header};

use super::{Source, TenantSourceError, single_field, split_credential};
use crate::config::JwtClaimConfig;
use crate::idempotency::{Tenant, TenantError};
use keys::Keys;
pub use keys::{KeySetError, KeysError};

/// The challenge of a `401`.
const CHALLENGE: &str = "Bearer";

/// The tenant is a claim of a verified JWT.
pub(super) struct JwtClaim {
    claim: String,
    issuer: String,
    audience: String,
    keys: Keys,
}

impl JwtClaim {
    /// Reads the keys now: a missing or unusable file stops the start.
    pub(super) fn load(config: &JwtClaimConfig) -> Result<Self, TenantSourceError> {
        ring_provider::install();
        Ok(Self {
            claim: config.claim.clone(),
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            keys: Keys::load(&config.keys).map_err(TenantSourceError::Keys)?,
        })
    }

    /// The claim's value, from a token that passes every check.
    fn verified_claim(&self, token: &str) -> Result<Vec<u8>, TokenRefusal> {
        let header = decode_header(token).map_err(|_| TokenRefusal::NotAJwt)?;
        let keys = self.keys.current();
        let key = keys.find(header.kid.as_deref()).map_err(TokenRefusal::Key)?;
        let mut validation = Validation::new(header.alg);
        validation.algorithms = key.algorithms.clone();
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        let claims = decode::<serde_json::Map<String, serde_json::Value>>(token, &key.key, &validation)
            .map_err(|e| TokenRefusal::of(e.kind()))?
            .claims;
        match claims.get(&self.claim) {
            Some(serde_json::Value::String(value)) if !value.is_empty() => Ok(value.as_bytes().to_vec()),
            Some(serde_json::Value::Number(value)) => Ok(value.to_string().into_bytes()),
            _ => Err(TokenRefusal::NoTenantClaim(self.claim.clone())),
        }
    }
}

impl Source for JwtClaim {
    fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        let refused = |why: String| TenantError::Unauthenticated { challenge: CHALLENGE, why };
        let value = single_field(headers, &AUTHORIZATION)?.ok_or_else(|| refused("no Authorization header".into()))?;
        let token = split_credential(value.as_bytes())
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer"))
            .and_then(|(_, token)| std::str::from_utf8(token).ok())
            .ok_or_else(|| refused("the Authorization header is not a Bearer token".into()))?;
        self.verified_claim(token).map(Tenant::from_bytes).map_err(|why| refused(why.to_string()))
    }

    fn tenant_named(&self, value: Option<&str>) -> Tenant {
        Tenant::from_bytes(value.unwrap_or_default())
    }
}

/// Why a token is refused, as its client is told: which check failed,
/// never the claims.
#[derive(Debug, thiserror::Error)]
enum TokenRefusal {
    /// The header does not decode, or names an algorithm not supported.
    #[error("the bearer token is not a JWT signed with a supported algorithm")]
    NotAJwt,
    /// The key set has no key for the token (see `KeySet::find`).
    #[error("{0}")]
    Key(&'static str),
    /// `exp` is past.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is ahead.
    #[error("the token is not valid yet (nbf)")]
    Immature,
    /// `iss` is not `issuer`.
    #[error("the token's issuer (iss) is not the one this gateway accepts")]
    Issuer,
    /// `aud` does not hold `audience`.
    #[error("the token's audience (aud) is not this gateway's")]
    Audience,
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// `alg` is not one of its key's family.
    #[error("the token's algorithm (alg) is not one its key signs with")]
    Algorithm,
    /// A claim every token must carry (`exp`, `iss`, `aud`) is missing.
    #[error("the token has no {0} claim")]
    MissingClaim(String),
    /// The claim that names the tenant is missing, empty or of another type.
    #[error("the token has no {0} claim (a string or a number)")]
    NoTenantClaim(String),
    /// Any other fault.
    #[error("the bearer token is not a valid JWT")]
    Invalid,
}

impl TokenRefusal {
    fn of(kind: &ErrorKind) -> Self {
        match kind {
            ErrorKind::ExpiredSignature => Self::Expired,
            ErrorKind::ImmatureSignature => Self::Immature,
            ErrorKind::InvalidIssuer => Self::Issuer,
            ErrorKind::InvalidAudience => Self::Audience,
            ErrorKind::InvalidSignature => Self::Signature,
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat => Self::Algorithm,
            ErrorKind::MissingRequiredClaim(claim) => Self::MissingClaim(claim.clone()),
            _ => Self::Invalid,
        }
    }
}

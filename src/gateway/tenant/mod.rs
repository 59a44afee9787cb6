//! Tenant sources: who a request belongs to, and so which key space its
//! `Idempotency-Key` lives in (`idempotency::scope`).
//!
//! One file per kind of source, each a [`Source`]; [`TenantSource::from_config`]
//! turns the config's [`TenantConfig`] into one with a single match arm
//! per kind. Adding a kind is a config variant, a file here and that arm.
//!
//! | config | tenant | without a credential | operator's `?tenant=` |
//! |---|---|---|---|
//! | `{ from = "authorization" }` | hash of the `Authorization` value, scheme in any case | the anonymous tenant | the full `Authorization` value |
//! | `{ header = "x-tenant-id" }` | the header's value | the anonymous tenant | the header's value |
//! | `{ fixed = "default" }` | that value | — | nothing |
//! | `{ basic_user = true }` | the Basic user name | `401 unauthenticated` | the user name |
//! | `{ jwt_claim = "sub", … }` | the claim of a verified JWT | `401 unauthenticated` | the claim's value |
//!
//! The first source names a *credential*: a client that rotates its token
//! becomes another tenant, and a retry after a refresh runs again. The
//! others name a *principal*, which survives rotation. The two that read a
//! principal from the credential refuse a request without a valid one
//! rather than file it under a shared default tenant, where every such
//! request would share one key space.
//!
//! A header the tenant comes from that appears more than once is refused
//! rather than resolved: whichever field were picked, a client could place
//! its own ahead of (or behind) the one its auth proxy sets.

mod authorization;
mod basic_user;
mod fixed;
mod header;
mod jwt_claim;

pub use jwt_claim::{KeySetError, KeysError};

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

use crate::config::TenantConfig;
use crate::idempotency::{Tenant, TenantError};

/// One kind of tenant source.
trait Source: Send + Sync {
    /// The tenant of a request, from its headers.
    fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError>;

    /// The tenant an operator names in the admin API's `tenant` parameter:
    /// exactly the tenant a request carrying that value would have
    /// (`None`: a request without it).
    fn tenant_named(&self, value: Option<&str>) -> Tenant;
}

/// Where the tenant of a request comes from, built once from the config.
pub struct TenantSource(Box<dyn Source>);

impl std::fmt::Debug for TenantSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TenantSource(..)")
    }
}

/// Why a tenant source cannot be built (its key file, say).
#[derive(Debug, thiserror::Error)]
pub enum TenantSourceError {
    /// A key file of `jwt_claim` cannot be read or holds no usable key.
    #[error("gateway.tenant: {0}")]
    Keys(#[source] KeysError),
}

impl TenantSource {
    /// The source a config names; reads key files now, so a wrong one
    /// stops the start (and `check-config`).
    pub fn from_config(config: &TenantConfig) -> Result<Self, TenantSourceError> {
        let source: Box<dyn Source> = match config {
            TenantConfig::Authorization => Box::new(authorization::Authorization),
            TenantConfig::Header(name) => Box::new(header::Header::new(name.clone())),
            TenantConfig::Fixed(tenant) => Box::new(fixed::Fixed::new(tenant)),
            TenantConfig::BasicUser => Box::new(basic_user::BasicUser),
            TenantConfig::JwtClaim(jwt) => Box::new(jwt_claim::JwtClaim::load(jwt)?),
        };
        Ok(Self(source))
    }

    /// The default source: a hash of the `Authorization` header.
    pub fn authorization() -> Self {
        Self(Box::new(authorization::Authorization))
    }

    /// The tenant of a request; an error when the header it comes from is
    /// repeated, or (for sources that name a principal) when the request
    /// has no valid credential.
    pub fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        self.0.tenant_of(headers)
    }

    /// The tenant the admin API's `tenant` parameter names (see the table above).
    pub fn tenant_from_value(&self, value: Option<&str>) -> Tenant {
        self.0.tenant_named(value)
    }
}

/// The one field of `name`, if any; more than one is refused.
fn single_field<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a HeaderValue>, TenantError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(TenantError::Repeated { header: name.clone() });
    }
    Ok(first)
}

/// The scheme and the rest of a credential (`Bearer  abc` → `("Bearer",
/// "abc")`): RFC 9110 §11.4 separates them by one or more spaces.
fn split_credential(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    let rest = rest.trim_ascii_start();
    (!scheme.is_empty() && !rest.is_empty()).then_some((scheme, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::{IdempotencyKey, ScopedKey};

    pub(super) fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn two_credentials_never_share_a_key_space() {
        let source = TenantSource::authorization();
        let alice = source.tenant_of(&headers(&[("authorization", "Bearer alice")])).unwrap();
        let bob = source.tenant_of(&headers(&[("authorization", "Bearer bob")])).unwrap();
        let key = IdempotencyKey::new("k1").unwrap();
        assert_ne!(ScopedKey::new(&alice, &key), ScopedKey::new(&bob, &key));
    }

    #[test]
    fn a_credential_splits_at_its_first_spaces() {
        assert_eq!(split_credential(b"Bearer abc"), Some((&b"Bearer"[..], &b"abc"[..])));
        assert_eq!(split_credential(b"Bearer   a b"), Some((&b"Bearer"[..], &b"a b"[..])));
        assert_eq!(split_credential(b"Bearer"), None);
        assert_eq!(split_credential(b"Bearer   "), None);
        assert_eq!(split_credential(b" abc"), None);
    }

    #[test]
    fn every_source_refuses_its_header_repeated() {
        let twice = headers(&[("authorization", "Basic YTpi"), ("authorization", "Basic YzpkCg==")]);
        for config in [TenantConfig::Authorization, TenantConfig::BasicUser] {
            let source = TenantSource::from_config(&config).unwrap();
            assert!(matches!(source.tenant_of(&twice), Err(TenantError::Repeated { .. })), "{config:?}");
        }
    }
}

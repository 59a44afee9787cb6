//! `{ basic_user = true }`: the user name of a `Basic` credential (RFC
//! 7617), not its password, so a client whose password is rotated between
//! a request and its retry stays one tenant.
//!
//! The gateway does not check the password (the upstream, or a proxy in
//! front, does). A replay never reaches the upstream, so without such a
//! proxy a client that sends another user's name with that user's key
//! would be answered that user's stored response: `check-config` warns.
//! A request without a Basic credential with a user name gets `401`.

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use http::HeaderMap;
use http::header::AUTHORIZATION;

use super::{Source, single_field, split_credential};
use crate::idempotency::{Tenant, TenantError};

/// The challenge of a `401`.
const CHALLENGE: &str = "Basic realm=\"idemgate\"";

/// Standard base64, with or without its padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The tenant is the Basic user name.
pub(super) struct BasicUser;

impl Source for BasicUser {
    fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        let value = single_field(headers, &AUTHORIZATION)?.ok_or_else(|| refused("no Authorization header"))?;
        user_of(value.as_bytes()).map(Tenant::from_bytes).map_err(refused)
    }

    fn tenant_named(&self, value: Option<&str>) -> Tenant {
        Tenant::from_bytes(value.unwrap_or_default())
    }
}

/// The user name of a `Basic` credential.
fn user_of(value: &[u8]) -> Result<Vec<u8>, &'static str> {
    let (scheme, encoded) = split_credential(value).ok_or("the Authorization header is not a Basic credential")?;
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Err("the Authorization header is not a Basic credential");
    }
    let decoded = BASE64.decode(encoded).map_err(|_| "the Basic credential is not base64")?;
    let colon = decoded.iter().position(|b| *b == b':').ok_or("the Basic credential has no user:password")?;
    let mut user = decoded;
    user.truncate(colon);
    if user.is_empty() {
        return Err("the Basic credential has no user name");
    }
    Ok(user)
}

fn refused(why: &str) -> TenantError {
    TenantError::Unauthenticated { challenge: CHALLENGE, why: why.into() }
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose;

    use super::super::tests::headers;
    use super::*;

    fn basic(user_password: &str) -> String {
        format!("Basic {}", general_purpose::STANDARD.encode(user_password))
    }

    fn of(value: &str) -> Result<Tenant, TenantError> {
        BasicUser.tenant_of(&headers(&[("authorization", value)]))
    }

    #[test]
    fn the_user_names_the_tenant_whatever_the_password() {
        assert_eq!(of(&basic("alice:old-password")), Ok(Tenant::from_bytes("alice")));
        assert_eq!(of(&basic("alice:new:password")), Ok(Tenant::from_bytes("alice")));
        assert_eq!(of(&basic("bob:old-password")), Ok(Tenant::from_bytes("bob")));
        assert_eq!(of(&basic("alice:pw").replace("Basic", "basic")), Ok(Tenant::from_bytes("alice")));
        let unpadded = format!("Basic {}", general_purpose::STANDARD_NO_PAD.encode("alice:pw1"));
        assert_eq!(of(&unpadded), Ok(Tenant::from_bytes("alice")));
        assert_eq!(BasicUser.tenant_named(Some("alice")), Tenant::from_bytes("alice"));
    }

    #[test]
    fn without_a_basic_credential_naming_a_user_there_is_no_tenant() {
        let unauthenticated = |result: Result<Tenant, TenantError>| {
            matches!(result, Err(TenantError::Unauthenticated { challenge: CHALLENGE, .. }))
        };
        assert!(unauthenticated(BasicUser.tenant_of(&HeaderMap::new())));
        for value in ["Bearer abc", "Basic", "Basic !!!", &basic("no-colon"), &basic(":password-only")] {
            assert!(unauthenticated(of(value)), "{value}");
        }
    }
}

//! `{ from = "authorization" }`, the default: a hash of the `Authorization`
//! header, so two credentials never share a key space. The credential
//! itself is never kept or compared.
//!
//! The scheme is compared without regard to case, as RFC 9110 §11.1 says,
//! and one or more spaces after it are one: `Bearer x`, `bearer x` and
//! `BEARER  x` are one tenant. The hash is taken over the credential with
//! its scheme spelt `Bearer`/`Basic` (first letter upper case), the way
//! nearly every client writes it, so the records of such clients keep their
//! address across the upgrade that brought this in.
//!
//! A rotated credential is another tenant: for tokens that are refreshed,
//! name the principal instead (`basic_user`, `jwt_claim`, or a header set
//! by an auth proxy). A request without the header is the anonymous tenant
//! (the demo relies on it).

use std::borrow::Cow;

use http::HeaderMap;
use http::header::AUTHORIZATION;

use super::{Source, single_field, split_credential};
use crate::idempotency::hash::hash_fields;
use crate::idempotency::{Tenant, TenantError};

/// The default source.
pub(super) struct Authorization;

impl Source for Authorization {
    fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        Ok(tenant(single_field(headers, &AUTHORIZATION)?.map(|v| v.as_bytes())))
    }

    fn tenant_named(&self, value: Option<&str>) -> Tenant {
        // A value that could not be a header's stands for the absent header,
        // as it always has: no request could carry it.
        tenant(value.filter(|v| http::HeaderValue::from_str(v).is_ok()).map(str::as_bytes))
    }
}

fn tenant(value: Option<&[u8]>) -> Tenant {
    let hashed = value.map(|value| hash_fields(&[b"authorization", &canonical(value)]).to_vec());
    Tenant::from_bytes(hashed.unwrap_or_default())
}

/// The credential with its scheme as `Xxxx` and one space after it; a
/// value with no scheme (no space) as it is.
fn canonical(value: &[u8]) -> Cow<'_, [u8]> {
    let Some((scheme, rest)) = split_credential(value) else { return Cow::Borrowed(value) };
    let mut spelt = Vec::with_capacity(scheme.len() + 1 + rest.len());
    spelt.extend(
        scheme.iter().enumerate().map(|(i, b)| if i == 0 { b.to_ascii_uppercase() } else { b.to_ascii_lowercase() }),
    );
    spelt.push(b' ');
    spelt.extend_from_slice(rest);
    if spelt == value { Cow::Borrowed(value) } else { Cow::Owned(spelt) }
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers;
    use super::*;

    fn of(value: &str) -> Tenant {
        Authorization.tenant_of(&headers(&[("authorization", value)])).unwrap()
    }

    #[test]
    fn the_scheme_is_one_whatever_its_case_and_the_spaces_after_it() {
        assert_eq!(of("Bearer x"), of("bearer x"));
        assert_eq!(of("Bearer x"), of("BEARER   x"));
        assert_eq!(of("Basic YTpi"), of("basic YTpi"));
        assert_ne!(of("Bearer x"), of("Bearer X"), "the credential itself is compared exactly");
        assert_ne!(of("Bearer x"), of("Basic x"));
    }

    #[test]
    fn the_usual_spelling_hashes_as_it_did_before_the_scheme_was_folded() {
        let before = |value: &str| Tenant::from_bytes(hash_fields(&[b"authorization", value.as_bytes()]).to_vec());
        for value in ["Bearer tok-v1", "Basic YWxpY2U6cHc=", "Token abc", "opaque-without-scheme"] {
            assert_eq!(of(value), before(value), "{value}");
        }
    }

    #[test]
    fn no_header_is_the_anonymous_tenant_and_an_admin_value_addresses_the_same_tenant() {
        assert_eq!(Authorization.tenant_of(&HeaderMap::new()).unwrap(), Tenant::from_bytes(""));
        assert_eq!(Authorization.tenant_named(Some("bearer abc")), of("Bearer abc"));
        assert_eq!(Authorization.tenant_named(None), Tenant::from_bytes(""));
        assert_eq!(Authorization.tenant_named(Some("bad\nvalue")), Tenant::from_bytes(""));
    }
}

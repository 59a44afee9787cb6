//! Tenants and the scoped address of a key's record.
//!
//! A record is stored under `sha256(tenant ‖ key)`, never under the raw key,
//! so two tenants that pick the same key address two different records and
//! neither can read, replay, block or probe the other's. The tenant comes
//! from a configured [`TenantSource`]; by default it is a hash of the
//! `Authorization` header, so two credentials never share a key space.

use http::HeaderMap;
use http::header::AUTHORIZATION;

use super::hash::{hash_fields, to_hex};
use super::key::IdempotencyKey;

/// Where the tenant of a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantSource {
    /// A hash of the `Authorization` header (absent header = the anonymous tenant).
    Authorization,
    /// The value of a named header (absent header = the anonymous tenant).
    Header(http::header::HeaderName),
    /// Every request belongs to one tenant.
    Fixed(String),
}

/// The tenant a request belongs to, as bytes that only feed hashes.
#[derive(Clone, PartialEq, Eq)]
pub struct Tenant(Vec<u8>);

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tenant(..)")
    }
}

impl TenantSource {
    /// Derives the tenant of a request.
    pub fn tenant_of(&self, headers: &HeaderMap) -> Tenant {
        match self {
            // Hashed at once: the credential itself is never kept or compared.
            Self::Authorization => Tenant(
                headers
                    .get(AUTHORIZATION)
                    .map(|v| hash_fields(&[b"authorization", v.as_bytes()]).to_vec())
                    .unwrap_or_default(),
            ),
            Self::Header(name) => Tenant(headers.get(name).map(|v| v.as_bytes().to_vec()).unwrap_or_default()),
            Self::Fixed(value) => Tenant(value.as_bytes().to_vec()),
        }
    }
}

impl TenantSource {
    /// The tenant for the value this source reads (the admin API's
    /// `tenant` parameter): the full `Authorization` value, the tenant
    /// header's value, or nothing for a fixed tenant.
    pub fn tenant_from_value(&self, value: Option<&str>) -> Tenant {
        let mut headers = HeaderMap::new();
        let name = match self {
            Self::Authorization => AUTHORIZATION,
            Self::Header(name) => name.clone(),
            Self::Fixed(_) => return self.tenant_of(&headers),
        };
        if let Some(value) = value.and_then(|v| http::HeaderValue::from_str(v).ok()) {
            headers.insert(name, value);
        }
        self.tenant_of(&headers)
    }
}

impl Tenant {
    /// A tenant given directly (admin API, tests).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }
}

/// `sha256(tenant ‖ key)`: the address of a record in every store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopedKey([u8; 32]);

impl ScopedKey {
    /// Scopes a key to its tenant.
    pub fn new(tenant: &Tenant, key: &IdempotencyKey) -> Self {
        Self(hash_fields(&[&tenant.0, key.as_str().as_bytes()]))
    }

    /// Wraps a digest read back from a store.
    pub fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex; also the "derived key" forwarded upstream and the
    /// only form of a key that ever appears in logs.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl std::fmt::Debug for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopedKey({})", &self.to_hex()[..12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey::parse(k.as_bytes()).unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn two_credentials_never_share_a_key_space() {
        let source = TenantSource::Authorization;
        let alice = source.tenant_of(&headers(&[("authorization", "Bearer alice")]));
        let bob = source.tenant_of(&headers(&[("authorization", "Bearer bob")]));
        assert_ne!(ScopedKey::new(&alice, &key("k1")), ScopedKey::new(&bob, &key("k1")));
        assert_eq!(ScopedKey::new(&alice, &key("k1")), ScopedKey::new(&alice, &key("k1")));
    }

    #[test]
    fn tenant_and_key_boundaries_do_not_collide() {
        let ab = Tenant::from_bytes("ab");
        let a = Tenant::from_bytes("a");
        assert_ne!(ScopedKey::new(&ab, &key("c")), ScopedKey::new(&a, &key("bc")));
    }

    #[test]
    fn header_and_fixed_sources_read_what_they_say() {
        let by_header = TenantSource::Header(http::header::HeaderName::from_static("x-tenant-id"));
        let t1 = by_header.tenant_of(&headers(&[("x-tenant-id", "t1")]));
        assert_eq!(t1, Tenant::from_bytes("t1"));
        assert_eq!(by_header.tenant_of(&HeaderMap::new()), Tenant::from_bytes(""));
        let fixed = TenantSource::Fixed("default".into());
        assert_eq!(fixed.tenant_of(&headers(&[("x-tenant-id", "t1")])), Tenant::from_bytes("default"));
    }
}

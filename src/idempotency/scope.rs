//! Tenants and the scoped address of a key's record.
//!
//! A record is stored under `sha256(tenant ‖ key)`, never under the raw key,
//! so two tenants that pick the same key address two different records and
//! neither can read, replay, block or probe the other's. The tenant comes
//! from a configured [`TenantSource`]; by default it is a hash of the
//! `Authorization` header, so two credentials never share a key space.
//! A tenant header that appears more than once is refused rather than
//! resolved: whichever field were picked, a client could place its own
//! ahead of (or behind) the one its auth proxy sets.

use http::header::{AUTHORIZATION, HeaderName};
use http::{HeaderMap, HeaderValue};

use super::hash::{hash_fields, to_hex};
use super::key::IdempotencyKey;

/// Where the tenant of a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantSource {
    /// A hash of the `Authorization` header (absent header = the anonymous tenant).
    Authorization,
    /// The value of a named header (absent header = the anonymous tenant).
    Header(HeaderName),
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

/// Why a request's tenant could not be derived; the text is shown to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// The header the tenant comes from has more than one field. Picking
    /// one would let a client put its own field ahead of the one its auth
    /// proxy appends and read another tenant's records.
    #[error("the {header} header appears more than once; the tenant must be unambiguous")]
    Repeated {
        /// The repeated header.
        header: HeaderName,
    },
}

impl TenantSource {
    /// Derives the tenant of a request: the anonymous tenant when the
    /// header is absent, an error when it appears more than once.
    pub fn tenant_of(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        let name = match self {
            Self::Authorization => &AUTHORIZATION,
            Self::Header(name) => name,
            Self::Fixed(_) => return Ok(self.tenant_of_value(None)),
        };
        let mut values = headers.get_all(name).iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(TenantError::Repeated { header: name.clone() });
        }
        Ok(self.tenant_of_value(first))
    }

    /// The tenant for the value this source reads (the admin API's
    /// `tenant` parameter): the full `Authorization` value, the tenant
    /// header's value, or nothing for a fixed tenant.
    pub fn tenant_from_value(&self, value: Option<&str>) -> Tenant {
        // A value that is not a valid header value could never arrive in a
        // request; it stands for the absent header, as it always has.
        let value = value.and_then(|v| HeaderValue::from_str(v).ok());
        self.tenant_of_value(value.as_ref())
    }

    /// The tenant for one (or no) field of the source's header.
    fn tenant_of_value(&self, value: Option<&HeaderValue>) -> Tenant {
        match self {
            // Hashed at once: the credential itself is never kept or compared.
            Self::Authorization => {
                Tenant(value.map(|v| hash_fields(&[b"authorization", v.as_bytes()]).to_vec()).unwrap_or_default())
            }
            Self::Header(_) => Tenant(value.map(|v| v.as_bytes().to_vec()).unwrap_or_default()),
            Self::Fixed(tenant) => Tenant(tenant.as_bytes().to_vec()),
        }
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

    /// The first 16 hex digits of [`ScopedKey::to_hex`]: how logs name the
    /// record (hex of 8 bytes, not a 64-digit string cut down).
    pub fn log_id(&self) -> String {
        to_hex(&self.0[..8])
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
    fn the_log_id_is_the_start_of_the_hex() {
        let scoped = ScopedKey::new(&Tenant::from_bytes("t"), &key("k"));
        assert_eq!(scoped.log_id(), scoped.to_hex()[..16]);
    }

    #[test]
    fn two_credentials_never_share_a_key_space() {
        let source = TenantSource::Authorization;
        let alice = source.tenant_of(&headers(&[("authorization", "Bearer alice")])).unwrap();
        let bob = source.tenant_of(&headers(&[("authorization", "Bearer bob")])).unwrap();
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
        let by_header = TenantSource::Header(HeaderName::from_static("x-tenant-id"));
        let t1 = by_header.tenant_of(&headers(&[("x-tenant-id", "t1")]));
        assert_eq!(t1, Ok(Tenant::from_bytes("t1")));
        assert_eq!(by_header.tenant_of(&HeaderMap::new()), Ok(Tenant::from_bytes("")));
        let fixed = TenantSource::Fixed("default".into());
        assert_eq!(fixed.tenant_of(&headers(&[("x-tenant-id", "t1")])), Ok(Tenant::from_bytes("default")));
    }

    #[test]
    fn a_repeated_tenant_header_is_refused_whatever_its_values() {
        let name = HeaderName::from_static("x-tenant-id");
        let by_header = TenantSource::Header(name.clone());
        let spoofed = headers(&[("x-tenant-id", "attacker"), ("x-tenant-id", "victim")]);
        assert_eq!(by_header.tenant_of(&spoofed), Err(TenantError::Repeated { header: name.clone() }));
        let same_twice = headers(&[("x-tenant-id", "t1"), ("x-tenant-id", "t1")]);
        assert_eq!(by_header.tenant_of(&same_twice), Err(TenantError::Repeated { header: name }));
    }

    #[test]
    fn a_repeated_authorization_header_is_refused() {
        let twice = headers(&[("authorization", "Bearer attacker"), ("authorization", "Bearer victim")]);
        assert_eq!(TenantSource::Authorization.tenant_of(&twice), Err(TenantError::Repeated { header: AUTHORIZATION }));
    }

    #[test]
    fn a_fixed_tenant_ignores_repeated_headers() {
        let twice = headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert_eq!(TenantSource::Fixed("default".into()).tenant_of(&twice), Ok(Tenant::from_bytes("default")));
    }

    #[test]
    fn the_refusal_names_the_header() {
        let error = TenantError::Repeated { header: HeaderName::from_static("x-tenant-id") };
        assert_eq!(error.to_string(), "the x-tenant-id header appears more than once; the tenant must be unambiguous");
    }

    #[test]
    fn an_admin_value_addresses_the_tenant_a_request_with_that_header_would() {
        let sources = [
            (TenantSource::Authorization, "authorization"),
            (TenantSource::Header(HeaderName::from_static("x-tenant-id")), "x-tenant-id"),
        ];
        for (source, header) in sources {
            let from_request = source.tenant_of(&headers(&[(header, "Bearer abc")])).unwrap();
            assert_eq!(source.tenant_from_value(Some("Bearer abc")), from_request);
            assert_eq!(source.tenant_from_value(None), source.tenant_of(&HeaderMap::new()).unwrap());
        }
        let fixed = TenantSource::Fixed("default".into());
        assert_eq!(fixed.tenant_from_value(Some("ignored")), Tenant::from_bytes("default"));
    }
}
